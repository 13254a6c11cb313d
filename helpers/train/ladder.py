"""Lesson 08's speed ladder: rungs that each change one RunSpec switch, the greedy rule, the climb with
every stack checked before it is timed beside the stack below and the baseline, and the batches every
stack trains on (benchmarks/ladder.py). Guide: docs/library/train.md#helperstrainladder"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from helpers.core.adapt import as_batch, logits_of, loss_of
from helpers.core.compat import hf_model_in
from helpers.core.diagnosis import OOMReport
from helpers.core.timing import (
    OTHERS_BUSY,
    TOO_BUSY,
    Busy,
    CpuLoad,
    LoadProbe,
    Timing,
    busy,
    synchronize,
    time_interleaved,
    time_passes,
)
from helpers.data.text import TokenizedDataset
from helpers.measure.agreement import agree, looser, optimizer_step_agreement
from helpers.measure.flops import mfu, model_flops_per_token
from helpers.measure.roofline import mfu_peak, saved_roofline
from helpers.model.packed_model import packed_padding_stats
from helpers.train.ladder_report import ladder_rows, your_stack
from helpers.train.loop import TrainStep, make_optimizer
from helpers.train.meter import flops_unreadable
from helpers.train.runspec import RunSpec

__all__ = ["Rung", "BASELINE", "RUNGS", "RULE", "Decision", "Step", "Arm", "keeps", "climb", "let_go",
           "RungDisagrees", "measure_stack", "climb_stacks", "sample_batches", "baseline_for", "plan_rungs",
           "fp16_rung_problem", "tf32_rung_problem"]

@dataclass(frozen=True)
class Rung:
    """One rung: the switch it changes, to what, and what is commonly claimed for it (lesson 08)."""

    name: str
    switch: str  # a field of RunSpec
    value: Any
    claim: str
    # why the ladder does not run this rung on a device (None: it does), beyond what the device cannot run
    where: Callable[[torch.device], str | None] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.switch not in {f.name for f in dataclasses.fields(RunSpec)}:
            raise ValueError(f"Rung {self.name!r} changes {self.switch!r}, which is not a RunSpec switch")

    def on(self, spec: RunSpec) -> RunSpec:
        """`spec` with this rung's switch set: the spec change the rung is (lesson 08)."""
        return spec.replace(**{self.switch: self.value})


def fp16_rung_problem(device: torch.device | str) -> str | None:
    """Why the ladder leaves out its fp16 rung on `device`, or None: it is for GPUs without bf16 tensor cores
    (compute capability < 8.0: T4, V100) (lessons 02, 08)."""
    device = torch.device(device)
    if device.type != "cuda":
        return (f"fp16 + GradScaler is the 16-bit rung of GPUs without bf16 tensor cores (compute capability "
                f"< 8.0); on a {device.type.upper()} bf16 autocast is the 16-bit rung")
    cap = torch.cuda.get_device_capability(device)
    if cap >= (8, 0):
        return (f"{torch.cuda.get_device_name(device)} (compute capability {cap[0]}.{cap[1]}) has bf16 "
                "tensor cores: bf16 autocast is its 16-bit rung (fp32's range, no loss scale)")
    return None


def tf32_rung_problem(device: torch.device | str) -> str | None:
    """Why the ladder leaves out its TF32 rung on `device`, or None: without TF32 tensor cores (compute
    capability >= 8.0) the same fp32 matmuls run, and timing them twice measures noise (lessons 02, 08)."""
    device = torch.device(device)
    if device.type != "cuda":
        return (f"a {device.type.upper()} has no TF32 units: + TF32 runs the same fp32 matmuls, nothing to "
                "time")
    cap = torch.cuda.get_device_capability(device)
    if cap < (8, 0):
        return (f"{torch.cuda.get_device_name(device)} (compute capability {cap[0]}.{cap[1]}) has no TF32 "
                "tensor cores (8.0 and up): + TF32 runs the same fp32 matmuls, nothing to time")
    return None


