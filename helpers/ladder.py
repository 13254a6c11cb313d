"""The speed ladder of lesson 08 and `benchmarks/ladder.py`: rungs, the checks before timing, timed
passes, and the greedy selection of the stack that pays on this machine.

A *stack* is the full set of switches one training run uses: a `helpers.runspec.RunSpec`; a *rung*
(`Rung`) changes one of its fields. The ladder starts from `BASELINE` (fp32, eager attention, no compile,
the default AdamW, every batch padded to the longest sequence allowed) and climbs `RUNGS` in order:

    + TF32 -> + bf16 autocast -> + SDPA -> + torch.compile -> + fused AdamW -> + dynamic padding
    -> + packing (helpers.packing) -> + FP8 (helpers.fp8; GPUs of compute capability 8.9+ only)

Two ways to climb (`climb`):

- cumulative: every rung is added to the stack below it, whatever it measured;
- greedy: each rung is added to the *best stack so far* and kept only when it is faster beyond the
  measured spread (`keeps`): median speed ratio > 1 + the larger relative IQR (IQR / median) of the two
  arms. What survives is "your stack" for this machine, printed as the code to use (`RunSpec.describe`).

The candidate and the stack it is added to are timed in alternation (`helpers.timing.time_interleaved`),
so a change in the machine's load falls on both arms alike; a stack's speed-up over the baseline is the
product of those side-by-side ratios, and the stack that survives is timed once more in alternation with
the baseline (`side_by_side`): no speed-up divides a late timing by the baseline's early one.
Before a stack is timed it is checked against
the stack it adds to (`measure_stack`), from the same weights on the same samples: logits and loss of one
forward pass within the tolerance of the looser precision of the two (`TOLERANCES`), each pass run in its
own spec's TF32 setting and autocast (`RunSpec.step_context`, TF32 on for tf32 and every later precision,
as in training, around the whole step; `RunSpec.autocast` around forward and loss only); the fused-AdamW
rung also checks
one optimizer step's updates against the unfused step on identical gradients (`optimizer_step_agreement`).
A stack that disagrees is not timed and not kept (`RungDisagrees`); a rung the device cannot run (FP8
below compute capability 8.9) is skipped with its one-line reason.

Throughput counts real tokens; MFU counts *useful* FLOPs: each document's tokens at its own length
(`helpers.packing.packed_padding_stats`), never padded positions: removing padding raises MFU, as it should.

`run_ladder` runs it all on a BERT with random weights (speed does not depend on their values) and
samples of the BBC News corpus' token lengths: the benchmark; lesson 08 calls `climb_stacks` on the
pretrained model and the real tokens.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from helpers.data import corpus_lengths
from helpers.models import bert_config
from helpers.runspec import RunSpec
from helpers.timing import Timing, synchronize, time_interleaved, time_passes

__all__ = ["Rung", "BASELINE", "RUNGS", "TOLERANCES", "PRECISION_ORDER", "TARGETS",
           "RULE", "Agreement", "Decision", "Step", "Arm", "looser", "agree", "optimizer_step_agreement",
           "keeps", "climb", "RungDisagrees", "precision_of", "measure_stack", "climb_stacks", "side_by_side",
           "sample_batches", "explain", "run_ladder", "ladder_rows",
           "ladder_table", "to_markdown"]

PRECISION_ORDER = ("fp32", "tf32", "bf16", "fp8")  # later = looser tolerance


@dataclass(frozen=True)
class Rung:
    """One rung: the switch it changes, to what, and what is commonly claimed for it (lesson 08)."""

    name: str
    switch: str  # a field of RunSpec
    value: Any
    claim: str

    def __post_init__(self) -> None:
        if self.switch not in {f.name for f in dataclasses.fields(RunSpec)}:
            raise ValueError(f"Rung {self.name!r} changes {self.switch!r}, which is not a RunSpec switch")

    def on(self, spec: RunSpec) -> RunSpec:
        """`spec` with this rung's switch set: the spec change the rung is (lesson 08)."""
        return spec.replace(**{self.switch: self.value})


