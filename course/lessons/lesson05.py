"""Lesson 05 (`05_compile`): its set-up (the model and batch sizes, fitted beside the copies of the weights
the lesson keeps; whether max-autotune may use Triton GEMM templates here; a fresh Inductor cache folder),
and the lesson's plumbing: cold and warm compile caches, its checks (`check_...`, one line each in the
lesson), what compiling could remove from the eager step, and the summary."""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from matplotlib.figure import Figure
from torch import nn

from course.claims import CLAIMS
from course.lessons import LessonSetup
from course.paths import output_dir
from course.plots import bar_chart
from course.profile import get_profile, pick, small_config
from course.sizing import Size, fit_sizes
from course.verdicts import AtMost, MeasuredTable
from helpers.core.device import get_device, last_level_cache_bytes
from helpers.core.tables import Table
from helpers.core.timing import TOO_BUSY_VERDICT, Busy, CpuLoad, LoadProbe, Timing, busy
from helpers.measure.memory import estimate_training_memory
from helpers.measure.optime import per_call_overhead
from helpers.measure.regimes import (
    EXCESS,
    OpTable,
    amdahl_bound,
    measure_memory_roofs,
    measure_peak_flops,
)
from helpers.measure.roofline import Roofline, load_roofline, measure_roofline
from helpers.model.models import SmallTransformer

__all__ = ["SIZES", "COPIES", "BIG_GPU_SMS", "setup", "cache_files", "ColdCaches",
           "RTOL", "ATOL", "check_matches_eager", "check_graph_breaks", "check_fullgraph_refuses",
           "check_graph_counts", "modes_table", "recompile_table", "step_time_chart", "compile_time_chart",
           "session_roofs", "KEPT", "OPTIMIZER", "compile_shares", "why_compile_paid", "summary_table"]

SIZES = {"BATCH": Size(full=16, smoke=4, floor=2),  # sequences per training step
         "SEQ": Size(full=512, smoke=32, floor=128)}  # tokens per sequence
# copies of the weights the lesson keeps alive: base, eager, compiled, twin, again, a mode's, regional, grads
COPIES = 8
# max-autotune's Triton GEMM templates need a "big" GPU, 68 SMs or more (torch/_inductor/utils.py, is_big_gpu,
# torch 2.13): below that (a T4 has 40, an L4 58) Inductor keeps ATen's matmuls and tunes only the rest
BIG_GPU_SMS = 68


def setup(profile: str | None = None) -> LessonSetup:
    """Lesson 05's sizes and choices on this device; prints what it chose and why (lesson 05). Points
    TORCHINDUCTOR_CACHE_DIR at a fresh folder, so that the lesson's cold compiles are cold."""
    cache_root = str(output_dir("05_compile", fresh=True))  # each cold compile gets a new folder in here
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_root, "other")  # uncounted compiles
    profile = get_profile(profile)
    device = get_device()
    vocab = pick(profile, smoke=2048, full=30522)  # vocabulary: the token head is vocab x d_model
    n_layers = pick(profile, smoke=2, full=8)  # Transformer blocks (regional compilation compiles one)
    with torch.device("meta"):  # the model's shapes, for the estimates: nothing is allocated
        shape = SmallTransformer(small_config(profile, vocab_size=vocab, n_layers=n_layers))
    graphs = 2 if device.type == "cuda" else 0  # reduce-overhead and max-autotune each keep a CUDA graph

    def step_with_copies(s: dict[str, int]) -> int:  # one fp32 step beside the copies and the CUDA graphs
        step = estimate_training_memory(shape, s["BATCH"], s["SEQ"])
        return COPIES * 8 * shape.num_params() + step.peak + graphs * (step.activations + step.temporary)

    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else None
    templates = sms is not None and sms >= BIG_GPU_SMS
    note = ("" if sms is None else f"max-autotune: Triton GEMM templates ({sms} SMs)" if templates
            else f"max-autotune: no Triton GEMM templates ({sms} SMs, Inductor wants {BIG_GPU_SMS})")
    fit = fit_sizes(SIZES, {"a step beside the copies and CUDA graphs": step_with_copies},
                    shrink=["BATCH", "SEQ"], profile=profile, device=device, precision="fp32",
                    notes=[note] if note else [])
    print(fit.line())
    return LessonSetup(
        PROFILE=fit.profile, DEVICE=device, FIT=fit, VOCAB=vocab, N_LAYERS=n_layers, SMS=sms,
        GEMM_TEMPLATES=templates, CACHE_ROOT=cache_root, **fit.sizes,
        LENGTHS=pick(fit.profile, smoke=[16, 24, 32, 40], full=[128, 192, 256, 384]),  # the recompile demo
        MIN_RUN_TIME=pick(fit.profile, smoke=0.5, full=2.0),  # seconds of timed runs per measurement
        TRY_MAX_AUTOTUNE=pick(fit.profile, smoke=False, full=True),  # max-autotune compiles many kernels
        LOAD=LoadProbe(children=True).start())  # what other programs take of the CPUs from here on