# fp32, eager attention, no compile, the default (unfused) AdamW, every batch padded to the longest allowed
BASELINE = RunSpec(precision="fp32", attn="eager", compile=False, fused_adamw=False, padding="fixed")
RUNGS: tuple[Rung, ...] = (
    Rung("+ TF32", "precision", "tf32", "up to ~2-3x on fp32 matmuls (Ampere+ GPUs)",
         where=tf32_rung_problem),
    Rung("+ bf16 autocast", "precision", "bf16", "1.5-2.3x, ~40 % less memory (docs/claims.md#c2)"),
    Rung("+ fp16 autocast + GradScaler", "precision", "fp16",
         "bf16's speed-up on GPUs with fp16 tensor cores only (T4, V100), a loss scale against underflow "
         "(lesson 02)", where=fp16_rung_problem),
    Rung("+ SDPA", "attn", "sdpa", "faster, less memory, most on long sequences"),
    Rung("+ torch.compile", "compile", True, "10-30 % faster (docs/claims.md#c4)"),
    Rung("+ fused AdamW", "fused_adamw", True, "a few % (one kernel per step for all parameters)"),
    Rung("+ length bucketing", "padding", "bucketed", "proportional to the padding removed"),
    Rung("+ packing", "padding", "packed", "up to 2x throughput (docs/claims.md#c12)"),
    Rung("+ FP8", "fp8", True, "doubles bf16's speed on Hopper (docs/claims.md#c13)"),
)

RULE = ("keep a rung when best median / candidate median > 1 + max(IQR / median of both arms); no verdict "
        f"(not kept) when the arms' rounds disagree by {TOO_BUSY:.0%} or more, or other programs took "
        f"{OTHERS_BUSY:.0%} or more of the CPUs while they ran (helpers.core.timing.busy)")

# --- the greedy rule and the climb ------------------------------------------------------------------

@dataclass(frozen=True)
class Decision:
    """Whether a candidate beats the best arm beyond the spread; too busy to judge: not kept (lesson 08)."""

    keep: bool
    ratio: float  # best median time / candidate median time: > 1 means the candidate is faster
    threshold: float  # 1 + the larger relative IQR of the two arms
    busy: Busy | None = None  # the timings' state; too busy: no verdict

    @property
    def too_busy(self) -> bool:
        """True when the timings could not judge the rung (`busy` says why) (lesson 08)."""
        return self.busy is not None and self.busy.too_busy

    def __str__(self) -> str:
        if self.too_busy:
            return f"{self.ratio:.2f}x, {self.busy}: not judged, not kept"
        verdict = "kept" if self.keep else "dropped"
        return f"{self.ratio:.2f}x vs threshold {self.threshold:.2f}x: {verdict}"


def keeps(candidate: Timing, best: Timing, *, load: CpuLoad | None = None) -> Decision:
    """The greedy rule (`RULE`): keep the candidate when faster than the best arm by more than the larger
    relative IQR; `load` (other programs' CPU share) can make it too busy to judge (lesson 08)."""
    for name, t in (("candidate", candidate), ("best", best)):
        if not t.median_s > 0 or t.iqr_s < 0:
            raise ValueError(f"the {name} timing needs a positive median and a non-negative IQR, got {t}")
    ratio = best.median_s / candidate.median_s
    threshold = 1.0 + max(candidate.iqr_s / candidate.median_s, best.iqr_s / best.median_s)
    state = busy(candidate, best, load=load)
    return Decision(ratio > threshold and not state.too_busy, ratio, threshold, state)


class RungDisagrees(AssertionError):
    """A stack's outputs differ from the stack below beyond the tolerance: it is not timed (lesson 08)."""


