"""A cell's output shows what the lesson teaches and nothing else (issue 50). Known noise is silenced where
it comes from: course_setup.quiet_known_noise (every lesson's first cell) for torch's native stderr lines,
transformers' and torch's log lines and torch's TF32 warning; helpers.core.compat for MemTracker's warning.
conftest.py fails a notebook cell under nbval whose output still shows one (`noise_in`), so every lesson's
run in `make test` checks the Python-level noise; native stderr reaches a cell only outside pytest, so a
Jupyter kernel run here checks the profiler's lines. Here too: that the rule finds each line (and nothing
else), that each filter drops what its source really emits, and that the set-up names each host's menu."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings

import pytest
import torch

import course_setup
from conftest import noise_in

USDT = ("USDT:2026-12-04 23:39:40 18036:18036 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
        "USDT:2026-12-04 23:39:41 18036:18036 SyncActivityProfilerHandler.cpp:59] profiler_stop\n")
PLANTED = [USDT,
           "[W1204 23:40:01.1 kineto] gpuGetDeviceCount failed with code 35\n",
           "[W1205 01:20:18.436114961 CPUAllocator.cpp:245] Memory block of unknown size was allocated "
           "before the profiling started, profiler results will not include the deallocation event\n",
           "[transformers] `loss_type=None` was set in the config but it is unrecognized. Using the default "
           "loss: `ForCausalLMLoss`.\n",
           "No CUDA runtime is found, using CUDA_HOME='/usr/local/cuda'\n",
           "/x/mod_tracker.py:201: UserWarning: Module is None. Skipping POST_BW hook.\n",
           "UserWarning: Please use the new API settings to control TF32 behavior\n"]


def _stderr(text: str) -> dict:
    return {"output_type": "stream", "name": "stderr", "text": text}


@pytest.mark.parametrize("planted", PLANTED, ids=range(len(PLANTED)))
def test_each_known_line_is_found(planted):
    assert noise_in([_stderr("what the lesson prints\n" + planted)]) != []


def test_nothing_else_is_found():
    clean = [_stderr("USDT is a word in a sentence\nprofiler_start\n"), {"output_type": "stream",
             "name": "stdout", "text": "checked: the profile less the profiler's events is 1.02x"}]
    assert noise_in(clean) == []


def test_native_lines_are_dropped_even_in_pieces_and_the_rest_kept():
    """The filter in front of fd 2, in a process whose stderr is a pipe, as a kernel's is: C++ writes a line
    in pieces; a noise line is dropped whole, what else native code writes passes, in order."""
    code = ("import os, time, course_setup\ncourse_setup._filter_native_stderr()\n"
            "for piece in (b'US', b'DT:2026-12-04 23:39:40 18036:18036 SyncActivityProfilerHandler.cpp:52] ',"
            " b'profiler_start\\n', b'a real error\\n', b'WARNING:2026 1:1 DeviceUtil.cpp:9] ',"
            " b'gpuGetDeviceCount failed with code 35\\n', b'WARNING: a real warning\\n'):\n"
            "    os.write(2, piece)\n    time.sleep(0.02)\ntime.sleep(0.3)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert done.stderr.decode() == "a real error\nWARNING: a real warning\n", done.stderr


def test_the_log_lines_are_dropped_and_other_records_kept(caplog):
    course_setup.quiet_known_noise()
    with caplog.at_level(logging.WARNING):
        for name, start in course_setup.LOG_NOISE:
            logging.getLogger(name).warning(start + " (the rest of the message)")
            logging.getLogger(name).warning("another warning of the same library")
    assert [r.getMessage() for r in caplog.records] == ["another warning of the same library"] * 2


def test_the_real_sources_emit_them_and_the_filters_drop_them():
    """The controls and the filters on the real sources, in one fresh process (transformers warns once per
    process): torch's profiler prints its USDT lines to the process's stderr in the form NATIVE_NOISE
    matches (a plain process's stderr is not the kernel's, so they stay); transformers makes its loss_type
    record, and after quiet_known_noise no line of it reaches stderr."""
    code = ("import logging, torch, course_setup\n"
            "from torch.profiler import profile\nwith profile():\n    torch.ones(2) + 1\n"
            "made = []\nold = logging.getLogRecordFactory()\n"
            "def factory(*a, **k):\n    r = old(*a, **k); made.append(r.getMessage()); return r\n"
            "logging.setLogRecordFactory(factory)\ncourse_setup.quiet_known_noise()\n"
            "from transformers import GPT2Config, GPT2LMHeadModel\n"
            "cfg = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=8, bos_token_id=0,"
            " eos_token_id=0)\nids = torch.randint(0, 32, (1, 8))\n"
            "GPT2LMHeadModel(cfg)(input_ids=ids, labels=ids)\n"
            "print(sum('loss_type=None' in m for m in made))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1" and "loss_type" not in done.stderr, (done.stdout, done.stderr)
    usdt = [line for line in done.stderr.splitlines() if line.startswith("USDT:")]
    assert all(course_setup.NATIVE_NOISE.fullmatch(line) for line in usdt), usdt
    assert usdt or not torch.__version__.startswith("2.13"), "torch 2.13 prints the USDT lines: none seen"


def test_memtrackers_warning_is_silenced_where_the_course_runs_it(monkeypatch):
    from transformers import BertConfig, BertForSequenceClassification

    from helpers.core import compat
    from helpers.measure.memory import estimate_step_memory

    cfg = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                     vocab_size=100, max_position_embeddings=32)
    model = BertForSequenceClassification(cfg)
    ids = torch.randint(0, 100, (2, 8))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.tensor([0, 1])}

    def warned() -> list[str]:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            estimate_step_memory(model, batch)
        return [str(w.message) for w in seen if "Module is None" in str(w.message)]
    assert warned() == []
    monkeypatch.setattr(compat, "MEM_TRACKER_NOISE", "a pattern nothing matches")  # planted: no filter
    assert warned() != []  # the control: MemTracker does warn on this model


@pytest.mark.parametrize("env, module, menu", [
    ({"COLAB_RELEASE_TAG": "release-colab-20261201"}, None, "Runtime > Restart session"),
    ({}, "google.colab", "Runtime > Restart session"),
    ({"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, None, "Run > Restart & clear cell outputs"),
    ({}, None, "Kernel > Restart Kernel"),
])
def test_the_set_up_names_the_hosts_own_restart_menu(monkeypatch, env, module, menu):
    for name in ("COLAB_RELEASE_TAG", "KAGGLE_KERNEL_RUN_TYPE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    if module:
        monkeypatch.setitem(sys.modules, module, object())
    assert course_setup.restart_menu() == menu


def test_in_a_jupyter_kernel_the_profilers_lines_show_until_the_set_up_runs():
    """The noisy cell run as Jupyter runs it (nbclient; nbval's kernel, under pytest, shows no native stderr):
    torch's profiler first without the filter (its lines show under the cell: the control), then after
    quiet_known_noise, as every lesson's first cell runs it (none show; a line of the lesson's own stays)."""
    import nbformat
    from nbclient import NotebookClient

    from course.nbrun import CourseKernelManager

    profiled = ("import sys, time, torch\nfrom torch.profiler import profile\nwith profile():\n"
                "    torch.ones(2) + 1\nsys.stderr.write('the lesson\\'s own line\\n')\ntime.sleep(1)")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(profiled),
                                         nbformat.v4.new_code_cell("import course_setup\n"
                                                                   "course_setup.quiet_known_noise()"),
                                         nbformat.v4.new_code_cell(profiled)])
    # ipykernel forwards native stderr to the cell, as under Jupyter, unless PYTEST_CURRENT_TEST is set
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    client = NotebookClient(nb, timeout=300, kernel_name="python3", kernel_manager_class=CourseKernelManager)
    client.execute(env=env)
    before = nb.cells[0].outputs + nb.cells[1].outputs  # a late line of the first cell lands in the second
    after = nb.cells[2].outputs
    if not any(course_setup.NATIVE_NOISE.search(o.get("text", "")) for o in before):
        pytest.skip(f"torch {torch.__version__}: its profiler prints no line under the cell here")
    assert noise_in(after) == [] and "the lesson's own line" in "".join(o.get("text", "") for o in after)