# --- compile caches: cold and warm compiles ----------------------------------------------------------------

def cache_files(path: str | Path) -> int:
    """How many files a compile cache folder holds (lesson 05)."""
    return sum(1 for p in Path(path).rglob("*") if p.is_file())


@contextlib.contextmanager
def _cache_env(path: Path) -> Iterator[Path]:
    """TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR pointed at `path` (read when a compile needs them)."""
    with mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": str(path),
                                      "TRITON_CACHE_DIR": str(path / "triton")}):
        yield path


class ColdCaches:
    """The compile cache folders of lesson 05's measurements: a cold compile gets a new, empty folder, with
    Dynamo reset (`torch.compiler.reset`) and `clear` called first: the lesson passes Inductor's private
    helper that empties its in-memory caches, as PyTorch's own `torch._inductor.utils.fresh_cache` does. A
    warm compile reuses the folder a cold one filled (lesson 05)."""

    def __init__(self, root: str | Path, clear: Callable[[], None] | None = None) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise ValueError(f"the cache root {self.root} is not a folder: pass setup()'s CACHE_ROOT")
        self.clear = clear or (lambda: None)  # Inductor's in-memory caches (a private helper of torch)
        self.folders: dict[str, Path] = {}  # measurement -> the folder its cold compile used

    @contextlib.contextmanager
    def cold(self, label: str) -> Iterator[Path]:
        """A compile with nothing to reuse: no compiled frames, no kernels in memory, a new empty folder;
        AssertionError if the folder was used before, was not empty, or the compile wrote nothing there."""
        torch.compiler.reset()  # no compiled frames
        self.clear()  # no kernels in memory
        path = Path(tempfile.mkdtemp(prefix="cold-", dir=self.root))
        assert path not in self.folders.values(), f"{label}: cache folder {path} was used before"
        assert not any(path.iterdir()), f"{label}: cache folder {path} is not empty"
        self.folders[label] = path
        with _cache_env(path):
            yield path
        self.clear()  # what this compile loaded stays with its model, not in Inductor's caches
        assert any(path.iterdir()), f"{label}: the compile wrote nothing into {path}: it did not use it"

    @contextlib.contextmanager
    def warm(self, label: str) -> Iterator[Path]:
        """Compiles inside read the folder the cold compile `label` filled (AssertionError if it is empty)."""
        if label not in self.folders:
            raise ValueError(f"no cold compile called {label!r}; there are {sorted(self.folders)}")
        path = self.folders[label]
        assert cache_files(path) > 0, f"a warm compile needs the cache {label!r} filled; {path} is empty"
        with _cache_env(path):
            yield path

    def check_each_cold(self) -> None:
        """Every cold measurement compiled into a folder of its own (lesson 05)."""
        paths = list(self.folders.values())
        assert len(set(paths)) == len(paths), f"two cold compiles shared a cache folder: {self.folders}"
        print("checked: each cold compile had its own new cache folder: " + ", ".join(
            f"{label} ({cache_files(p)} files)" for label, p in self.folders.items()))


# --- correct before fast -----------------------------------------------------------------------------------

RTOL, ATOL = 1e-3, 1e-5  # compiled vs eager in fp32: the same maths, summed in another order