@dataclass
class Arm:
    """One measured stack: its timing, the outputs later stacks are checked against, its row (lesson 08)."""

    stack: RunSpec
    timing: Timing | None  # None until `climb` times it beside the stack below (measure_stack's timed=False)
    reference: Any = None  # what `measure_stack` compares the next stack with (logits, loss, precision)
    row: dict[str, Any] = field(default_factory=dict)
    run: Callable[[], Any] | None = field(default=None, repr=False)  # one timed pass, to time it again


@dataclass
class Step:
    """One rung of a climb: its stack, arm, decision and speed-up over the baseline (lesson 08)."""

    rung: Rung
    stack: RunSpec
    arm: Arm | None  # None: not measured (see `note`)
    base: RunSpec  # the stack it was added to
    decision: Decision | None
    note: str = ""  # why it was not measured: time budget, the device cannot run it, failed its check, OOM
    speedup: float | None = None  # baseline median / this stack's median, timed in one session
    skipped: bool = False  # not run, by `skip`'s reason: the device cannot run it or the model take it


def _side_by_side(arm: Arm, ref: Arm, base: Arm, repeats: int) -> tuple[Decision, float]:
    # `arm`, the stack it is added to and the baseline timed in alternation: one session for the whole row;
    # arms without a pass to repeat (`run` None) are compared with their own timings
    load = None
    if arm.run is None or ref.run is None or base.run is None:
        t_arm, t_ref, t_base = arm.timing, ref.timing, base.timing
    else:
        runs = [arm.run, ref.run] + ([base.run] if base is not ref else [])
        with LoadProbe() as probe:  # what other programs took of the CPUs while the arms ran
            t_arm, t_ref, *rest = time_interleaved(*runs, repeats=repeats)
        load = probe.load
        t_base = rest[0] if rest else t_ref
        arm.timing = t_arm
        arm.row.update(_rates(arm.row, t_arm))
    for who, arm_of, t in (("below", ref, t_ref), ("baseline", base, t_base)):
        arm.row.update({f"{who}_median_s": t.median_s, f"{who}_iqr_s": t.iqr_s})
        if "documents_per_pass" in arm_of.row:
            arm.row[f"{who}_samples_per_s"] = arm_of.row["documents_per_pass"] / t.median_s
    return keeps(t_arm, t_ref, load=load), t_base.median_s / t_arm.median_s


def climb(rungs: Sequence[Rung], measure: Callable[[RunSpec, Arm | None], Arm], *, greedy: bool = False,
          baseline: RunSpec = BASELINE, time_budget_s: float | None = None,
          skip: Callable[[RunSpec, Rung], str | None] | None = None, repeats: int = 5,
          log: Callable[[str], None] = print,
          on_step: Callable[[Arm, list[Step], RunSpec], None] | None = None,
          ) -> tuple[Arm, list[Step], RunSpec]:
    """The baseline, then each rung added to the stack below (cumulative) or to the best so far (greedy);
    (baseline arm, steps, final stack) (lesson 08). Guide: docs/library/train.md#helperstrainladder"""
    if not rungs:
        raise ValueError("climb needs at least one rung")
    t0 = time.perf_counter()
    base_arm = measure(baseline, None)
    best = below = base_arm
    steps: list[Step] = []

    def done() -> RunSpec:
        return best.stack if greedy else below.stack

    if on_step is not None:
        on_step(base_arm, steps, done())
    for rung in rungs:
        ref = best if greedy else below
        stack = rung.on(ref.stack)
        if stack == ref.stack:
            log(f"{rung.name}: already in the stack, nothing to measure")
            steps.append(Step(rung, stack, ref, ref.stack, None))
            if on_step is not None:
                on_step(base_arm, steps, done())
            continue
        why = skip(stack, rung) if skip is not None else None
        skipped = why is not None
        if why is None and time_budget_s is not None and time.perf_counter() - t0 > time_budget_s:
            why = f"not measured: the time budget of {time_budget_s:.0f} s is spent"
        if why is None:
            arm, decision, speedup, why = _try_stack(stack, ref, base_arm, measure, repeats)
        if why is not None:
            log(f"{rung.name}: {why}")
            steps.append(Step(rung, stack, None, ref.stack, None, why, skipped=skipped))
            if on_step is not None:
                on_step(base_arm, steps, done())
            continue
        steps.append(Step(rung, stack, arm, ref.stack, decision, speedup=speedup))
        log(f"{rung.name}: {decision}" if greedy else f"{rung.name}: {decision.ratio:.2f}x the rung below"
            + (f" ({decision.busy})" if decision.too_busy else ""))
        was = (best, below, arm)
        below = arm
        if decision.keep or not greedy:
            best = arm
        let_go(was, keep=(base_arm, best if greedy else below))
        if on_step is not None:
            on_step(base_arm, steps, done())
    return base_arm, steps, done()


