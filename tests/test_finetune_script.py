"""scripts/finetune_bert.py: a run stopped at a checkpoint resumes to exactly where an unbroken run goes."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "finetune_bert.py"


def _script():
    spec = importlib.util.spec_from_file_location("finetune_bert", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["finetune_bert"] = mod
    spec.loader.exec_module(mod)
    return mod


ft = _script()
TINY = dict(max_examples=60, batch_size=2, max_length=32, eval_batch_size=16, device="cpu")


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR"):  # a plain process, even inside a torchrun job
        monkeypatch.delenv(name, raising=False)


class Killed(Exception):
    pass


def test_a_killed_run_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    quiet = lambda *a, **k: None  # noqa: E731
    whole = ft.finetune(ft.FinetuneConfig(**TINY, max_steps=3), log=quiet)
    # linear decay to 0 (10 % warm-up of 3 steps rounds to none)
    assert whole["lrs"] == pytest.approx([5e-5, 5e-5 * 2 / 3, 5e-5 / 3])
    ck = str(tmp_path / "ck")
    make_batches = ft.make_batches

    class DiesAtStep2(list):  # the process is killed while it fetches the batch of step 2
        def __getitem__(self, i):
            if i == 2:
                raise Killed
            return super().__getitem__(i)

    monkeypatch.setattr(ft, "make_batches", lambda *a, **k: DiesAtStep2(make_batches(*a, **k)))
    cfg = ft.FinetuneConfig(**TINY, max_steps=3, checkpoint_dir=ck, checkpoint_every=1)
    with pytest.raises(Killed):
        ft.finetune(cfg, log=quiet)
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step_000001.pt", "step_000002.pt"]
    rest = ft.finetune(cfg, log=quiet)
    assert rest["resumed_from"] == 2 and rest["steps"] == 3 and rest["lrs"] == whole["lrs"]
    # the same batches in the same order from the same weights and schedule: it repeats the unbroken run
    assert rest["losses"] == pytest.approx(whole["losses"], rel=1e-5, abs=1e-6)
    assert 0.0 <= rest["test_accuracy"] <= 1.0


def test_bucketed_batches_cover_the_data_once_per_epoch_and_shard_across_processes():
    class Data:
        lengths = [5, 9, 3, 7, 2, 8, 4, 6, 1, 10]
        labels = [0] * 10
        def __len__(self):
            return 10
        def __getitem__(self, i):
            return {"input_ids": [1] * self.lengths[i], "labels": i}

    cfg = ft.FinetuneConfig(batch_size=2, padding="bucketed", max_length=16)
    alone = ft.make_batches(Data(), cfg)
    seen = sorted(int(x) for b in alone for x in b["labels"])
    assert seen == list(range(10))
    assert all(b["input_ids"].shape[1] == int(b["attention_mask"].sum(1).max()) for b in alone)
    ranks = [ft.make_batches(Data(), cfg, rank=r, world_size=2) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 2  # 5 batches: each process takes 2, the odd one is dropped
    both = [int(x) for r in ranks for b in r for x in b["labels"]]
    assert len(both) == len(set(both)) == 8


def test_bad_switches_are_rejected():
    with pytest.raises(ValueError, match="padding"):
        ft.FinetuneConfig(padding="dynamic-ish")
    with pytest.raises(ValueError, match="512"):
        ft.FinetuneConfig(max_length=1024)


def test_command_line_help_lists_the_notebook_names():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    for flag in ("--max-length", "--batch-size", "--precision", "--compile", "--fused-adamw", "--padding",
                 "--checkpoint-dir", "--results-json"):
        assert flag in out.stdout


def test_torchrun_launches_it_as_ddp_on_cpu(tmp_path):
    from helpers.distributed import launch

    out = tmp_path / "result.json"
    args = ["--max-examples", "60", "--max-steps", "2", "--batch-size", "2", "--max-length", "32",
            "--device", "cpu", "--results-json", str(out)]
    result = launch(SCRIPT, args, nproc_per_node=2, timeout_s=600, echo=False, env={"HF_HUB_OFFLINE": "1"})
    data = json.loads(out.read_text())
    assert data["world_size"] == 2 and data["steps"] == 2
    assert any("RESULT " in line for line in result.rank_lines(0))
    assert not any("RESULT " in line for line in result.rank_lines(1))  # rank 0 alone reports