# fp32, eager attention, no compile, the default (unfused) AdamW, every batch padded to the longest allowed
BASELINE = RunSpec(precision="fp32", attn="eager", compile=False, fused_adamw=False, padding="fixed")
RUNGS: tuple[Rung, ...] = (
    Rung("+ TF32", "precision", "tf32", "up to ~2-3x on fp32 matmuls (Ampere+ GPUs)"),
    Rung("+ bf16 autocast", "precision", "bf16", "1.5-2.3x, ~40 % less memory (docs/claims.md#c2)"),
    Rung("+ SDPA", "attn", "sdpa", "faster, less memory, most on long sequences"),
    Rung("+ torch.compile", "compile", True, "10-30 % faster (docs/claims.md#c4)"),
    Rung("+ fused AdamW", "fused_adamw", True, "a few % (one kernel per step for all parameters)"),
    Rung("+ dynamic padding", "padding", "bucketed", "proportional to the padding removed"),
    Rung("+ packing", "padding", "packed", "up to 2x throughput (docs/claims.md#c12)"),
    Rung("+ FP8", "fp8", True, "doubles bf16's speed on Hopper (docs/claims.md#c13)"),
)

# (atol, rtol) for logits and loss: |a - b| <= atol + rtol * max|reference|, per the looser precision.
TOLERANCES: dict[str, tuple[float, float]] = {"fp32": (1e-5, 1e-4), "tf32": (2e-3, 1e-2),
                                              "bf16": (2e-2, 5e-2), "fp8": (1e-1, 1e-1)}
RULE = "keep a rung when best median / candidate median > 1 + max(IQR / median of both arms)"
TARGETS = {"speedup": 12.0, "mfu": 0.50}  # issue 15: BERT-base, seq 512, H100/H200, whole stack vs fp32 eager

# --- checks ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Agreement:
    """The result of a check: within tolerance or not, the largest difference, and the allowed one."""

    ok: bool
    err: float
    allowed: float

    def __str__(self) -> str:
        return f"|Δ| {self.err:.1e} {'≤' if self.ok else '>'} {self.allowed:.1e}"


def looser(a: str, b: str) -> str:
    """The looser of two precisions, whose tolerance a comparison between them uses (lesson 08)."""
    for p in (a, b):
        if p not in PRECISION_ORDER:
            raise ValueError(f"unknown precision {p!r}: use one of {PRECISION_ORDER}")
    return max(a, b, key=PRECISION_ORDER.index)


def agree(a: torch.Tensor, b: torch.Tensor, precision: str) -> Agreement:
    """Whether `a` matches the reference `b` within the tolerance of `precision` (lesson 08)."""
    if precision not in TOLERANCES:
        raise ValueError(f"unknown precision {precision!r}: use one of {tuple(TOLERANCES)}")
    if a.shape != b.shape:
        raise ValueError(f"cannot compare shapes {tuple(a.shape)} and {tuple(b.shape)}")
    atol, rtol = TOLERANCES[precision]
    err = (a.float() - b.float()).abs().max().item()
    allowed = atol + rtol * b.float().abs().max().item()
    return Agreement(err <= allowed, err, allowed)


def optimizer_step_agreement(params: Sequence[nn.Parameter], make_reference: Callable[[list], Any],
                             make_candidate: Callable[[list], Any], rtol: float = 1e-3) -> Agreement:
    """One step of two optimizers on copies of the same parameters and gradients: do the *updates* agree,
    within `rtol` of the largest reference update? (lesson 08's fused-AdamW check: the optimizer changes
    the parameters, never the forward pass; an update is ~lr, far below a parameter's own size)."""
    with_grad = [p for p in params if p.grad is not None]
    if not with_grad:
        raise ValueError("no parameter has a gradient: run a backward pass before the optimizer check")
    updates = []
    for make in (make_reference, make_candidate):
        copies = [p.detach().clone().float().requires_grad_(True) for p in with_grad]
        for c, p in zip(copies, with_grad):
            c.grad = p.grad.detach().clone().float()
        make(copies).step()
        deltas = [(c.detach() - p.detach().float()).flatten() for c, p in zip(copies, with_grad)]
        updates.append(torch.cat(deltas))
    err = (updates[1] - updates[0]).abs().max().item()
    allowed = rtol * updates[0].abs().max().item()
    return Agreement(err <= allowed, err, allowed)


# --- greedy selection ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Decision:
    """Whether a candidate arm beats the best one beyond the spread: ratio > 1 + spread (lesson 08)."""

    keep: bool
    ratio: float  # best median time / candidate median time: > 1 means the candidate is faster
    threshold: float  # 1 + the larger relative IQR of the two arms

    def __str__(self) -> str:
        verdict = "kept" if self.keep else "dropped"
        return f"{self.ratio:.2f}x vs threshold {self.threshold:.2f}x: {verdict}"