def let_go(arms: Sequence[Arm], *, keep: Sequence[Arm]) -> None:
    """Drop the timed pass (model, gradients, optimizer state) of each arm not in `keep`; rows and timings
    stay (lesson 08)."""
    for arm in arms:
        if not any(arm is k for k in keep):
            arm.run = None


def _try_stack(stack: RunSpec, ref: Arm, base_arm: Arm, measure: Callable[[RunSpec, Arm | None], Arm],
               repeats: int) -> tuple[Arm | None, Any, Any, str | None]:
    # a stack that disagrees or runs out of memory is reported in `why not`, and the climb goes on
    oom = None
    try:
        arm = measure(stack, ref)
        decision, speedup = _side_by_side(arm, ref, base_arm, repeats)
        return arm, decision, speedup, None
    except RungDisagrees as err:
        return None, None, None, f"failed its check, not timed: {err}"
    except RuntimeError as err:
        oom = OOMReport.parse(err)
        if oom is None:
            raise
    # out of the except block: the error's frames, and the tensors they held, are gone; give the memory back
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return None, None, None, f"did not fit, not timed: {oom}"


# --- measuring a stack ----------------------------------------------------------------------------------

def _rates(row: Mapping[str, Any], timing: Timing) -> dict[str, Any]:
    t, peak, tokens = timing.median_s, row.get("peak_flops_used"), row["real_tokens_per_pass"]
    useful = row["useful_flops_per_pass"]  # None for a model whose FLOPs are not known (row["notes"])
    return dict(pass_median_s=t, pass_iqr_s=timing.iqr_s, passes=timing.runs,
                samples_per_s=row["documents_per_pass"] / t, tokens_per_s=tokens / t,
                useful_flops_per_s=useful / t if useful is not None else None,
                mfu=(mfu(tokens / t, useful / tokens, peak) if peak and tokens and useful is not None
                     else None))


def _to(batch: Any, device: torch.device, model: nn.Module | None = None) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
            for k, v in as_batch(batch, model).items()}


def _check_against(stack: RunSpec, reference: Arm, logits: torch.Tensor | None,
                   loss: torch.Tensor) -> dict[str, str]:
    # RungDisagrees unless logits (where the model has them) and loss agree within the looser tolerance
    ref_logits, ref_loss, ref_precision = reference.reference
    tol = looser(stack.effective_precision, ref_precision)
    ok_s = agree(loss, ref_loss, tol)
    ok_l = agree(logits, ref_logits, tol) if logits is not None and ref_logits is not None else None
    if not (ok_s.ok and (ok_l is None or ok_l.ok)):
        raise RungDisagrees(f"{stack} disagrees with {reference.stack}: logits {ok_l}, loss {ok_s}")
    return {"check_logits": str(ok_l) if ok_l is not None else "no logits (the loss is checked)",
            "check_loss": str(ok_s)}


