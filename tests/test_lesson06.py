"""Lesson 06's code (course.lessons.lesson06), its GPU-only parts run on a CPU (issues 18, 24, 38).
Section 3's copies run with the device a CPU, `pin_memory` an identity and the CUDA calls no-ops, so an error
in them fails here, not on the first GPU; the GPU-only cell binds no name a later cell uses; every way of
batching is pinned alike on a GPU; pinning is timed where it happens (with 0 workers the DataLoader pins
inside next(), on the loop's thread); no loop pins by hand batch after batch; each check fails on a planted
error."""

from __future__ import annotations

import ast
import inspect
import json
import re
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from course.lessons import lesson06
from helpers.core.timing import Timing
from helpers.data.text import TokenizedDataset
from helpers.train.runspec import PADDINGS

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "06_input_pipeline.ipynb"
STEP3_COPIES = "d0b79338"  # the cell id of section 3's timed copies (GPU only)


def _python(source: str) -> str:
    """A cell's source with its IPython magics (`%pip ...`) made `pass`, so that ast can read it."""
    return "\n".join(re.sub(r"^(\s*)[%!].*", r"\1pass", line) for line in source.split("\n"))


def _code_cells() -> list[tuple[str, str]]:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    return [(c.get("id", ""), _python("".join(c["source"]))) for c in cells if c["cell_type"] == "code"]


def _setup(device: str = "cpu", **extra) -> SimpleNamespace:
    return SimpleNamespace(DEVICE=torch.device(device), BATCH=2, SYNC_STEPS=3, PROFILE_STEPS=2, ROUNDS=1,
                           LOADER_STEPS=2, WORKERS=[0, 1, 2], CORES=2, PROFILE="smoke", COPY_MB=1, **extra)


# --- section 3 on a CPU: the GPU branch ---------------------------------------------------------------------

def _fake_timing(fn, name="", **kwargs) -> Timing:
    fn()  # run once: an error in the arm shows here
    return Timing(name=name, median_s=1e-3, iqr_s=0.0, runs=1, calls_per_run=1, times_s=(1e-3,))