def keeps(candidate: Timing, best: Timing) -> Decision:
    """The greedy rule: keep the candidate when its median is faster than the best arm's by more than the
    larger relative spread (IQR / median) of the two arms (lesson 08)."""
    for name, t in (("candidate", candidate), ("best", best)):
        if not t.median_s > 0 or t.iqr_s < 0:
            raise ValueError(f"the {name} timing needs a positive median and a non-negative IQR, got {t}")
    ratio = best.median_s / candidate.median_s
    threshold = 1.0 + max(candidate.iqr_s / candidate.median_s, best.iqr_s / best.median_s)
    return Decision(ratio > threshold, ratio, threshold)


class RungDisagrees(AssertionError):
    """A stack's outputs differ from the stack below beyond the tolerance: it is not timed (lesson 08)."""


@dataclass
class Arm:
    """One measured stack: its timing, the outputs later stacks are checked against, and a row of numbers."""

    stack: RunSpec
    timing: Timing
    reference: Any = None  # what `measure_stack` compares the next stack with (logits, loss, precision)
    row: dict[str, Any] = field(default_factory=dict)
    run: Callable[[], Any] | None = field(default=None, repr=False)  # one timed pass, to time it again


@dataclass
class Step:
    """One rung of a climb: the stack measured, its arm, and the decision against the stack below it."""

    rung: Rung
    stack: RunSpec
    arm: Arm | None  # None: not measured (see `note`)
    base: RunSpec  # the stack it was added to
    decision: Decision | None
    note: str = ""  # why it was not measured: time budget, the device cannot run it, failed its check


def climb(rungs: Sequence[Rung], measure: Callable[[RunSpec, Arm | None], Arm], *, greedy: bool = False,
          baseline: RunSpec = BASELINE, time_budget_s: float | None = None,
          skip: Callable[[Rung], str | None] | None = None,
          log: Callable[[str], None] = print) -> tuple[Arm, list[Step], RunSpec]:
    """Measure the baseline, then each rung added to the stack below it (cumulative) or to the best stack
    so far (greedy, kept by `keeps`); returns (baseline arm, steps, the final stack) (lesson 08).

    `measure(stack, reference_arm)` checks `stack` against the reference arm and times it (raising
    RungDisagrees when it disagrees: reported, not kept); `skip(rung)` gives a reason not to run a rung
    on this device (or None); rungs left when `time_budget_s` has run out are reported as not measured."""
    if not rungs:
        raise ValueError("climb needs at least one rung")
    t0 = time.perf_counter()
    base_arm = measure(baseline, None)
    best = below = base_arm
    steps: list[Step] = []
    for rung in rungs:
        stack = rung.on((best if greedy else below).stack)
        ref = best if greedy else below
        if stack == ref.stack:
            log(f"{rung.name}: already in the stack, nothing to measure")
            steps.append(Step(rung, stack, ref, ref.stack, None))
            continue
        why = skip(rung) if skip is not None else None
        if why is None and time_budget_s is not None and time.perf_counter() - t0 > time_budget_s:
            why = f"not measured: the time budget of {time_budget_s:.0f} s is spent"
        if why is None:
            try:
                arm = measure(stack, ref)
            except RungDisagrees as err:
                why = f"failed its check, not timed: {err}"
        if why is not None:
            log(f"{rung.name}: {why}")
            steps.append(Step(rung, stack, None, ref.stack, None, why))
            continue
        if arm.run is not None and ref.run is not None:  # both arms again, in alternation: the same load
            arm.timing, ref_timing = time_interleaved(arm.run, ref.run, repeats=arm.timing.runs)
            arm.row.update(_rates(arm.row, arm.timing), ref_median_s=ref_timing.median_s)
        else:
            ref_timing = ref.timing
        decision = keeps(arm.timing, ref_timing)
        steps.append(Step(rung, stack, arm, ref.stack, decision))
        log(f"{rung.name}: {decision}" if greedy else f"{rung.name}: {decision.ratio:.2f}x the rung below")
        below = arm
        if decision.keep or not greedy:
            best = arm
    return base_arm, steps, (best.stack if greedy else below.stack)


# --- measuring a stack ----------------------------------------------------------------------------------