def _random_forward(run: nn.Module, batch: Mapping[str, Any], stack: RunSpec, device: torch.device,
                    logits: torch.Tensor | None, loss: torch.Tensor) -> str:
    # a failed check's cause when the same eval-mode forward pass differs from itself: "" otherwise
    run.eval()
    with torch.no_grad(), stack.step_context(device), stack.autocast(device):
        again = run(**batch)
    run.train()
    tol = looser(stack.effective_precision, stack.effective_precision)
    same_loss = agree(loss_of(again).detach().float().cpu().reshape(1), loss, tol)
    same = same_loss.ok and (logits is None or agree(logits_of(again).detach().float().cpu(), logits, tol).ok)
    if same:
        return ""
    return (f". Two forward passes of this same stack in eval mode differ too (loss {same_loss}): the model "
            "draws random numbers with dropout off, most likely dropout that ignores model.eval(), e.g. "
            "F.dropout(x, p) with training=True, or an attention's dropout_p not read from self.training: "
            "make its dropout follow self.training")


def _pass_stats(batches: Sequence[Mapping[str, torch.Tensor]], model: nn.Module) -> tuple[Any, str | None]:
    # (documents, real tokens, useful FLOPs, padding of a pass; why the FLOPs are None, or None)
    why = flops_unreadable(model)
    if all("attention_mask" in b for b in batches):
        return packed_padding_stats(batches, model if why is None else None), why

    ids = [b["input_ids"] for b in batches]
    real = sum(x.numel() for x in ids)
    flops = (None if why is not None else
             sum(x.numel() * model_flops_per_token(model, x.shape[-1]) for x in ids))
    return SimpleNamespace(documents=sum(x.shape[0] for x in ids), real_tokens=real, useful_flops=flops,
                           padding_fraction=0.0), why