def test_section_3_copies_run_on_a_cpu_with_pinning_faked(monkeypatch) -> None:
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)
    monkeypatch.setattr(lesson06, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(lesson06, "benchmark", _fake_timing)
    numbers, table = lesson06.time_copies(1, torch.device("cpu"))
    assert numbers["pinned GB/s"] > 0 and numbers["pageable blocked ms"] >= 0
    assert len(table.rows) == 3
    batch = {"input_ids": torch.ones(2, 3, dtype=torch.long)}
    assert torch.equal(lesson06.pin_batch(batch, gpu=True)["input_ids"], batch["input_ids"])
    assert lesson06.pin_batch(batch, gpu=False)["input_ids"] is batch["input_ids"]  # a CPU pins nothing


def _rebinds(gpu_cell: str, later: list[str]) -> set[str]:
    """Names the GPU-only cell binds that a later cell loads (the cell is skipped on a CPU: such a name
    would be defined on a GPU only, or defined differently there)."""
    bound = {t.id for n in ast.walk(ast.parse(gpu_cell)) if isinstance(n, (ast.Assign, ast.AugAssign))
             for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    bound |= {n.name for n in ast.walk(ast.parse(gpu_cell)) if isinstance(n, ast.FunctionDef)}
    loaded = {n.id for src in later for n in ast.walk(ast.parse(src))
              if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return bound & loaded


def test_the_gpu_only_cell_binds_no_name_a_later_cell_uses() -> None:
    cells = _code_cells()
    at = next(i for i, (cid, _) in enumerate(cells) if cid == STEP3_COPIES)
    later = [src for _, src in cells[at + 1:]]
    assert _rebinds(cells[at][1], later) == set()
    planted = cells[at][1] + "\n    collate = None\n"  # planted: the GPU branch rebinds what section 4 uses
    assert _rebinds(planted, later) == {"collate"}


# --- no loop pins batch after batch -------------------------------------------------------------------------

def _per_step_pinning(sources: dict[str, str]) -> list[str]:
    pins = {"pin_batch", "pin_memory"}
    found = []
    for where, source in sources.items():
        for loop in (n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.For, ast.While))):
            for call in (n for n in ast.walk(loop) if isinstance(n, ast.Call)):
                func = call.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in pins:
                    found.append(f"{where}, line {call.lineno}: {ast.unparse(call)}")
    return found


def test_batches_are_pinned_by_the_dataloader_not_step_by_step_on_the_main_thread() -> None:
    sources = {f"cell {cid}": src for cid, src in _code_cells()}
    sources["course/lessons/lesson06.py"] = inspect.getsource(lesson06)
    per_step = _per_step_pinning(sources)
    assert not per_step, ("pinning a batch by hand each step, then copying, is usually slower than a "
                          "plain .to(device): pin batches once (section 4), or let "
                          "DataLoader(pin_memory=True) pin them (in its pin thread with workers, in next() "
                          "without; section 2 times both): " + "; ".join(per_step))
    planted = {"a loop": "for b in batches:\n    train_step(lesson06.pin_batch(b, GPU))"}
    assert len(_per_step_pinning(planted)) == 1


# --- every way of batching pinned alike ---------------------------------------------------------------------

def _unpinned(loader_for, gpu: bool) -> list[str]:
    ids = [[101, 5, 6, 102], [101, 7, 102], [101, 8, 9, 10, 102], [101, 11, 102]]
    ds = TokenizedDataset(ids, [0, 1, 0, 1])
    S = _setup("cuda" if gpu else "cpu")
    return [p for p in PADDINGS if not loader_for(ds, p, S, pad_id=0, max_len=16).pin_memory]


def _planted_loader_for(old: str, new: str):
    """lesson06.loader_for with `old` replaced by `new` in its source (a planted bug)."""
    source = textwrap.dedent(inspect.getsource(lesson06.loader_for))
    assert old in source
    namespace = dict(vars(lesson06))
    exec(compile(source.replace(old, new), "<planted loader_for>", "exec"), namespace)
    return namespace["loader_for"]


def test_every_way_of_batching_is_pinned_alike_on_a_gpu() -> None:
    assert _unpinned(lesson06.loader_for, gpu=True) == []  # the same kind of copy to the device in every arm
    assert set(_unpinned(lesson06.loader_for, gpu=False)) == set(PADDINGS)  # a CPU has nothing to pin
    planted = _planted_loader_for(', pin_memory=S.DEVICE.type == "cuda")', ")")  # the packed arm unpinned
    assert _unpinned(planted, gpu=True) == ["packed"]


def test_the_worker_sweep_times_pinning_on_the_loop_thread_and_in_the_pin_thread() -> None:
    gpu = lesson06.worker_settings([0, 1, 2], gpu=True)
    cpu = lesson06.worker_settings([0, 1, 2], gpu=False)
    assert (0, True) in gpu and (2, True) in gpu  # 0 workers: pinned inside next(); 2: by the pin thread
    assert all(not pin for _, pin in cpu)  # a CPU has nothing to pin
    with pytest.raises(ValueError, match="must start with 0"):  # planted: no baseline
        lesson06.worker_settings([1, 2], gpu=False)


def test_fastest_rounds_interleaves_and_keeps_the_fastest() -> None:
    calls = []
    times = iter([3.0, 5.0, 1.0, 4.0])

    def fn(w, pin):
        calls.append(w)
        return (next(times), 0.0)

    assert lesson06.fastest_rounds(fn, [(0, False), (1, False)], rounds=2) == {(0, False): (1.0, 0.0),
                                                                                (1, False): (4.0, 0.0)}
    assert calls == [0, 1, 0, 1]  # interleaved, not one setting after the other


# --- section 4: the hidden-sync checks ----------------------------------------------------------------------

class _Prof:
    """Stands in for a torch.profiler profile: key_averages() -> events with key and count."""

    def __init__(self, scalar_reads: int, syncs: int = 0) -> None:
        self.events = [SimpleNamespace(key="aten::_local_scalar_dense", count=scalar_reads),
                       SimpleNamespace(key="cudaStreamSynchronize", count=syncs)]

    def key_averages(self):
        return self.events


def _opt(device: str = "cpu") -> SimpleNamespace:
    return SimpleNamespace(state={0: {"step": torch.tensor(1.0, device=device)}})


def _results(losses_b=(1.0, 0.9, 0.8), reads=(9, 6), syncs=(0, 0), step_device="cpu") -> dict:
    return {"loss.item() every step": ([1.0, 0.9, 0.8], _opt(step_device), _Prof(reads[0], syncs[0]), 0.2),
            "losses kept on the device": (list(losses_b), _opt(), _Prof(reads[1], syncs[1]), 0.1)}


def test_the_sync_checks_pass_and_fail_on_planted_errors(capsys) -> None:
    S, batches = _setup(), [{"input_ids": torch.ones(2, 3)}]
    found = lesson06.check_syncs(_results(), batches, S)
    assert found["items per step"] == 1 and found["sync time ratio"] == 2
    assert "checked: same losses" in capsys.readouterr().out
    assert len(lesson06.syncs_table(found, S).rows) == 2
    with pytest.raises(AssertionError, match="losses differ"):  # planted: the loops ran different steps
        lesson06.check_syncs(_results(losses_b=(1.0, 0.9, 0.7)), batches, S)
    with pytest.raises(AssertionError, match="not one hidden sync per step removed"):  # planted: .item() kept
        lesson06.check_syncs(_results(reads=(9, 9)), batches, S)
    with pytest.raises(AssertionError, match="step counters live on"):  # planted: counters on the device
        lesson06.check_syncs(_results(step_device="meta"), batches, S)


def test_on_a_gpu_the_sync_checks_read_the_device_syncs_and_the_pinning(monkeypatch) -> None:
    S = _setup("cuda")
    pinned = [{"input_ids": torch.ones(2, 3)}]
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: True)
    assert lesson06.check_syncs(_results(syncs=(4, 1)), pinned, S)["syncs"] == (4, 1)
    with pytest.raises(AssertionError, match="device syncs: 4 with .item\\(\\), 3 without"):  # planted
        lesson06.check_syncs(_results(syncs=(4, 3)), pinned, S)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: False)
    with pytest.raises(AssertionError, match="not pinned"):  # planted: pageable batches on a GPU
        lesson06.check_syncs(_results(syncs=(4, 1)), pinned, S)