def _rates(row: Mapping[str, Any], timing: Timing) -> dict[str, Any]:
    """A row's throughput and MFU (helpers.flops.mfu) from a pass timing and the pass's counts."""
    from helpers.flops import mfu

    t, peak, tokens = timing.median_s, row.get("peak_flops_used"), row["real_tokens_per_pass"]
    return dict(pass_median_s=t, pass_iqr_s=timing.iqr_s, passes=timing.runs,
                samples_per_s=row["documents_per_pass"] / t, tokens_per_s=tokens / t,
                useful_flops_per_s=row["useful_flops_per_pass"] / t,
                mfu=mfu(tokens / t, row["useful_flops_per_pass"] / tokens, peak) if peak and tokens else None)


def precision_of(spec: RunSpec) -> str:
    """The precision whose tolerance a spec's outputs are checked with: "fp8" when it uses FP8 (lesson 08)."""
    return "fp8" if spec.fp8 else spec.precision


def _to(batch: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def measure_stack(stack: RunSpec, reference: Arm | None, *, make_model: Callable[[], nn.Module],
                  batches: Mapping[str, Sequence[Mapping[str, torch.Tensor]]],
                  check: Mapping[str, Mapping[str, torch.Tensor]], device: torch.device, lr: float = 5e-5,
                  repeats: int = 5, peak_flops: float | None = None) -> Arm:
    """Check `stack` against `reference` (same weights, same samples), then time `repeats` passes over
    its batches (lesson 08). `make_model()` gives a fresh model with the initial weights on `device`;
    `batches[padding]` and `check[padding]` hold the same samples batched as each padding does.
    Raises AssertionError when the stack disagrees with the reference."""
    from helpers.packing import packed_padding_stats
    from helpers.train import make_optimizer

    model = make_model()
    run = stack.apply(model)
    run.train()
    row: dict[str, Any] = {}
    # 1. agreement with the reference: one forward pass (the first call also compiles, when asked)
    cb = _to(check[stack.padding], device)
    t0 = time.perf_counter()
    with stack.step_context(device), stack.autocast(device):
        out = run(**cb)
    synchronize(device)
    row["first_call_s"] = time.perf_counter() - t0
    logits, loss = out.logits.detach().float().cpu(), out.loss.detach().float().cpu().reshape(1)
    precision = precision_of(stack)
    if reference is not None:
        ref_logits, ref_loss, ref_precision = reference.reference
        tol = looser(precision, ref_precision)
        ok_l, ok_s = agree(logits, ref_logits, tol), agree(loss, ref_loss, tol)
        row.update(check_logits=str(ok_l), check_loss=str(ok_s))
        if not (ok_l.ok and ok_s.ok):
            raise RungDisagrees(f"{stack} disagrees with {reference.stack}: logits {ok_l}, loss {ok_s}")
    # the applied model's parameters: on transformers 4.x an attention switch rebuilds the model
    opt = make_optimizer(run, lr, 0.01, fused=stack.fused_adamw)
    if reference is not None and stack.fused_adamw and not reference.stack.fused_adamw:
        out.loss.backward()  # gradients for the check: the optimizer never changes the forward pass
        step = optimizer_step_agreement(
            list(run.parameters()), lambda ps: torch.optim.AdamW(ps, lr=lr, fused=False),
            lambda ps: torch.optim.AdamW(ps, lr=lr, fused=True))
        row["check_optimizer"] = str(step)
        if not step.ok:
            raise RungDisagrees(f"one fused AdamW step differs from the unfused one: {step}")
    opt.zero_grad(set_to_none=True)
    # 2. timed passes over the stack's batches (the same samples for every stack)
    dev_batches = [_to(b, device) for b in batches[stack.padding]]

    def one_pass() -> None:
        with stack.step_context(device):  # TF32 for the whole step, as in training
            for b in dev_batches:
                with stack.autocast(device):  # forward and loss only
                    loss = run(**b).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    one_pass()  # warm-up: new shapes compile here (dynamic padding), the optimizer state appears
    synchronize(device)
    row["warmup_pass_s"] = time.perf_counter() - t0
    timing = time_passes(one_pass, repeats=repeats, device=device)
    stats = packed_padding_stats(dev_batches, model)  # documents, real tokens, useful FLOPs (no padding)
    row.update(documents_per_pass=stats.documents, real_tokens_per_pass=stats.real_tokens,
               useful_flops_per_pass=stats.useful_flops, peak_flops_used=peak_flops,
               padded_fraction=stats.padding_fraction,
               peak_memory_bytes=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None)
    row.update(_rates(row, timing))
    return Arm(stack, timing, (logits, loss, precision), row, one_pass)


# --- the benchmark: random-weight BERT, BBC News lengths ----------------------------------------------------

def sample_batches(lengths: Sequence[int], *, batch_size: int, n_batches: int, seq_len: int, vocab: int,
                   n_classes: int, pad_token_id: int = 0, seed: int = 0,
                   token_ids: Sequence[Sequence[int]] | None = None, labels: Sequence[int] | None = None,
                   check_size: int | None = None
                   ) -> tuple[dict[str, list[dict[str, torch.Tensor]]], dict[str, dict[str, torch.Tensor]]]:
    """(batches, check): the same `batch_size * n_batches` samples batched as each padding does,
    {"fixed": [...], "bucketed": [...], "packed": [...]} (`RunSpec.dataloader`; packed batches hold the same
    documents per batch as the others, packed into rows), and the first `check_size` of them (default:
    `batch_size`) as one batch per padding, in the same order, for the agreement checks. Token ids are random
    of the given lengths unless `token_ids` are given (benchmark and lesson 08)."""
    from helpers.data import TokenizedDataset

    need = batch_size * n_batches
    if min(batch_size, n_batches, seq_len) < 1:
        raise ValueError(f"need batch_size, n_batches and seq_len >= 1, got {batch_size}, {n_batches}, "
                         f"{seq_len}")
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
            ids.append(torch.randint(1000, vocab, (n,), generator=tg).tolist())
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


def _peak_line(peak: Any) -> str:
    return f"{peak.precision} peak ({peak.source}), {peak.flops / 1e12:.3g} TFLOP/s"


def _why_precision(rung: Rung, f: Mapping[str, Any]) -> str:
    gpu, cap = f["type"] == "cuda", f.get("cap", (0, 0))
    if rung.value == "tf32":
        if gpu and cap >= (8, 0):
            return "fp32 matmuls ran on TF32 tensor cores"
        if gpu:
            return (f"{f['name']} (compute capability {cap[0]}.{cap[1]}) has no TF32 units: the same fp32 "
                    "math ran")
        return "a CPU has no TF32 units: the same fp32 math ran"
    if gpu:
        return ("matmuls on bf16 tensor cores, half the bytes moved" if cap >= (8, 0)
                else "this GPU has no bf16 tensor cores (compute capability < 8.0)")
    if f.get("amx"):
        return f"this CPU has AMX bf16 tile units ({f['cpu_capability']})"
    if f.get("avx512_bf16"):
        return ("this CPU has AVX512-BF16 dot-product instructions (no AMX): bf16 matmuls can beat fp32, "
                "while the casts around them cost")
    return (f"this CPU ({f['cpu_capability']}, no AMX) has no bf16 matmul units: any gain comes from "
            "moving half the bytes, and the conversions cost")


def _why_padding(rung: Rung, padded_removed: float | None, padded_left: float | None) -> str:
    before = ("" if padded_removed is None
              else f"; {100 * padded_removed:.0f} % of the fixed-width positions were padding")
    after = "" if padded_left is None else f", {100 * padded_left:.0f} % here"
    return ("documents packed into rows, kept apart by a document mask; a row's tail that no whole "
            "document fits stays padding" if rung.value == "packed"
            else "batches of similar length, each padded to its longest") + before + after


def _verdict(decision: Decision) -> str:
    if decision.keep:
        return "faster beyond the noise: it pays here"
    if decision.ratio > 1:
        return f"faster by less than the noise (needs > {decision.threshold:.2f}x): not shown to pay here"
    return "not faster here"


def explain(rung: Rung, decision: Decision, device: torch.device, *,
            padded_removed: float | None = None, padded_left: float | None = None) -> str:
    """Why a rung measured what it did (its speed ratio and the rule's verdict) on the device that ran it:
    the reasons come from that device's facts (`helpers.hardware.device_facts`), not from a text written
    for a CPU (lesson 08)."""
    from helpers.hardware import device_facts

    f = device_facts(device)
    gpu = f["type"] == "cuda"
    why = {
        "precision": lambda: _why_precision(rung, f),
        "attn": lambda: "one fused attention kernel, the T×T matrix never stored; attention's share grows "
                        "with length",
        "compile": lambda: ("Inductor fuses the elementwise work between the matmuls" if gpu else
                            "Inductor's CPU kernels against eager kernels that are already fused well"),
        "fused_adamw": lambda: ("one kernel updates every parameter; the optimizer's share of a step is "
                                "larger for small models"),
        "fp8": lambda: ("FP8 tensor cores ran the Linear layers' matmuls" if decision.ratio > 1 else
                        "the casts and scales around each FP8 matmul cost what FP8 saved (compile fuses "
                        "them)"),
        "padding": lambda: _why_padding(rung, padded_removed, padded_left),
    }.get(rung.switch, lambda: rung.claim)()
    return f"{decision.ratio:.2f}x the stack below, {_verdict(decision)} ({why})"


def run_ladder(*, model: str = "base", seq_len: int = 512, batch_size: int = 32, n_batches: int = 4,
               device: str = "auto", repeats: int = 5, lr: float = 5e-5, rungs: Sequence[Rung] = RUNGS,
               greedy: bool = False, lengths: Sequence[int] | None = None, n_classes: int = 5,
               peak_flops: float | None = None, time_budget_s: float | None = None,
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Check and time every rung on a random-weight BERT (cumulative or greedy); a JSON-ready dict with
    the run's stamp (benchmarks/ladder.py)."""
    from transformers import BertForSequenceClassification

    from helpers.hardware import get_device, mfu_peak
    from helpers.results import stamp

    dev = get_device(device)
    cfg = bert_config(model, n_classes)
    if seq_len > cfg.max_position_embeddings or seq_len < 8:
        raise ValueError(f"seq_len {seq_len}: use 8 ... {cfg.max_position_embeddings} (BERT's positions)")
    if lengths is None:
        lengths, lengths_source = corpus_lengths(seq_len, log=log)
    else:
        lengths, lengths_source = list(lengths), "given lengths"
    log(f"run_ladder: BERT {model!r} shapes with random weights (speed does not depend on their values), "
        f"{lengths_source}")
    torch.manual_seed(0)
    state = {k: v.clone() for k, v in BertForSequenceClassification(cfg).state_dict().items()}
    batches, check = sample_batches(lengths, batch_size=batch_size, n_batches=n_batches, seq_len=seq_len,
                                    vocab=cfg.vocab_size, n_classes=n_classes)
    found = None if peak_flops else mfu_peak(dev, measure=True)  # one peak for every stack, measured now
    peak, peak_source = ((peak_flops, "given peak") if peak_flops else
                         (found.flops, _peak_line(found)) if found else (None, "no peak known"))

    def make_model() -> nn.Module:
        m = BertForSequenceClassification(copy.deepcopy(cfg))
        m.load_state_dict(state)
        return m.to(dev)

    result = climb_stacks(make_model, batches, check, device=dev, greedy=greedy, repeats=repeats, lr=lr,
                          peak_flops=peak, rungs=rungs, time_budget_s=time_budget_s, log=log)
    result.pop("stack")
    n_params = sum(v.numel() for v in state.values())
    return {"stamp": stamp(dev), **result,
            "setup": {"model": model, "params": n_params, "seq_len": seq_len, "batch_size": batch_size,
                      "batches_per_pass": n_batches, "repeats": repeats, "lr": lr, "lengths": lengths_source,
                      "peak_flops": peak, "peak_source": peak_source, "tolerances": TOLERANCES,
                      "time_budget_s": time_budget_s, "rule": RULE}}


def climb_stacks(make_model: Callable[[], nn.Module],
                 batches: Mapping[str, Sequence[Mapping[str, torch.Tensor]]],
                 check: Mapping[str, Mapping[str, torch.Tensor]], *, device: torch.device,
                 greedy: bool = True,
                 repeats: int = 5, lr: float = 5e-5, peak_flops: float | None = None,
                 rungs: Sequence[Rung] = RUNGS, time_budget_s: float | None = None,
                 log: Callable[[str], None] = print) -> dict[str, Any]:
    """`climb` with `measure_stack` on the given model and batches (`sample_batches`): each stack checked,
    then timed; rungs the device cannot run (FP8) skipped with their reason; at the end the stack that
    survived is timed again in alternation with the baseline (`side_by_side`). Returns {"mode", "rows",
    "your_stack", "your_stack_code", "your_stack_vs_baseline", "stack"} (lesson 08 and `run_ladder`)."""
    def measure(stack: RunSpec, ref: Arm | None) -> Arm:
        # no dynamo reset: the best arm's compiled layers must stay valid to be timed again beside the
        # candidate (so a compiled stack's first call includes compiling only when the cache is cold)
        return measure_stack(stack, ref, make_model=make_model, batches=batches, check=check, device=device,
                             lr=lr, repeats=repeats, peak_flops=peak_flops)

    def skip(rung: Rung) -> str | None:
        if rung.switch == "fp8":
            from helpers.fp8 import fp8_supported

            ok, why = fp8_supported(device)
            return None if ok else f"skipped: {why}"
        return None

    base, steps, final = climb(rungs, measure, greedy=greedy, time_budget_s=time_budget_s, skip=skip, log=log)
    rows = ladder_rows(base, steps, device, greedy=greedy)
    return {"mode": "greedy" if greedy else "cumulative", "rows": rows,
            "your_stack": dataclasses.asdict(final), "your_stack_code": final.describe(),
            "your_stack_vs_baseline": side_by_side(base, steps, final, repeats=repeats), "stack": final}


def side_by_side(base: Arm, steps: Sequence[Step], final: RunSpec, *, repeats: int = 5) -> dict[str, Any]:
    """The final stack and the baseline timed now, in alternation (`time_interleaved`): the speed-up a
    climb reports, never a late timing divided by the baseline's early one (lesson 08, benchmark)."""
    arm = next((s.arm for s in reversed(steps) if s.arm is not None and s.arm.stack == final), base)
    names = [s.rung.name for s in steps if s.arm is arm]
    out: dict[str, Any] = {"name": names[-1] if names else "fp32 eager (baseline)", "speedup": 1.0,
                           "samples_per_s": base.row["samples_per_s"], "mfu": base.row.get("mfu")}
    if arm is base or arm.run is None or base.run is None:
        return out
    t_base, t_arm = time_interleaved(base.run, arm.run, repeats=repeats)
    rates = _rates(arm.row, t_arm)
    return {**out, "speedup": t_base.median_s / t_arm.median_s, "samples_per_s": rates["samples_per_s"],
            "mfu": rates["mfu"], "baseline_samples_per_s": _rates(base.row, t_base)["samples_per_s"],
            "median_s": t_arm.median_s, "baseline_median_s": t_base.median_s, "passes": t_arm.runs}


def ladder_rows(base: Arm, steps: Sequence[Step], device: torch.device, *,
                greedy: bool) -> list[dict[str, Any]]:
    """One JSON-ready row per measured stack: switches, numbers, decision and the device's why (lesson 08)."""
    rows = [{"name": "fp32 eager (baseline)", **dataclasses.asdict(base.stack), **base.row,
             "speedup": 1.0, "vs_below": None, "kept": True, "why": "the reference", "claim": "baseline"}]
    # speed-up over the baseline: the product of side-by-side ratios along the chain of stacks it was
    # added to (each pair timed in alternation), not a late timing over the baseline's early one
    speedup = {base.stack: 1.0}
    for s in steps:
        row: dict[str, Any] = {"name": s.rung.name, **dataclasses.asdict(s.stack), "claim": s.rung.claim}
        if s.arm is None:
            row.update(kept=False, why=s.note)
        elif s.decision is None:
            row.update(kept=True, why="already in the stack")
        else:
            # padding removed by the padding rung: what the fixed-width baseline computed in vain
            pad = s.rung.switch == "padding"
            removed = base.row["padded_fraction"] if pad else None
            left = s.arm.row["padded_fraction"] if pad else None
            speedup[s.stack] = speedup.get(s.base, float("nan")) * s.decision.ratio
            row.update(**s.arm.row, speedup=speedup[s.stack], vs_below=s.decision.ratio,
                       threshold=s.decision.threshold, kept=s.decision.keep if greedy else True,
                       why=explain(s.rung, s.decision, device, padded_removed=removed, padded_left=left))
        rows.append(row)
    return rows


def ladder_table(result: Mapping[str, Any]):
    """The ladder as a helpers.tables.Table (lesson 08, benchmark)."""
    from helpers.tables import Table

    greedy = result["mode"] == "greedy"
    table = Table(["rung", "samples/s", "tokens/s (real)", "speed-up", "vs stack below", "MFU (useful FLOPs)",
                   "peak memory GB", "padding", "IQR %", "first call s", "kept" if greedy else "check"])
    for r in result["rows"]:
        if "samples_per_s" not in r:
            table.add(r["name"], None, None, None, None, None, None, None, None, None, r["why"])
            continue
        mem = r["peak_memory_bytes"] / 1e9 if r.get("peak_memory_bytes") else None
        mfu = f"{100 * r['mfu']:.1f} %" if r.get("mfu") is not None else None
        last = ("yes" if r["kept"] else "no") if greedy else r.get("check_logits", "reference")
        table.add(r["name"], r["samples_per_s"], r["tokens_per_s"], f"{r['speedup']:.2f}x",
                  f"{r['vs_below']:.2f}x" if r["vs_below"] else "", mfu, mem,
                  f"{100 * r['padded_fraction']:.0f} %",
                  100 * r["pass_iqr_s"] / r["pass_median_s"], r["first_call_s"], last)
    return table


def to_markdown(result: Mapping[str, Any]) -> str:
    """The ladder as Markdown: stamp line, setup, table, the why of each rung, your stack (benchmark)."""
    s, u = result["stamp"], result["setup"]
    vers = ", ".join(f"{k} {s[k]}" for k in ("torch", "cuda", "transformers", "triton", "python") if s.get(k))
    yours = result["your_stack_vs_baseline"]
    lines = [
        f"Ladder ({result['mode']}) on **{s['device']}** ({vers}), {s['date']}, {s.get('threads')} threads, "
        f"load average {s.get('load_average_1min')}.",
        f"BERT `{u['model']}` shapes ({u['params'] / 1e6:.1f} M params, random weights), seq {u['seq_len']}, "
        f"batch {u['batch_size']}, {u['batches_per_pass']} batches per pass, {u['repeats']} timed passes per "
        f"stack; lengths: {u['lengths']}. Tokens/s count real tokens; MFU counts useful FLOPs (each "
        f"document's real tokens at its own length, no padding) against the {u['peak_source']}.",
        f"Greedy rule: {u['rule']}." if result["mode"] == "greedy" else "",
        *([f"Note: {s['note']}"] if s.get("note") else []),
        "",
        ladder_table(result).to_markdown(),
        "",
        *[f"- {r['name']}: {r['why']}" for r in result["rows"][1:]],
        "",
        f"Speed-up column: the product of the side-by-side ratios along the stacks each rung was added to. "
        f"Your stack (up to **{yours['name']}**), timed again in alternation with the fp32 eager baseline: "
        f"**{yours['speedup']:.2f}x**" + (f", MFU {100 * yours['mfu']:.1f} %." if yours.get("mfu") is not None
                                          else "."),
        "",
        "Your stack on this machine (the greedy rule's):" if result["mode"] == "greedy" else
        "The top of the ladder (every rung on; `--greedy` keeps only what pays):",
        "",
        "```python",
        result["your_stack_code"],
        "```",
        *_targets(result, yours),
    ]
    return "\n".join(lines)


def _targets(result: Mapping[str, Any], best: Mapping[str, Any]) -> list[str]:
    s, u = result["stamp"], result["setup"]
    t = f">= {TARGETS['speedup']:.0f}x and >= {100 * TARGETS['mfu']:.0f} % MFU"
    if s["device_type"] != "cuda" or u["model"] != "base" or u["seq_len"] != 512:
        return ["", f"(The targets, {t}, apply to BERT-base at seq 512 on an H100/H200-class GPU; this "
                    "run is not that.)"]
    sp, m = best["speedup"], best.get("mfu")
    out = ["", f"- Target speed-up >= {TARGETS['speedup']:.0f}x: {sp:.2f}x, "
               + ("met." if sp >= TARGETS["speedup"] else f"short by {TARGETS['speedup'] / sp:.2f}x.")]
    if m is None:
        out.append("- Target MFU: no peak known for this GPU, not computed.")
    else:
        out.append(f"- Target MFU >= {100 * TARGETS['mfu']:.0f} % (useful FLOPs, dense bf16 peak): "
                   f"{100 * m:.1f} %, " + ("met." if m >= TARGETS["mfu"]
                                           else f"short by {100 * (TARGETS['mfu'] - m):.1f} points."))
    return out
