"""course/scripts/finetune_bert.py: a run stopped at a checkpoint resumes to exactly where an unbroken run
goes; its switches are one nested RunSpec, each with its flag."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from helpers.train.runspec import RunSpec

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "course" / "scripts" / "finetune_bert.py"


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
    schedule = dict(lr=5e-5, lr_schedule="linear", warmup_frac=0.1)  # whatever the defaults are
    whole = ft.finetune(ft.FinetuneConfig(**TINY, **schedule, max_steps=3), log=quiet)
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
    cfg = ft.FinetuneConfig(**TINY, **schedule, max_steps=3, checkpoint_dir=ck, checkpoint_every=1)
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

    cfg = ft.FinetuneConfig(batch_size=2, spec=RunSpec(padding="bucketed"), max_length=16)
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
        ft.FinetuneConfig(spec=RunSpec(padding="dynamic-ish"))
    with pytest.raises(ValueError, match="spec must be a helpers.train.runspec.RunSpec"):
        ft.FinetuneConfig(spec="bucketed")
    with pytest.raises(ValueError, match="512"):
        ft.FinetuneConfig(max_length=1024)
    with pytest.raises(SystemExit):  # the command line: usage and RunSpec's reason, no traceback
        ft.config_from_args(["--padding", "dynamic-ish"])


# A value other than the default for each RunSpec switch that is not a bool (bools are flipped).
OTHER = {"precision": "bf16", "attn": "eager", "padding": "bucketed", "init_scale": "1024"}


def _flag_for(field: dataclasses.Field, default: object) -> list[str]:
    """The command-line words that set `field` to something other than `default`."""
    flag = "--" + field.name.replace("_", "-")
    if isinstance(default, bool):
        return [flag if not default else "--no-" + flag[2:]]
    choices = typing.get_args(typing.get_type_hints(RunSpec)[field.name])
    other = OTHER.get(field.name) or next((c for c in choices if isinstance(c, str) and c != default), None)
    assert other is not None and other != default, f"add a non-default value of RunSpec.{field.name} to OTHER"
    return [flag, other]


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(RunSpec)])
def test_every_runspec_switch_has_a_flag_that_lands_in_the_nested_spec(name):
    field = next(f for f in dataclasses.fields(RunSpec) if f.name == name)
    default_cfg, _ = ft.config_from_args([])
    assert default_cfg == ft.FinetuneConfig()  # no flag: the script's defaults
    cfg, _ = ft.config_from_args(_flag_for(field, getattr(default_cfg.spec, name)))
    assert getattr(cfg.spec, name) != getattr(default_cfg.spec, name)
    # that switch alone changed: the rest of the spec and every other setting keep their defaults
    assert cfg.spec.replace(**{name: getattr(default_cfg.spec, name)}) == default_cfg.spec
    assert dataclasses.replace(cfg, spec=default_cfg.spec) == default_cfg


def test_the_spec_is_nested_not_copied():
    own = {f.name for f in dataclasses.fields(ft.FinetuneConfig)}
    assert not own & {f.name for f in dataclasses.fields(RunSpec)}, "RunSpec fields copied into the config"
    cfg, _ = ft.config_from_args(["--fp8", "--padding", "packed", "--batch-size", "4"])
    assert cfg.spec == ft.FinetuneConfig().spec.replace(fp8=True, padding="packed") and cfg.batch_size == 4
    assert dataclasses.asdict(cfg)["spec"]["fp8"] is True  # the result file records the spec as one block


def test_command_line_help_lists_the_notebook_names():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    for flag in ("--max-length", "--batch-size", "--precision", "--fp8", "--compile", "--fused-adamw",
                 "--padding", "--checkpoint-dir", "--results-json"):
        assert flag in out.stdout


def test_torchrun_launches_it_as_ddp_on_cpu(tmp_path):
    from helpers.train.distributed import launch

    out = tmp_path / "result.json"
    args = ["--max-examples", "60", "--max-steps", "2", "--batch-size", "2", "--max-length", "32",
            "--device", "cpu", "--results-json", str(out)]
    result = launch(SCRIPT, args, nproc_per_node=2, timeout_s=600, echo=False, env={"HF_HUB_OFFLINE": "1"})
    data = json.loads(out.read_text())
    assert data["world_size"] == 2 and data["steps"] == 2
    assert any("RESULT " in line for line in result.rank_lines(0))
    assert not any("RESULT " in line for line in result.rank_lines(1))  # rank 0 alone reports