def measure_stack(stack: RunSpec, reference: Arm | None, *, make_model: Callable[[], nn.Module],
                  batches: Mapping[str, Sequence[Any]], check: Mapping[str, Any], device: torch.device,
                  lr: float = 5e-5, repeats: int = 5, peak_flops: float | None = None,
                  timed: bool = True, max_grad_norm: float | None = 1.0) -> Arm:
    """Check `stack` against `reference` in eval mode, one warm-up pass, then `repeats` timed training passes
    through TrainStep unless not `timed` (lesson 08). RungDisagrees when the stack disagrees."""
    model = make_model()
    run = stack.apply(model)
    row: dict[str, Any] = {}
    # 1. agreement with the reference: one forward pass (the first call also compiles, when asked) in eval
    # mode, so that dropout is off whatever form it takes: nn.Dropout modules, or F.dropout and attention's
    # dropout_p read from self.training (Llama's attention_dropout); two passes with dropout on draw
    # different masks, and would never agree
    run.eval()
    row["check_mode"] = "eval: dropout off (modules and functional)"
    cb = _to(check[stack.padding], device, model)
    t0 = time.perf_counter()
    with stack.step_context(device), stack.autocast(device):
        out = run(**cb)
    synchronize(device)
    row["first_call_s"] = time.perf_counter() - t0
    run.train()
    logits, loss = logits_of(out), loss_of(out)
    if loss is None:
        raise ValueError(f"{type(model).__name__} returned no loss for the check batch: give it labels")
    logits = logits.detach().float().cpu() if logits is not None else None
    loss_ref = loss.detach().float().cpu().reshape(1)
    if reference is not None:
        try:
            row.update(_check_against(stack, reference, logits, loss_ref))
        except RungDisagrees as err:  # is the model itself random in eval mode? then that is the cause
            raise RungDisagrees(f"{err}{_random_forward(run, cb, stack, device, logits, loss_ref)}") from None
    # the applied model's parameters: on transformers 4.x an attention switch rebuilds the model
    opt = make_optimizer(run, lr, 0.01, fused=stack.fused_adamw)
    scaler = stack.make_scaler(device)  # fp16's loss scale; a disabled one passes everything through
    if reference is not None and stack.fused_adamw and not reference.stack.fused_adamw:
        loss.backward()  # gradients for the check: the optimizer never changes the forward pass
        step = optimizer_step_agreement(
            list(run.parameters()), lambda ps: torch.optim.AdamW(ps, lr=lr, fused=False),
            lambda ps: torch.optim.AdamW(ps, lr=lr, fused=True))
        row["check_optimizer"] = str(step)
        if not step.ok:
            raise RungDisagrees(f"one fused AdamW step differs from the unfused one: {step}")
    opt.zero_grad(set_to_none=True)
    # 2. timed passes over the stack's batches (the same samples for every stack), one optimizer step per
    # batch: the step `train` runs (helpers.train.loop.TrainStep), checked once here
    dev_batches = [_to(b, device, model) for b in batches[stack.padding]]
    step = TrainStep(run, opt, spec=stack, device=device, scaler=scaler, max_grad_norm=max_grad_norm)

    def one_pass() -> None:
        for b in dev_batches:
            step(b)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    one_pass()  # warm-up: new shapes compile here (dynamic padding), the optimizer state appears
    synchronize(device)
    row["warmup_pass_s"] = time.perf_counter() - t0
    timing = time_passes(one_pass, repeats=repeats, device=device) if timed else None
    stats, flops_why = _pass_stats(dev_batches, model)  # documents, real tokens, useful FLOPs (no padding)
    cuda = device.type == "cuda"
    row.update(documents_per_pass=stats.documents, real_tokens_per_pass=stats.real_tokens,
               useful_flops_per_pass=stats.useful_flops, peak_flops_used=peak_flops,
               padded_fraction=stats.padding_fraction,
               peak_memory_bytes=torch.cuda.max_memory_allocated(device) if cuda else None)
    notes = {}
    if not cuda:
        notes["peak_memory_bytes"] = ("measured from CUDA's allocator statistics, which a "
                                      f"{device.type.upper()} does not keep (lesson 03 measures a CPU's)")
    if flops_why is not None:
        notes["mfu"] = f"no FLOPs per token: {flops_why}"
    elif not peak_flops:
        found = mfu_peak(device)
        notes["mfu"] = ("no peak FLOP/s given: "
                        "climb_stacks(peak_flops=helpers.measure.roofline.mfu_peak(device)"
                        ".flops)" + (f", {found.flops / 1e9:,.1f} GFLOP/s here ({found.source})" if found
                                     else f"; none is known here: {saved_roofline()[1]}"))
    row["notes"] = notes
    if timing is not None:
        row.update(_rates(row, timing))
    return Arm(stack, timing, (logits, loss_ref, stack.effective_precision), row, one_pass)


FIRST_WORD_ID = 1000  # a BERT vocabulary's [PAD], [UNK], [CLS], [SEP], [MASK] and [unused*] ids lie below

# --- batches: the same samples for every padding ----------------------------------------------------------