def check_matches_eager(loss: torch.Tensor, model: nn.Module, ref_loss: torch.Tensor,
                        ref_grads: Mapping[str, torch.Tensor], name: str, *, rtol: float = RTOL,
                        atol: float = ATOL) -> None:
    """A compiled model's loss and every gradient against eager's (torch.testing.assert_close) (lesson 05)."""
    torch.testing.assert_close(loss, ref_loss, rtol=rtol, atol=atol, msg=lambda m: f"{name}, the loss: {m}")
    grads = dict(model.named_parameters())
    missing = sorted(set(ref_grads) - set(grads))
    assert not missing, f"{name}: parameters {missing} are missing"
    for n, g in ref_grads.items():
        assert grads[n].grad is not None, f"{name}: {n} got no gradient"
        torch.testing.assert_close(grads[n].grad, g, rtol=rtol, atol=atol,
                                   msg=lambda m: f"{name}, grad of {n}: {m}")
    print(f"checked: {name} gives eager's loss and its {len(ref_grads)} gradients "
          f"(rtol {rtol:g}, atol {atol:g})")


# --- what compiling fused, and why it paid ------------------------------------------------------------------

def session_roofs(device: torch.device | str, profile: str) -> tuple[Roofline, Roofline]:
    """The roofs lesson 04 places a step's ops on (lesson 05): the highest of lesson 00's saved roofline and
    this session's (a roof measured while other work ran is too low; the compute roof is the best rate of a
    few matmul sizes), and the memory roof by working set, measured within and beyond the last-level cache
    (`helpers.measure.regimes.measure_memory_roofs`)."""
    device = torch.device(device)
    llc = last_level_cache_bytes(device)  # bytes, or None where it cannot be read
    saved = load_roofline()
    size = saved.matmul_size if saved is not None else pick(profile, smoke=512, full=8192)
    copy_mb = max(pick(profile, smoke=64, full=1024), -(-(llc or 0) // 2**20))  # beyond the caches
    now = measure_roofline(device, precisions=["fp32"], matmul_size=512, copy_mb=copy_mb, min_run_time=0.1)
    sizes = (128, 256, 512) + ((size,) if device.type == "cuda" else ())  # a CPU's 8192**3 takes a minute
    peak = max(now.matmul_flops["fp32"], measure_peak_flops(device, sizes=sizes))
    if saved is not None and "fp32" in saved.matmul_flops:  # a roof is the most the machine reached
        flops = {**saved.matmul_flops, "fp32": max(saved.matmul_flops["fp32"], peak)}
        roof = Roofline(saved.device_name, flops, max(saved.bandwidth, now.bandwidth), size, now.copy_bytes)
    else:
        roof = Roofline(now.device_name, {"fp32": peak}, now.bandwidth, now.matmul_size, now.copy_bytes)
    memory = measure_memory_roofs(device, roof, cache_bytes=llc, overhead_s=per_call_overhead(device))
    return roof, memory


# What compiling the model leaves as it was: the library matmul and attention kernels (default mode), and
# the optimizer's update (the lesson compiles the model, not the optimizer). The rest of the eager step, by
# lesson 04's causes, is what fusion can shorten.
KEPT, OPTIMIZER = "matmul and attention", "optimizer step"
AT_ROOF, FIXED, BELOW, BETWEEN = ("other ops at their roofs", "other ops' fixed call cost",
                                  "other ops below their roofs", "between ops")


def compile_shares(eager: OpTable) -> dict[str, float]:
    """The eager step's time as shares of the step: what compiling the model leaves as it was (`KEPT`,
    `OPTIMIZER`), and the rest by lesson 04's causes: the other ops at their roofs, their calls' fixed cost,
    their time below their roofs, and the time between ops (lesson 05)."""
    total = eager.total_s
    if not total > 0:
        raise ValueError("the op table holds no time: profile a step first")
    out = dict.fromkeys([KEPT, OPTIMIZER, AT_ROOF, FIXED, BELOW, BETWEEN], 0.0)
    for r in eager.rows:
        if r.op_class in ("matmul", "attention"):
            out[KEPT] += r.time_s
        elif r.op_class == OPTIMIZER:
            out[OPTIMIZER] += r.time_s
        else:
            parts = r.split(eager.synchronous)
            out[AT_ROOF] += parts["roof"]
            out[FIXED] += parts["overhead"]
            out[BELOW] += parts[EXCESS]
    out[BETWEEN] += eager.outside_s
    return {k: v / total for k, v in out.items()}


def why_compile_paid(eager: OpTable, *, speedup: float, paid: bool, busy: Busy | None = None) -> str:
    """One paragraph: what share of the eager step matmuls took (lesson 04's definition), what compiling
    could remove at most (Amdahl), and whether it paid, or "too busy to judge" when `busy` says so (the
    state of the timings `speedup` comes from, helpers.core.timing.busy) (lesson 05)."""
    shares = compile_shares(eager)
    pc = {k: f"{100 * v:.0f} %" for k, v in shares.items()}
    rest = min(max(1 - shares[KEPT] - shares[OPTIMIZER], 0.0), 1.0)
    bound = amdahl_bound(rest)
    ceiling = "no limit" if math.isinf(bound) else f"at most {bound:.2f}x"
    return (f"matmuls and attention took {pc[KEPT]} of the eager step here, the optimizer's update "
            f"{pc[OPTIMIZER]}; compiling the model leaves both as they were. Fusion can shorten the rest, "
            f"{100 * rest:.0f} %: the other ops at their roofs {pc[AT_ROOF]}, their calls' fixed cost "
            f"{pc[FIXED]}, their time below their roofs {pc[BELOW]}, the time between ops {pc[BETWEEN]} "
            f"({ceiling} if all of it went). "
            + (f"Whether it paid: {busy}." if busy is not None and busy.too_busy else
               f"It {'paid' if paid else 'did not pay'}: {speedup:.2f}x."))


# --- graph breaks and recompiles ---------------------------------------------------------------------------

def check_graph_breaks(before: Any, after: Any) -> None:
    """`torch._dynamo.explain` of a function with a graph break (`before`) and of its rewrite (`after`): the
    first breaks at least once, the second is one graph with no break (lesson 05)."""
    assert len(before.break_reasons) >= 1, "the function with .item() and print showed no graph break"
    left = [r.reason.splitlines()[0] for r in after.break_reasons]
    assert not left, f"the rewrite still breaks the graph: {left}"
    assert after.graph_count == 1, f"the rewrite is {after.graph_count} graphs, not one"
    print(f"checked: {len(before.break_reasons)} break(s) before, one graph and no break after")


def check_fullgraph_refuses(run: Callable[[], Any], error: type[BaseException]) -> str:
    """`run()` compiles with fullgraph=True something that breaks the graph: it must raise `error`, Dynamo's
    `torch._dynamo.exc.Unsupported`; returns the first line of the reason (lesson 05)."""
    try:
        run()
    except error as err:
        reason = str(err).splitlines()[0]
        print(f"checked: fullgraph=True refused it: {reason}")
        return reason
    raise AssertionError("fullgraph=True should have refused the graph break, and the call ran")


def check_graph_counts(counts: Mapping[str, Sequence[int]], lengths: Sequence[int]) -> None:
    """Graphs compiled per call as the length changes: dynamic=False ("static") one per length, mark_dynamic
    one in all (lesson 05)."""
    static, marked = sum(counts["static"]), sum(counts["mark_dynamic"])
    assert static == len(lengths), \
        f"dynamic=False compiled {static} graphs for {len(lengths)} lengths: one per length expected"
    assert marked == 1, f"mark_dynamic compiled {marked} graphs for {len(lengths)} lengths: one expected"
    print(f"checked: dynamic=False compiled one graph per length ({static}), mark_dynamic one in all")


# --- tables ---------------------------------------------------------------------------------------------

def modes_table(modes: Mapping[str, tuple[float, Timing]], eager: Timing) -> Table:
    """Each compile mode's compile time, step time and speed-up over eager (lesson 05)."""
    t = Table(["mode", "compile s", "step ms", "speed-up vs eager"], title="compile modes")
    for mode, (compile_s, timing) in modes.items():
        t.add(mode, compile_s, timing.median_s * 1e3, eager.median_s / timing.median_s)
    return t


def recompile_table(counts: Mapping[str, Sequence[int]], lengths: Sequence[int]) -> Table:
    """Graphs compiled per call as the sequence length changes, per setting (lesson 05)."""
    t = Table(["setting", *[f"T={n}" for n in lengths], "graphs in all"],
              title="graphs compiled per call, by sequence length")
    for setting, c in counts.items():
        t.add({"static": "dynamic=False"}.get(setting, setting), *c, sum(c))
    return t


def step_time_chart(side_by_side: Mapping[str, Timing], device: torch.device) -> Figure:
    """The side-by-side step times, each against eager's (lesson 05)."""
    return bar_chart({name: t.median_ms for name, t in side_by_side.items()}, baseline="eager",
                     title=f"Training step on {device}, timed side by side",
                     ylabel="median time per step [ms]", xlabel="variant")


def compile_time_chart(measured: Mapping[str, Any], device: torch.device) -> Figure:
    """The compile times: whole model cold and warm, per block cold (lesson 05)."""
    return bar_chart({"whole model, cold": measured["cold compile s"],
                      "whole model, warm cache": measured["warm compile s"],
                      "per block, cold": measured["regional compile s"]},
                     title=f"Compile time on {device}", ylabel="first call less an eager step's pass [s]",
                     xlabel="how it was compiled", annotate="{:.1f}")


def summary_table(measured: Mapping[str, Any], side_by_side: Mapping[str, Timing], *, device: torch.device,
                  profile: str, n_layers: int, lengths: Sequence[int],
                  load: CpuLoad | None = None, session: LoadProbe | None = None) -> MeasuredTable:
    """This run's numbers next to claim C4, its verdict by the claim's rule within the side-by-side timings'
    noise, or "too busy to judge" by the course's rule (`helpers.core.timing.busy`; `load`: what other
    programs
    took of the CPUs while they ran); prints the verdict in one line (lesson 05, "What we measured")."""
    speedup = measured["eager step s"] / measured["compiled step s"]
    # the noise of the side-by-side timings: the larger relative IQR of the two arms
    noise = max(side_by_side[a].iqr_s / side_by_side[a].median_s for a in ("eager", "compiled"))
    state = busy(side_by_side["eager"], side_by_side["compiled"], load=load)
    if not state.too_busy and session is not None:  # the compile times and section 3's: the whole run's load
        state = busy(load=session.read())
    summary = MeasuredTable(f"Lesson 05 on {device} ({profile} profile)")
    summary.add("eager step, ms", measured["eager step s"] * 1e3)
    summary.add("compiled step, ms", measured["compiled step s"] * 1e3)
    verdict = summary.add("speed-up of the compiled step (eager / compiled)", speedup,
                          CLAIMS["compile-speedup"],
                          noise=noise, busy=state,
                          why="SLOWER than eager" if speedup < 1 and not state.too_busy else "")
    summary.add("speed-up with per-block compilation", measured["eager step s"] / measured["regional step s"])
    summary.add("eager forward + backward (subtracted from each first call), ms",
                measured["eager forward+backward s"] * 1e3)
    summary.add("compile time, whole model, cold cache, s", measured["cold compile s"])
    summary.add("compile time, whole model, warm cache, s", measured["warm compile s"])
    summary.add("compile time, per block / whole model, cold caches",
                measured["regional compile s"] / measured["cold compile s"], f"< 1 with {n_layers} blocks",
                rule=AtMost(1.0), busy=state)
    summary.add("steps until compiling pays off", TOO_BUSY_VERDICT if state.too_busy
                else measured["break-even steps"] or "never (no step saved)")
    summary.add("graph breaks: with .item() + print / without",
                f"{measured['graph breaks before']} / {measured['graph breaks after']}")
    summary.add(f"graphs for {len(lengths)} lengths: default / static / mark_dynamic",
                " / ".join(str(measured[f"graphs {k}"]) for k in ("default", "static", "mark_dynamic")))
    print(f"claim '10–30 % faster': {verdict} here ({(speedup - 1) * 100:+.0f} % on {device}, {profile} "
          f"profile; the arms' timings spread by up to {noise:.0%})")
    return summary
