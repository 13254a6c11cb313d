"""What a training run measures as it goes and reports (lessons 02-08): `Meter`, `TrainResult`, and the
course's one MFU: real tokens/s × FLOPs per token / peak. Guide: docs/library/train.md#helperstrainmeter"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from helpers.core.compat import unwrap_model
from helpers.measure.flops import mfu, model_flops_per_token
from helpers.measure.memory import tensor_bytes, track_peak_memory
from helpers.measure.roofline import mfu_peak, saved_roofline
from helpers.train.distributed import print0

__all__ = ["TrainResult", "Meter", "useful_flops", "flops_unreadable", "run_peak"]

Widths = list[tuple[int | torch.Tensor, int]]  # (real tokens, padded width T) per micro-batch


@dataclass
class TrainResult:
    """What a run measured (lessons 02-08); every number left None says why in `notes` (field -> reason).
    Throughput leaves out the warm-up step and, on a CPU, the profiled one."""

    losses: list[float]  # mean loss of each optimizer step, from step 0 (resumed runs keep the history)
    step_times_s: list[float]  # time of each step this call: CUDA events on a GPU, wall clock on a CPU
    tokens_per_s: float | None  # real tokens per second, steps after the first; None: not measured
    samples_per_s: float | None
    mfu: float | None  # None when no peak FLOP/s is known for the device, or nothing was timed
    # None when not tracked; on a CPU the profiler's reading of the call's second step (its first, in a run of
    # one step: then without the optimizer state that step made)
    peak_memory_bytes: int | None
    steps_done: int  # optimizer steps done in total, resumed ones included
    resumed_from: int | None  # the step the run resumed from, None for a fresh start
    skipped_steps: list[int] = field(default_factory=list)  # fp16: steps the GradScaler skipped
    scales: list[float] = field(default_factory=list)  # fp16: the loss scale used at each step
    lrs: list[float] = field(default_factory=list)  # learning rate of each step (first group), from step 0
    flops_per_token: float | None = None  # model FLOPs per real token (token-weighted over batch widths)
    peak_flops: float | None = None  # the peak MFU divides by, FLOP/s
    peak_source: str = ""  # where that peak comes from
    memory_method: str = ""
    notes: dict[str, str] = field(default_factory=dict)  # why each None above is None

    @property
    def final_loss(self) -> float:
        return self.losses[-1] if self.losses else math.nan


class Meter:
    """A run's measurements as they come, with no device sync between log points (lessons 02, 06).
    `history`: "losses", "skipped_steps", "scales", "lrs", "resumed_from"; `scaler`: fp16's, or None."""

    def __init__(self, model: nn.Module, device: torch.device, scaler: torch.amp.GradScaler | None,
                 history: dict[str, Any], track_memory: bool) -> None:
        self.model, self.device, self.scaler, self.h = model, device, scaler, history
        self.cuda, self.track_memory = device.type == "cuda", track_memory
        self.step_times: list[float] = []
        self.events: list[tuple[Any, Any]] = []  # CUDA: (start, end) events of the steps not yet read back
        self.pending: list[tuple[int, Any]] = []  # (step, StepOutput) whose loss is not read back yet
        self.timed: Widths = []  # (real tokens, width) of the timed batches
        self.all: Widths = []  # ... and of every batch
        self.samples, self.peak_memory, self.memory_method, self.t0 = 0, None, "", 0.0
        self.timed_steps: list[bool] = []  # per step of this call: counted in the throughput?
        if track_memory and self.cuda:
            torch.cuda.reset_peak_memory_stats(device)

    def begin(self, lr: float) -> None:
        """A step starts: its learning rate, and the clock (fetching its batches counts)."""
        self.h["lrs"].append(lr)  # a Python float: no sync
        if self.cuda:
            self.events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
            self.events[-1][0].record()
        self.t0 = time.perf_counter()

    def profiles(self, chosen: bool) -> bool:
        """Whether the chosen step runs under the profiler: a CPU with memory tracked (a GPU's allocator keeps
        its own statistics)."""
        return chosen and self.track_memory and self.device.type == "cpu"

    def memory(self, profiled: bool, optimizer: torch.optim.Optimizer) -> contextlib.AbstractContextManager:
        """On a CPU, the profiler's peak memory of a `profiled` step, plus the model and optimizer; else
        nothing."""
        if not profiled:
            return contextlib.nullcontext()
        # an FSDP2 rank's DTensors count their local shards (tensor_bytes)
        return track_peak_memory(self.device, baseline_bytes=tensor_bytes(self.model, optimizer))

    def end(self, step: int, out: Any, timed: bool, report: Any) -> None:
        """A step is done: stop its clock, keep its StepOutput until the next read-back; `timed`: counted in
        the throughput."""
        if self.cuda:
            self.events[-1][1].record()
        else:
            self.step_times.append(time.perf_counter() - self.t0)  # a CPU computes synchronously
        self.timed_steps.append(timed)
        if report is not None:
            self.peak_memory, self.memory_method = report.peak_bytes, report.method
        self.pending.append((step, out))
        self.all += out.widths
        if timed:
            self.timed += out.widths
            self.samples += out.samples

    def read_back(self, scale_now: torch.Tensor | None = None) -> None:
        """Wait for the device once and read the pending losses, scales and step times; `scale_now`: fp16's
        scale now, to tell which steps the scaler skipped."""
        if not self.pending:
            return
        if self.cuda:
            self.events[-1][1].synchronize()
            self.step_times.extend(a.elapsed_time(b) / 1e3 for a, b in self.events)
            self.events.clear()
        self.h["losses"].extend(torch.stack([out.loss for _, out in self.pending]).tolist())
        if self.scaler is not None:
            after = [out.scale for _, out in self.pending[1:]] + [scale_now]
            for (step, out), new in zip(self.pending, after):
                self.h["scales"].append(float(out.scale))
                if float(new) < float(out.scale):  # the scaler halved its scale: the step was skipped
                    self.h["skipped_steps"].append(step)
        self.pending.clear()

    def result(self, start: int, steps: int, peak_flops: float | None) -> TrainResult:
        """The run's TrainResult; MFU against `peak_flops`, else `run_peak` for the device."""
        if self.track_memory and self.cuda:
            self.peak_memory = torch.cuda.max_memory_allocated(self.device)
            self.memory_method = "torch.cuda.max_memory_allocated"
        timed_s = sum(t for t, timed in zip(self.step_times, self.timed_steps) if timed)
        tokens = int(sum(n for n, _ in self.timed))
        flops_problem = flops_unreadable(self.model)
        per_token, timed_flops = useful_flops(self.model, self.all), useful_flops(self.model, self.timed)
        peak, source = ((peak_flops, "TrainConfig.peak_flops") if peak_flops
                        else run_peak(self.device) if per_token is not None else (None, ""))
        ok = peak and timed_s > 0 and tokens > 0 and timed_flops is not None
        notes = self._notes(timed_s, tokens, flops_problem, peak, source)
        if notes:
            print0("train: " + "; ".join(f"{k} is None: {why}" for k, why in notes.items()))
        return TrainResult(
            losses=self.h["losses"], step_times_s=self.step_times,
            tokens_per_s=tokens / timed_s if timed_s > 0 else None,
            samples_per_s=self.samples / timed_s if timed_s > 0 else None,
            mfu=mfu(tokens / timed_s, timed_flops / tokens, peak) if ok else None,
            peak_memory_bytes=self.peak_memory, steps_done=max(start, steps),
            resumed_from=self.h["resumed_from"], skipped_steps=self.h["skipped_steps"],
            scales=self.h["scales"], lrs=self.h["lrs"], peak_flops=peak, peak_source=source,
            flops_per_token=per_token / int(sum(n for n, _ in self.all)) if per_token else None,
            memory_method=self.memory_method, notes=notes)

    def _notes(self, timed_s: float, tokens: int, flops_problem: str | None, peak: float | None,
               source: str) -> dict[str, str]:
        notes: dict[str, str] = {}
        if not timed_s > 0:
            notes["tokens_per_s"] = notes["samples_per_s"] = (
                "no step was timed: the first step of a call is warm-up, so throughput needs 2 steps or more")
        if flops_problem is not None:
            notes["flops_per_token"] = flops_problem
        if flops_problem is not None:
            notes["mfu"] = "no FLOPs per token (flops_per_token's reason)"
        elif not peak:
            notes["mfu"] = (f"{source}: give TrainConfig(peak_flops=...) in FLOP/s, or run lesson 00 on a "
                            "quiet machine to save this machine's roofline")
        elif "tokens_per_s" in notes or tokens == 0:
            notes["mfu"] = "nothing was timed" if "tokens_per_s" in notes else "no real tokens were timed"
        if not peak:
            notes["peak_flops"] = "not looked up: the FLOPs are not known" if flops_problem else source
        if self.peak_memory is None:
            notes["peak_memory_bytes"] = (
                "not tracked: TrainConfig(track_memory=False)" if not self.track_memory else
                "no step ran" if not self.step_times else
                f"torch keeps no peak-memory statistics for {self.device.type!r}" if self.device.type != "cpu"
                else "the first step ran under a profiler of yours, and the CPU's memory is read with one "
                     "(two cannot nest): run without it, or measure with "
                     "helpers.measure.memory.track_peak_memory")
        return notes


def flops_unreadable(model: nn.Module) -> str | None:
    """Why helpers.measure.flops cannot count `model`'s FLOPs (its error names the fix), or None."""
    try:
        model_flops_per_token(unwrap_model(model), 1)
    except ValueError as err:
        return str(err)
    return None


def useful_flops(model: nn.Module, widths: Widths) -> float | None:
    """Real tokens × model FLOPs per token at each batch's width: padding is not useful work; None for a
    model helpers.measure.flops cannot read (lesson 08)."""
    per_width: dict[int, float] = {}
    try:
        for _, width in widths:
            if width not in per_width:
                per_width[width] = model_flops_per_token(unwrap_model(model), width)
    except ValueError:  # model_flops_per_token names what it cannot read
        return None
    return float(sum(int(n) * per_width[w] for n, w in widths))


def run_peak(device: torch.device) -> tuple[float | None, str]:
    """(peak FLOP/s, where from) a run's MFU divides by (helpers.measure.roofline.mfu_peak), or (None, why
    not) (lesson 02)."""
    peak = mfu_peak(device)
    if peak is not None:
        return peak.flops, peak.source
    _, why = saved_roofline()
    return None, f"no peak known for this device ({why})"