def sample_batches(lengths: Sequence[int], *, batch_size: int, n_batches: int, seq_len: int, vocab: int,
                   n_classes: int, pad_token_id: int = 0, seed: int = 0,
                   token_ids: Sequence[Sequence[int]] | None = None, labels: Sequence[int] | None = None,
                   check_size: int | None = None
                   ) -> tuple[dict[str, list[dict[str, torch.Tensor]]], dict[str, dict[str, torch.Tensor]]]:
    """(batches, check): the same samples batched per padding ("fixed", "bucketed", "packed"), and the first
    `check_size` as one batch per padding for the checks (lesson 08). Random ids unless `token_ids`."""
    need = batch_size * n_batches
    if min(batch_size, n_batches, seq_len) < 1:
        raise ValueError(f"need batch_size, n_batches and seq_len >= 1, got {batch_size}, {n_batches}, "
                         f"{seq_len}")
    if token_ids is None and vocab < 2:
        raise ValueError(f"vocab={vocab}: random token ids need a vocabulary of 2 or more (0 is padding)")
    low = FIRST_WORD_ID if vocab >= 2 * FIRST_WORD_ID else 1
    if len(lengths) < need:
        raise ValueError(f"need {need} samples for {n_batches} batches of {batch_size}, got {len(lengths)}")
    g = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(len(lengths), generator=g)[:need].tolist()
    ids, ys = [], []
    for i in chosen:
        n = min(int(lengths[i]), seq_len)
        if token_ids is not None:
            ids.append(list(token_ids[i])[:n])
        else:
            tg = torch.Generator().manual_seed(seed * 1_000_003 + i)  # sample i always gets the same tokens
            ids.append(torch.randint(low, vocab, (n,), generator=tg).tolist())
        ys.append(int(labels[i]) if labels is not None else i % n_classes)
    ds = TokenizedDataset(ids, ys)
    paddings = ("fixed", "bucketed", "packed")
    loaders = {p: RunSpec(padding=p).dataloader(ds, batch_size, pad_token_id=pad_token_id, max_length=seq_len,
                                                shuffle=True, seed=seed, device="cpu") for p in paddings}
    batches = {p: list(loader) for p, loader in loaders.items()}
    first = TokenizedDataset(ids[:check_size or batch_size], ys[:check_size or batch_size])
    # one batch in dataset order: "bucketed" checks as dynamic padding (buckets would reorder the samples)
    check = {p: next(iter(RunSpec(padding="dynamic" if p == "bucketed" else p).dataloader(
        first, len(first), pad_token_id=pad_token_id, max_length=seq_len, shuffle=False, device="cpu")))
        for p in paddings}
    return batches, check


# --- the climb on a model, and its rows ------------------------------------------------------------------

def baseline_for(model: nn.Module) -> RunSpec:
    """`BASELINE` for a Hugging Face (or peft) model; for any other, the same with its own attention
    (attn=None) (lesson 08)."""
    return BASELINE if hf_model_in(model) is not None else BASELINE.replace(attn=None)


def _model_problems(model: nn.Module, rungs: Sequence[Rung], baseline: RunSpec) -> dict[tuple, str | None]:
    # (attn, padding, activation_checkpointing) -> check_model's reason, for every mix the climb can reach,
    # so that the model itself need not be kept

    def values(name: str) -> set:
        return {getattr(baseline, name)} | {r.value for r in rungs if r.switch == name}

    problems: dict[tuple, str | None] = {}
    for key in itertools.product(values("attn"), values("padding"), values("activation_checkpointing")):
        try:
            spec = RunSpec(**dict(zip(("attn", "padding", "activation_checkpointing"), key)))
        except ValueError:  # a mix RunSpec refuses (varlen without packing): no climb reaches it
            continue
        try:
            spec.check_model(model)
            problems[key] = None
        except ValueError as err:
            problems[key] = str(err)
    return problems


def _skip_reason(stack: RunSpec, rung: Rung, device: torch.device, problems: dict[tuple, str | None] | None,
                 paddings: Sequence[str] | None) -> str | None:
    why = rung.where(device) if rung.where is not None else None
    try:
        stack.check(device)
    except ValueError as err:
        why = why or str(err)
    if why is None and problems is not None:
        why = problems.get((stack.attn, stack.padding, stack.activation_checkpointing))
    if why is None and paddings is not None and stack.padding not in paddings:
        why = (f"no batches for padding={stack.padding!r}: give batches[{stack.padding!r}] and "
               f"check[{stack.padding!r}] (helpers.train.ladder.sample_batches makes every padding's)")
    return f"skipped: {why}" if why else None