# --- section 5: padding -------------------------------------------------------------------------------------

def test_the_padding_order_check_fails_on_planted_shares() -> None:
    ok = {"x padding fixed": 0.6, "x padding dynamic": 0.5, "x padding bucketed": 0.1,
          "x padding packed": 0.05}
    lesson06.check_padding_order(ok, "x")
    with pytest.raises(AssertionError, match="bucketing added padding"):
        lesson06.check_padding_order(dict(ok, **{"x padding bucketed": 0.55}), "x")
    lesson06.check_padding_order(dict(ok, **{"x padding bucketed": 0.55}), "x", bucketing=False)
    with pytest.raises(AssertionError, match="packing must leave less padding"):
        lesson06.check_padding_order(dict(ok, **{"x padding packed": 0.5}), "x")
    with pytest.raises(AssertionError, match="more padding than fixed"):
        lesson06.check_padding_order(dict(ok, **{"x padding fixed": 0.4}), "x")


@pytest.fixture(scope="module")
def tiny_model():
    from course.profile import small_config
    from helpers.model.models import SmallTransformer

    torch.manual_seed(0)
    return SmallTransformer(small_config("smoke", n_classes=2, max_len=32)).eval()


def _articles(n: int = 8) -> TokenizedDataset:
    g = torch.Generator().manual_seed(0)
    lengths = [3, 4, 5, 6, 20, 24, 28, 30][:n]
    ids = [[101] + torch.randint(1000, 2000, (k - 2,), generator=g).tolist() + [102] for k in lengths]
    return TokenizedDataset(ids, [i % 2 for i in range(n)])


def test_padding_keeps_the_loss_and_a_leaking_pack_fails(tiny_model, monkeypatch) -> None:
    import helpers.model.packed_model as packed_model

    S = _setup()
    S.BATCH = 4  # a SimpleNamespace here, not a lesson's frozen set-up
    lesson06.check_padding_keeps_the_loss(tiny_model, _articles(), 0, S, max_len=32)
    # planted: a mask that leaks between the documents of a row (every real token of the row visible)
    monkeypatch.setattr(packed_model, "document_mask",
                        lambda doc: (doc[:, None, None, :] >= 0).expand(-1, 1, doc.shape[1], -1))
    with pytest.raises(AssertionError, match="packed and padded articles give different losses"):
        lesson06.check_padding_keeps_the_loss(tiny_model, _articles(), 0, S, max_len=32)


# --- section 6: the trace -----------------------------------------------------------------------------------

def test_the_trace_check_fails_without_our_labels(tmp_path) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps({"traceEvents": [{"name": "forward"}, {"name": "aten::mm"}]}))
    bad.write_text(json.dumps({"traceEvents": [{"name": "aten::mm"}]}))
    lesson06.check_trace(good)
    with pytest.raises(AssertionError, match=r"lacks the labels \['forward'\]"):
        lesson06.check_trace(bad)


def test_the_short_texts_keep_the_headline_and_first_sentence() -> None:
    assert lesson06.headline_and_first_sentence("Title\n\nOne. Two. Three.") == "Title. One."


# --- the summary -------------------------------------------------------------------------------------------

class _Probe:
    """A LoadProbe that read `others` over the lesson's run."""

    def __init__(self, others: float) -> None:
        self.others = others

    def read(self):
        from helpers.core.timing import CpuLoad

        return CpuLoad(self.others, 60.0, 2)


def test_the_summary_judges_no_timing_when_other_programs_took_the_cpus(capsys) -> None:
    measured = {"workers": {(0, False): 1.0, (1, False): 0.8, (2, False): 0.7}, "batch build s": 0.01,
                "wait share 0": 0.3, "items per step": 1, "sync time ratio": 1.1,
                "articles round spread": 0.05, "articles tokens bucketed": 500, "articles tokens fixed": 1000}
    for p in PADDINGS:
        measured.update({f"articles padding {p}": 0.4, f"articles epoch {p} s": {"fixed": 2.0}.get(p, 1.0)})
    for name in ("articles", "short"):
        measured.update({f"{name} real tokens/s packed": 200.0, f"{name} real tokens/s dynamic": 100.0,
                         f"{name} padding dynamic": 0.4, f"{name} round spread": 0.05})
    timed = ["step time, 0 workers / the fastest with workers",
             "articles: real tokens/s packed / dynamic (padding 40%, bound 1.67x)"]
    for others, want in ((0.0, "holds"), (0.7, "too busy to judge")):
        summary = lesson06.summary_table(measured, _setup(LOAD=_Probe(others)))
        # planted: other programs took 70 % of the CPUs over the run (issue 39: verdicts printed under load)
        assert [summary.verdicts[k] for k in timed] == [want, want], (others, summary.verdicts)
        out = capsys.readouterr().out
        assert ("2.00x faster" in out) == (want == "holds") and ("too busy" in out) == (want != "holds"), out