def plan_rungs(device: torch.device | str, *, model: nn.Module | None = None, rungs: Sequence[Rung] = RUNGS,
               baseline: RunSpec | None = None,
               paddings: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Before anything runs: one {"name", "stack", "skipped"} per rung, "skipped" the reason the ladder
    skips it on `device` (and `model`, `paddings`) or None (lesson 08)."""
    device = torch.device(device)
    base = baseline if baseline is not None else (baseline_for(model) if model is not None else BASELINE)
    problems = _model_problems(model, rungs, base) if model is not None else None
    return [{"name": r.name, "stack": r.on(base), "skipped": _skip_reason(r.on(base), r, device, problems,
                                                                           paddings)} for r in rungs]


def _none_line(rows: Sequence[Mapping[str, Any]]) -> str | None:
    reasons: dict[str, str] = {}
    for row in rows:
        for key, why in row.get("notes", {}).items():
            reasons.setdefault(key, why)
    return "ladder: " + "; ".join(f"{k} is None: {why}" for k, why in reasons.items()) if reasons else None


def climb_stacks(make_model: Callable[[], nn.Module], batches: Mapping[str, Sequence[Any]],
                 check: Mapping[str, Any], *, device: torch.device,
                 greedy: bool = True, repeats: int = 5, lr: float = 5e-5, peak_flops: float | None = None,
                 rungs: Sequence[Rung] = RUNGS, time_budget_s: float | None = None,
                 baseline: RunSpec | None = None, log: Callable[[str], None] = print,
                 on_rung: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """`climb` with `measure_stack` on a model and batches per padding (lesson 08): {"mode", "rows", "stack",
    "your_stack", "your_stack_code", "your_stack_vs_baseline", "too_busy"}, partial ones to `on_rung`."""
    device = torch.device(device)
    probe = make_model()  # what the model can take (its attention, a packed forward), then let go
    base_spec = baseline if baseline is not None else baseline_for(probe)
    problems = _model_problems(probe, rungs, base_spec)
    del probe
    if base_spec.padding not in batches or base_spec.padding not in check:
        raise ValueError(f"the baseline pads {base_spec.padding!r}: give batches[{base_spec.padding!r}] and "
                         f"check[{base_spec.padding!r}] (dicts or (x, y) pairs), got {sorted(batches)}")
    paddings = [p for p in batches if p in check]

    def measure(stack: RunSpec, ref: Arm | None) -> Arm:
        # no dynamo reset: the best arm's compiled layers must stay valid to be timed again beside the
        # candidate (so a compiled stack's first call includes compiling only when the cache is cold)
        return measure_stack(stack, ref, make_model=make_model, batches=batches, check=check, device=device,
                             lr=lr, repeats=repeats, peak_flops=peak_flops, timed=ref is None)

    def skip(stack: RunSpec, rung: Rung) -> str | None:
        return _skip_reason(stack, rung, device, problems, paddings)

    def result(base: Arm, steps: list[Step], final: RunSpec) -> dict[str, Any]:
        rows = ladder_rows(base, steps, device, greedy=greedy)
        return {"mode": "greedy" if greedy else "cumulative", "rows": rows,
                "your_stack": dataclasses.asdict(final), "your_stack_code": final.describe(),
                "your_stack_vs_baseline": your_stack(rows, final), "stack": final,
                "too_busy": [r["name"] for r in rows if r.get("too_busy")]}

    def progress(base: Arm, steps: list[Step], final: RunSpec) -> None:
        if on_rung is not None and len(steps) < len(rungs):  # the last one is the result itself
            on_rung({**result(base, steps, final), "partial": f"{len(steps)} of {len(rungs)} rungs done"})

    out = result(*climb(rungs, measure, greedy=greedy, baseline=base_spec, time_budget_s=time_budget_s,
                        skip=skip, repeats=repeats, log=log, on_step=progress))
    line = _none_line(out["rows"])
    if line:
        log(line)
    if out["too_busy"]:
        leaves = " and your stack leaves them out" if greedy else ""
        log(f"ladder: too busy to judge {', '.join(out['too_busy'])}: the machine was too busy while they "
            f"were timed (helpers.core.timing.busy), so no verdict was drawn{leaves}; rerun on a quiet "
            f"machine")
    return out
