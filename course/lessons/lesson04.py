"""Lesson 04 (`04_where_time_goes`): its sizes on this device, and the plumbing its cells call in one line
each: the roofs measured again, the checks (`check_...`: an AssertionError saying what is wrong, or one line
saying what was checked), the tables and figures, and the run's "too busy to judge" state (`Judge`).

Every timing verdict of the lesson goes through a `Judge`: a measurement that was too busy to judge
(`helpers.core.timing.busy`: its rounds disagree by half or more, or other programs took a quarter of the
CPUs)
says so, and from then on this run prints no verdict, only "too busy to judge".
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

from course.claims import CLAIMS
from course.exercises import last_outcome
from course.lessons import LessonSetup
from course.plots import label_axes, where_time_goes_chart
from course.predictions import Effect, Locked, effect, not_measured, score_predictions
from course.profile import get_profile, pick, small_config
from course.sizing import Size, fit_sizes
from course.verdicts import AtLeast, MeasuredTable, PairedRatio
from helpers.core.device import device_facts, get_device
from helpers.core.tables import Table
from helpers.core.timing import (
    TOO_BUSY_VERDICT,
    Busy,
    LoadProbe,
    Timing,
    benchmark_interleaved,
    busy,
    time_interleaved,
    time_once,
    timing_from,
)
from helpers.measure.flops import model_flops_per_token
from helpers.measure.memory import estimate_training_memory
from helpers.measure.opcount import OpCount, StepFn, count_ops, labelled_step
from helpers.measure.optime import call_cost, time_ops
from helpers.measure.regimes import (
    EXCESS,
    OPTIMISATION_TARGETS,
    ROOF_MARGIN,
    OpTable,
    check_flops,
    check_reconciled,
    check_regimes,
    classify_regime,
    measure_memory_roofs,
    measure_peak_flops,
    predicted_time,
)
from helpers.measure.roofline import Roofline, load_roofline, measure_roofline
from helpers.model.models import SmallTransformer, TransformerConfig, bert_config
from helpers.train.loop import make_optimizer

__all__ = ["SIZES", "setup", "Judge", "roofs_here", "call_cost_table", "check_counts",
           "check_placed_on_roofs", "random_batch", "small_transformer_step", "bert_step", "expected_flops",
           "check_step_flops",
           "check_profile", "check_step", "reading", "where_time_goes", "flops_are_not_time", "MATMUL_LIKE",
           "C16_RULE", "Sweep", "batch_sweep", "check_overhead", "decode_weights", "Decode", "time_decode",
           "check_decode", "gpu_idle_share", "replay_speedup", "KINDS", "OpKinds", "bf16_units", "predicted",
           "OPTIMISATIONS", "Effects", "time_arms", "check_against_model", "score_table",
           "reconciliation_table", "summary"]

SIZES = {"BATCHES_MAX": Size(full=64, smoke=16, floor=4),  # the batch sweep: 1, 2, 4, ... up to this
         "BATCH": Size(full=16, smoke=4, floor=2),  # sequences per training step (small Transformer)
         "SEQ": Size(full=512, smoke=32, floor=128),  # tokens per sequence
         "BERT_BATCH": Size(full=16, smoke=4, floor=2),
         "BERT_SEQ": Size(full=512, smoke=64, floor=128)}
SHRINK = ["BATCHES_MAX", "BERT_BATCH", "BATCH", "BERT_SEQ", "SEQ"]
MATMUL_LIKE = ("matmul", "attention")  # the op classes the claim C16 is about
C16_RULE = CLAIMS["matmul-time"].rule  # docs/claims.md#c16: matmuls + attention take >= 90 % of the time


def _small_peak(model: SmallTransformer, batch: int, seq: int) -> int:
    """One fp32 training step of the small Transformer, estimated, bytes."""
    return estimate_training_memory(model, batch, seq).peak


def _shapes(profile: str, vocab: int, bert_size: str,
            dropout: float) -> tuple[SmallTransformer, SmallTransformer]:
    """The small Transformer's and BERT's shapes on the meta device (nothing allocated), for the estimates."""
    hf = bert_config(bert_size, 2)  # BERT's shapes, described to the estimator as a Transformer of that shape
    with torch.device("meta"):
        small = SmallTransformer(small_config(profile, vocab_size=vocab, dropout=dropout))
        bert = SmallTransformer(TransformerConfig(
            vocab_size=hf.vocab_size, max_len=hf.max_position_embeddings, d_model=hf.hidden_size,
            n_heads=hf.num_attention_heads, n_layers=hf.num_hidden_layers, d_ff=hf.intermediate_size,
            dropout=dropout, n_classes=2))
    return small, bert


def setup(profile: str | None = None, *, dropout: float = 0.1) -> LessonSetup:
    """Lesson 04's sizes on this device; prints what it chose and why (lesson 04)."""
    profile = get_profile(profile)
    device = get_device()
    vocab = pick(profile, smoke=2048, full=30522)  # vocabulary: the token head is vocab x d_model
    bert_size = pick(profile, smoke="tiny", full="base")  # BERT's shapes (helpers.model.models.MODEL_SIZES)
    small, bert = _shapes(profile, vocab, bert_size, dropout)
    # fp32 weights, gradients and AdamW's moments of a model whose step closure the lesson keeps alive
    small_states, bert_states = 16 * small.num_params(), 16 * bert.num_params()
    estimates = {
        "profiling the small Transformer": lambda s: _small_peak(small, s["BATCH"], s["SEQ"]),
        "profiling BERT, beside the small model": lambda s: small_states + estimate_training_memory(
            bert, s["BERT_BATCH"], s["BERT_SEQ"]).peak,
        # every batch size's model and optimizer stay alive (plus the two profiled), one step runs at a time
        "the batch sweep: a model per batch size": lambda s: (
            (s["BATCHES_MAX"].bit_length() + 1) * small_states + bert_states
            + _small_peak(small, s["BATCHES_MAX"], s["SEQ"])),
    }
    fit = fit_sizes(SIZES, estimates, shrink=SHRINK, profile=profile, device=device, precision="fp32")
    print(fit.line())
    profile = fit.profile
    # The toy ops are sized to sit clearly in their regime on this kind of device: a GPU launches each op for
    # a few µs, so only larger ops leave the overhead regime there (and its L2 cache holds tens of MB)
    on_gpu = device.type == "cuda"
    return LessonSetup(
        PROFILE=profile, DEVICE=device, FIT=fit, VOCAB=vocab, BERT_SIZE=bert_size, DROPOUT=dropout,
        **fit.sizes,
        BATCHES=[2 ** i for i in range(fit["BATCHES_MAX"].bit_length())],  # the sweep: 1, 2, 4, ...
        PROFILE_STEPS=pick(profile, smoke=2, full=5),  # training steps recorded by torch.profiler per table
        SWEEP_ROUNDS=pick(profile, smoke=5, full=10),  # timed steps per batch size in the sweep
        MIN_RUN_TIME=pick(profile, smoke=0.2, full=1.0),  # seconds of timed runs per measurement
        MATMUL_N=2048 if on_gpu else pick(profile, smoke=256, full=1024),  # compute-bound: an n³ matmul
        BIG_ELEMENTS=2**26 if on_gpu else pick(profile, smoke=2**22, full=2**24),  # memory-bound: past caches
        COMPILE_ALL=pick(profile, smoke=False, full=True))  # False: compile only the memory-bound chain


# --- too busy to judge: one state for the whole run ---------------------------------------------------------

class Judge:
    """This run's "too busy to judge" state (lesson 04): each timing verdict shows it the measurement's
    `helpers.core.timing.Busy`; once one was too busy, no later verdict prints, only "too busy to judge"."""

    def __init__(self) -> None:
        self.first: tuple[str, Busy] | None = None  # the first measurement found too busy, and why

    def see(self, what: str, state: Busy) -> bool:
        """Record the state of the measurement `what`; True while verdicts may be drawn. The first time a
        measurement is too busy it says so, once."""
        if not isinstance(state, Busy):
            raise ValueError(f"state must be a helpers.core.timing.Busy (helpers.core.timing.busy(...)), got "
                             f"{state!r}")
        if state.too_busy and self.first is None:
            self.first = (what, state)
            print(f"{what}: {state}. From here on this run judges nothing: close other programs and rerun.")
        return self.first is None

    @property
    def too_busy(self) -> bool:
        """Whether this run has found the machine too busy to judge."""
        return self.first is not None

    @property
    def state(self) -> Busy | None:
        """The first too-busy state (for `MeasuredTable.add(busy=...)`), None while none was."""
        return self.first[1] if self.first is not None else None

    def said(self, what: str) -> str:
        """The line a verdict prints instead: too busy to judge, and since when."""
        since = self.first[0] if self.first is not None else "?"
        return f"{what}: {TOO_BUSY_VERDICT} (this run found the machine too busy at: {since})"


def _load_busy(probe: LoadProbe, *spreads: float) -> Busy:
    """The course's rule over relative spreads and what other programs took of the CPUs meanwhile."""
    return busy(*[s for s in spreads if s is not None], load=probe.read())


# --- section 1: the roofs -----------------------------------------------------------------------------------

def roofs_here(device: torch.device, profile: str, min_run_time: float, judge: Judge, *,
               cache_bytes: int | None) -> tuple[Roofline, Roofline]:
    """Lesson 00's roofline measured again in this session, the higher of the two kept, and the memory roofs
    by working set; the roofline's bandwidth is the memory roof beyond the caches. Prints where they come from
    (lesson 04)."""
    saved = load_roofline()
    with LoadProbe() as probe:
        size = saved.matmul_size if saved is not None else pick(profile, smoke=512, full=8192)
        copy_mb = max(pick(profile, smoke=64, full=1024), -(-(cache_bytes or 0) // 2**20))  # past the caches
        now = measure_roofline(device, precisions=["fp32"], matmul_size=size, copy_mb=copy_mb,
                               min_run_time=min_run_time)
        gpu = device.type == "cuda"
        sizes = (128, 256, 512) + ((size,) if gpu or size <= 1024 else ())  # a CPU's 8192³: a minute
        peak_now = max(now.matmul_flops["fp32"], measure_peak_flops(device, sizes=sizes))
        flops = {"fp32": peak_now}
        copy = now.bandwidth
        if saved is not None and "fp32" in saved.matmul_flops:
            flops = {**saved.matmul_flops, "fp32": max(saved.matmul_flops["fp32"], peak_now)}
            copy = max(saved.bandwidth, now.bandwidth)
        copied = Roofline(now.device_name, flops, copy, size, now.copy_bytes)
        memory = measure_memory_roofs(device, copied, cache_bytes=cache_bytes, min_run_time=min_run_time / 10)
    roof = Roofline(now.device_name, flops, memory.bandwidth, size, now.copy_bytes)
    had = saved is not None and "fp32" in saved.matmul_flops
    source = "the higher of lesson 00's and this session's" if had else "this session's (no lesson 00 roof)"
    print(f"roofline of {roof.device_name}: {source}; memory roof beyond the caches: the fastest of "
          f"{len(memory.by_pattern[-1]) if memory.by_pattern else 1} access patterns")
    judge.see("measuring the roofs", busy(load=probe.load))
    return roof, memory


def call_cost_table(costs: Mapping[str, float], overhead_s: float) -> Table:
    """The fixed cost of one call of each op class, in µs and in one-element adds (lesson 04)."""
    t = Table(["op class", "one call, µs", "x a one-element add"],
              title="What one call costs before its work (the smallest call of each class)")
    for cls, s in sorted(costs.items(), key=lambda kv: kv[1]):
        t.add(cls, s * 1e6, s / overhead_s)
    return t


# --- section 2: one op counted, then timed ------------------------------------------------------------------

def check_counts(mm: OpCount, gelu: OpCount, x: torch.Tensor, w: torch.Tensor, h: torch.Tensor) -> None:
    """The matmul's and GELU's counts against the hand formulas (exact: counts of elements) (lesson 04)."""
    tokens, d = x.shape
    expected = {"x @ w FLOPs (2·tokens·d·4d)": (mm.flops, 2 * tokens * d * w.shape[1]),
                "x @ w bytes (x, w and h, each once)": (mm.bytes, x.nbytes + w.nbytes + h.nbytes),
                "GELU FLOPs (one per element written)": (gelu.flops, h.numel()),
                "GELU bytes (h read, its output written)": (gelu.bytes, 2 * h.nbytes)}
    wrong = [f"{k}: counted {got:,.0f}, by hand {want:,.0f}"
             for k, (got, want) in expected.items() if got != want]
    assert not wrong, "the counts disagree with the formulas: " + "; ".join(wrong)
    print("checked: both ops' FLOPs and bytes are the hand formulas, exactly")


def check_placed_on_roofs(placed: Sequence[tuple[str, float, float]]) -> None:
    """No op ran faster than its roof allows, beyond `ROOF_MARGIN` (lesson 04): `placed` holds (op, roof
    seconds, measured seconds), as section 2's loop computes them; a count too high or a roof too low
    would."""
    fast = [f"{name} ran {roof_s / measured_s:.1f}x faster than its roof (margin {ROOF_MARGIN:g}x): are its "
            "FLOPs and bytes counted right, the roofs measured in the right unit?"
            for name, roof_s, measured_s in placed if measured_s < roof_s / ROOF_MARGIN]
    assert not fast, "; ".join(fast)
    print(f"checked: no op ran faster than its roof allows (margin {ROOF_MARGIN:g}x, section 8)")


# --- section 4: a training step, op by op -------------------------------------------------------------------

def random_batch(S: LessonSetup, batch_size: int, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random token ids and labels of `S.SEQ` tokens on `S.DEVICE`: their values do not change the time, only
    the sizes do (lesson 04)."""
    gen = torch.Generator().manual_seed(seed)
    ids, labels = (torch.randint(0, S.VOCAB, (batch_size, S.SEQ), generator=gen) for _ in range(2))
    return {"input_ids": ids.to(S.DEVICE), "labels": labels.to(S.DEVICE)}


def small_transformer_step(S: LessonSetup, batch_size: int, *,
                           seed: int = 0) -> tuple[SmallTransformer, StepFn]:
    """The small Transformer (`S`'s sizes) and its labelled training step on a random batch of `batch_size`
    sequences, with fused AdamW as helpers.train.loop builds it (lesson 04)."""
    cfg = small_config(S.PROFILE, vocab_size=S.VOCAB, dropout=S.DROPOUT)
    model = SmallTransformer(cfg).to(S.DEVICE)
    opt = make_optimizer(model, lr=1e-3, weight_decay=0.01)
    return model, labelled_step(model, random_batch(S, batch_size, seed=seed), opt)


def bert_step(S: LessonSetup, *, seed: int = 0) -> tuple[torch.nn.Module, StepFn, int]:
    """BERT of `S.BERT_SIZE` with random weights (the speed does not depend on them), SDPA attention, dropout
    as `S.DROPOUT`, and its labelled training step; and the biases its head adds once per sequence
    (lesson 04)."""
    from transformers import AutoModelForSequenceClassification

    cfg = bert_config(S.BERT_SIZE, 2)
    cfg.hidden_dropout_prob = cfg.attention_probs_dropout_prob = S.DROPOUT
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(cfg, attn_implementation="sdpa")
    model = model.to(S.DEVICE).train()
    gen = torch.Generator().manual_seed(seed)
    batch = {"input_ids": torch.randint(0, cfg.vocab_size, (S.BERT_BATCH, S.BERT_SEQ), generator=gen),
             "attention_mask": torch.ones(S.BERT_BATCH, S.BERT_SEQ, dtype=torch.long),
             "labels": torch.randint(0, 2, (S.BERT_BATCH,), generator=gen)}
    batch = {k: v.to(S.DEVICE) for k, v in batch.items()}
    step = labelled_step(model, batch, make_optimizer(model, lr=1e-3, weight_decay=0.01))
    head_biases = model.bert.pooler.dense.bias.numel() + model.classifier.bias.numel()
    return model, step, head_biases


def expected_flops(model: torch.nn.Module, table: OpTable, batch_size: int, seq: int,
                   per_sequence_biases: int = 0) -> float:
    """The course's FLOP formula for one step (helpers.measure.flops, lesson 02), less 6 FLOPs per bias per
    token
    (FlopCounterMode does not count bias adds; a classifier head's biases per sequence), plus the Q·Kᵀ a fused
    attention kernel computes again in its backward (lesson 04)."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    per_token_biases = sum(m.bias.numel() for m in linears if m.bias is not None) - per_sequence_biases
    per_token = model_flops_per_token(model, seq) - 6 * per_token_biases
    flops = per_token * batch_size * seq - 6 * per_sequence_biases * batch_size
    if any(r.op_class == "attention" for r in table.rows):
        # a fused attention kernel does not store the T x T scores: its backward computes Q·Kᵀ again,
        # 2·T·T·head_dim more FLOPs per head, layer and sequence
        c = getattr(model, "cfg", None) or model.config
        layers = getattr(c, "n_layers", None) or c.num_hidden_layers
        heads = getattr(c, "n_heads", None) or c.num_attention_heads
        width = getattr(c, "d_model", None) or c.hidden_size
        flops += layers * batch_size * heads * 2 * seq * seq * (width // heads)
    return flops


def check_step_flops(model: torch.nn.Module, table: OpTable, batch_size: int, seq: int, *,
                     per_sequence_biases: int = 0) -> None:
    """FlopCounterMode's FLOPs of the step equal the course's formula, and every row is sound: counts and
    times >= 0, a known regime, no op faster than its roof beyond ROOF_MARGIN (`check_regimes`)
    (lesson 04)."""
    problems = check_flops(table, expected_flops(model, table, batch_size, seq, per_sequence_biases))
    problems += check_regimes(table)
    assert not problems, problems
    flops = sum(r.flops for r in table.rows)
    share = sum(r.flops for r in table.rows if r.op_class in MATMUL_LIKE) / flops
    print(f"checked: {flops:.4g} FLOPs per step, the course's formula exactly ({share:.1%} in matmuls and "
          f"attention); no op faster than its roof (margin {ROOF_MARGIN:g}x)")


def check_profile(table: OpTable, name: str, judge: Judge) -> None:
    """The profile accounts for the plain step timed beside it, once the profiler's own events are taken out
    (`check_reconciled`); too busy to judge: said, not judged (lesson 04)."""
    print(f"{name}: {table.unprofiled_s * 1e3:.2f} ms a step; profiled {table.wall_s * 1e3:.2f} ms, of which "
          f"{table.profiler_cost_s * 1e3:.2f} ms are the profiler's own events")
    if table.untimed:
        print(f"  counted but not recorded by the profiler: {'; '.join(table.untimed)}")
    if not judge.see(f"profiling the {name}", table.busy):
        print(judge.said(f"  {name}: does the profile account for the step"))
        return
    problems = check_reconciled(table)
    assert not problems, problems
    print(f"checked: the profile less the profiler's events is {table.reconciled_ratio:.2f}x the plain step "
          f"(rule: within {0.25 + table.noise:.0%}, section 8)")


def check_step(table: OpTable, model: torch.nn.Module, batch_size: int, seq: int, judge: Judge, *, name: str,
               per_sequence_biases: int = 0) -> None:
    """A profiled step's checks, in one line: its profile accounts for the plain step (`check_profile`) and
    its FLOPs are the course's formula, its rows sound (`check_step_flops`) (lesson 04)."""
    check_profile(table, name, judge)
    check_step_flops(model, table, batch_size, seq, per_sequence_biases=per_sequence_biases)


def reading(table: OpTable, judge: Judge, *, top: int = 6) -> None:
    """One line per op class, slowest first: its regime, share of the step and of the FLOPs, and where its
    time went (lesson 04)."""
    if judge.too_busy:
        print(judge.said("which class took the time"))
        return
    total, flops = table.total_s, sum(r.flops for r in table.rows) or 1.0
    for r in table.by_class().rows[:top]:
        parts = {k: v / max(r.time_s, 1e-12) for k, v in r.split(table.synchronous).items()}
        print(f"  {r.label}: {r.regime}-bound, {r.time_s / total:.0%} of the step for {r.flops / flops:.1%} "
              f"of the FLOPs; {r.roof_fraction:.0%} of its roof; its time: {parts['roof']:.0%} at its roof, "
              f"{parts['overhead']:.0%} its calls, {parts[EXCESS]:.0%} below its roof")


# --- section 5: the step's time by cause --------------------------------------------------------------------

def where_time_goes(tables: Mapping[str, OpTable], roof: Roofline, judge: Judge) -> Table | None:
    """The picture (ops on the roofline; each step by cause) and the table of each step's shares by cause,
    or "too busy to judge" (lesson 04)."""
    if judge.too_busy:
        print(judge.said("where each step's time went"))
        return None
    first_two = dict(list(tables.items())[:2])
    where_time_goes_chart(roof, {n: t.points() for n, t in first_two.items()},
                          {n: t.causes() for n, t in tables.items()},
                          title=f"Where one step's time goes ({roof.device_name})")
    kinds = ("compute", "memory", "overhead", EXCESS)
    t = Table(["step", *[f"{k} %" for k in kinds], "labelled memory-bound %", "step ms"],
              title="One step by cause (and the share labelled memory-bound, for comparison)")
    for name, table in tables.items():
        s, by_label = table.shares(), table.shares(by="regime")
        t.add(name, *[100 * s[k] for k in kinds], 100 * by_label["memory"], table.unprofiled_s * 1e3)
    return t


def flops_are_not_time(shares: Mapping[str, tuple[float, float]], judge: Judge) -> Table | None:
    """Claim C16's verdict on each step's (share of the FLOPs, share of the time) of matmuls and attention,
    as section 5's cell computes them, or "too busy to judge" (lesson 04)."""
    if judge.too_busy:
        print(judge.said("C16, matmuls are where the time goes"))
        return None
    t = Table(["step", "matmul + attention share of FLOPs", "their share of the time", "C16 verdict"],
              title="FLOPs are not time")
    for name, (flop_share, time_share) in shares.items():
        t.add(name, f"{flop_share:.1%}", f"{time_share:.1%}", C16_RULE.verdict(time_share))
    return t


# --- section 6: small batches, one token at a time ----------------------------------------------------------

@dataclass(frozen=True)
class Sweep:
    """A step timed at several batch sizes in rotating rounds: each size's median and IQR (lesson 04). The
    line time = fixed + per-sample x batch through the medians is fitted in the lesson's cell."""

    timings: dict[int, Timing]  # batch size -> its rounds (median, IQR)
    steps: dict[int, StepFn]
    others: float | None = None  # share of the CPUs other programs took meanwhile

    @property
    def batches(self) -> list[int]:
        return sorted(self.timings)

    @property
    def noise(self) -> float:
        """The larger relative spread (IQR / median) of the smallest and the largest batch."""
        ends = (self.batches[0], self.batches[-1])
        return max(self.timings[b].iqr_s / self.timings[b].median_s for b in ends)

    @property
    def busy(self) -> Busy:
        return busy(self.noise, load=self.others)

    @property
    def per_sample_ratio(self) -> float:
        """Time per sample at the smallest batch over that at the largest."""
        lo, hi = self.batches[0], self.batches[-1]
        return (self.timings[lo].median_s / lo) / (self.timings[hi].median_s / hi)

    def table(self) -> Table:
        t = Table(["batch", "ms per step", "ms per sample", "IQR %"],
                  title="The small Transformer's step vs batch")
        for b in self.batches:
            m = self.timings[b]
            t.add(b, m.median_s * 1e3, m.median_s * 1e3 / b, 100 * m.iqr_s / m.median_s)
        return t

    def chart(self, fixed: float, per_sample: float, title: str = "Step time vs batch") -> Figure:
        """Measured medians, the fitted line (`fixed` + `per_sample` x batch, seconds), and a line
        proportional to the batch, log-log."""
        import matplotlib.pyplot as plt

        b = self.batches
        ms = [self.timings[x].median_s * 1e3 for x in b]
        per = per_sample
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        ax.loglog(b, ms, "o-", label="measured step (median of the rounds)")
        line = [(x, (fixed + per * x) * 1e3) for x in b if fixed + per * x > 0]
        if line:
            ax.loglog(*zip(*line), "--", label="fixed + per-sample fit")
        ax.loglog(b, [ms[-1] * x / b[-1] for x in b], ":", color="gray", label="proportional to the batch")
        if fixed > 0:
            ax.axhline(fixed * 1e3, color="tab:gray", lw=0.8, label=f"fixed part, {fixed * 1e3:.2f} ms")
        ax.legend(fontsize=8)
        label_axes(ax, title, "batch [sequences]", "time per step [ms]")
        return fig

    def _repr_markdown_(self) -> str:
        return self.table().to_markdown()


def batch_sweep(step_of: Callable[[int], StepFn], batches: Sequence[int], rounds: int, judge: Judge) -> Sweep:
    """Time `step_of(b)` for every batch size once per round, in an order that rotates from round to round, so
    that a change of the machine's load falls on all of them alike (lesson 04)."""
    steps = {b: step_of(b) for b in batches}

    def plain(name: str) -> contextlib.nullcontext:  # the step run without the profiler's labels
        return contextlib.nullcontext()
    with LoadProbe() as probe:
        for b in batches:  # warm-up: a new model's first steps pay one-off costs (kernels, AdamW's state)
            for _ in range(3):
                steps[b](plain)
        times: dict[int, list[float]] = {b: [] for b in batches}
        for r in range(rounds):
            for b in list(batches[r % len(batches):]) + list(batches[:r % len(batches)]):
                times[b].append(time_once(lambda: steps[b](plain))[1])
    sweep = Sweep({b: timing_from(times[b], f"batch {b}") for b in batches}, steps, probe.load.others)
    print(f"{len(batches)} batch sizes, {rounds} rounds each; a sample at batch {batches[0]} costs "
          f"{sweep.per_sample_ratio:.1f}x one at batch {batches[-1]} (rounds spread {sweep.noise:.0%})")
    judge.see("the batch sweep", sweep.busy)
    return sweep


def check_overhead(sweep: Sweep, fixed: float, fixed_work: float, tiny: OpTable, judge: Judge) -> None:
    """Two measures of overhead agree: the sweep's fixed part (`fixed`, seconds: section 6's fit) less the
    work that does not grow with the batch, and the op table's overhead at the smallest batch, within 3x
    widened by the rounds' spread; or too busy to judge (lesson 04)."""
    overhead = tiny.overhead_total_s()
    agree = (fixed - fixed_work) / overhead
    print(f"the sweep's fixed part {fixed * 1e3:.2f} ms = {fixed_work * 1e3:.2f} ms of work that does not "
          f"grow with the batch + {(fixed - fixed_work) * 1e3:.2f} ms; the op table's overhead at batch "
          f"{sweep.batches[0]}: {overhead * 1e3:.2f} ms")
    state = busy(sweep.noise, tiny.noise, load=max(filter(None, (sweep.others, tiny.others)), default=None))
    if not judge.see("comparing the two measures of overhead", state):
        print(judge.said("do the two measures of overhead agree"))
        return
    limit = 3 * (1 + sweep.noise)  # the rule: within a factor of 3, widened by the rounds' spread
    assert 1 / limit <= agree <= limit, (
        f"the fixed part less the fixed work ({(fixed - fixed_work) * 1e3:.2f} ms) is {agree:.2f}x the "
        f"overhead the op table counts ({overhead * 1e3:.2f} ms; rule: within {limit:.2f}x): is the per-call "
        "cost, the call count or the time between ops wrong?")
    print(f"checked: the two measures of overhead agree ({agree:.2f}x; rule: within {limit:.2f}x)")


def decode_weights(width: int, cache_bytes: int | None, device: torch.device, seed: int = 0) -> torch.Tensor:
    """A stack of square fp32 layers (layers, width, width) at least 1.25x the last-level cache (4 layers at
    least; 8 on a GPU), random values scaled to keep activations bounded (lesson 04)."""
    layer_bytes = width * width * 4
    least = 8 if device.type == "cuda" else 4
    layers = max(least, -(-int(1.25 * (cache_bytes or 32 * 2**20)) // layer_bytes))
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.empty(layers, width, width, device=device).uniform_(-width ** -0.5, width ** -0.5,
                                                                    generator=gen)


@dataclass(frozen=True)
class Decode:
    """One token through a stack of layers against several at once, timed in interleaved pairs (lesson 04)."""

    one: Timing
    batch: Timing
    tokens: int  # in the batch arm
    ratio: PairedRatio  # batch / one, pair by pair
    others: float | None = None

    @property
    def busy(self) -> Busy:
        return busy(self.ratio.spread, load=self.others)


def time_decode(decode: Callable[[torch.Tensor], torch.Tensor], one: torch.Tensor, several: torch.Tensor, *,
                repeats: int = 7) -> Decode:
    """Time `decode` on one token and on `several`, in interleaved pairs, after a warm-up (lesson 04)."""
    decode(one), decode(several)  # warm-up
    with LoadProbe() as probe:
        t1, tb = time_interleaved(lambda: decode(one), lambda: decode(several), repeats=repeats,
                                  device=one.device)
    return Decode(t1, tb, several.shape[0], PairedRatio.of(tb.times_s, t1.times_s), probe.load.others)


def check_decode(d: Decode, roof_s: float, judge: Judge) -> None:
    """One token runs no faster than its weights at the memory roof allow (`roof_s`, the roof rule), and the
    batch costs less than half of `tokens` times one token, because it shares one read of the weights; or
    too busy to judge (lesson 04)."""
    assert d.one.median_s >= roof_s / ROOF_MARGIN, (
        f"one token ran {roof_s / d.one.median_s:.1f}x faster than its weights at the memory roof allow "
        f"(margin {ROOF_MARGIN:g}x): is the memory roof in the right unit?")
    if not judge.see("the decode step", d.busy):
        print(judge.said(f"do {d.tokens} tokens share one read of the weights"))
        return
    assert d.ratio.median < d.tokens / 2, (
        f"{d.tokens} tokens cost {d.ratio.median:.2f}x one token on a quiet machine, where sharing one read "
        f"of the weights costs at most {d.tokens / 2:g}x: is each token reading the weights again "
        "(weights read per token)?")
    print(f"checked: {d.tokens} tokens cost {d.ratio.median:.2f}x one token, less than {d.tokens / 2:g}x: "
          "they share one read of the weights")


def gpu_idle_share(step: StepFn, device: torch.device, steps: int) -> float:
    """The share of a plain step the GPU sat idle: 1 - the time some kernel ran (under the profiler, which
    does not slow kernels) / the step timed without the profiler; prints what it found (lesson 04)."""
    trace = time_ops(step, device=device, steps=steps)
    idle = max(1 - trace.busy_s / trace.unprofiled_s, 0.0)
    print(f"{trace.kernels:.0f} kernels per step, busy {trace.busy_s * 1e3:.2f} ms of a "
          f"{trace.unprofiled_s * 1e3:.2f} ms step: idle {idle:.0%} of it, waiting for launches")
    return idle


def replay_speedup(eager: Callable[[], Any], replay: Callable[[], Any], min_run_time: float) -> Effect:
    """An eager step against its CUDA graph's replay, timed in rotating rounds, with the noise of both;
    prints it (lesson 04)."""
    arms = benchmark_interleaved({"eager step": eager, "CUDA graph replay": replay}, rounds=3, warmup=3,
                                 min_run_time=min_run_time)
    e = effect(arms["eager step"], arms["CUDA graph replay"])
    eager_ms, replay_ms = arms["eager step"].median_ms, arms["CUDA graph replay"].median_ms
    print(f"eager {eager_ms:.3f} ms, graph replay {replay_ms:.3f} ms: {e.speedup:.2f}x "
          f"({'beyond' if e.helps else 'within'} the noise of {e.noise:.0%})")
    return e


# --- section 7: predict, then measure -----------------------------------------------------------------------

KINDS = ("compute-bound", "memory-bound", "overhead-bound")


def _chain(t: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """LayerNorm -> GELU -> residual add: three passes over `t` and its intermediates when run op by op."""
    return F.gelu(F.layer_norm(t, t.shape[-1:], weight, bias)) + t


@dataclass(frozen=True)
class OpKinds:
    """The three ops of predict-then-measure, each built to sit in one regime on this machine (lesson 04):
    an n x n matmul; LayerNorm -> GELU -> add on a tensor beyond the last-level cache; the same on TINY x
    TINY."""

    matmul_n: int
    big_elements: int  # fp32 elements of the memory-bound tensor
    width: int  # its rows' width
    tiny: int
    device: torch.device

    @classmethod
    def of(cls, S: LessonSetup, tiny: int, width: int, cache_bytes: int | None) -> OpKinds:
        """From the lesson's sizes: each op of the memory-bound chain reads and writes the cache or more."""
        return cls(S.MATMUL_N, max(S.BIG_ELEMENTS, (cache_bytes or 0) // 2 // 4), width, tiny, S.DEVICE)

    def inputs(self, kind: str, rows_scale: int = 1) -> tuple[Callable[..., torch.Tensor], tuple]:
        """The op of `kind` and its inputs; `rows_scale` multiplies the rows (the "bigger batch" arm)."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        dev = self.device
        if kind == "compute-bound":
            n = self.matmul_n
            return (lambda a, b: a @ b), (torch.randn(n * rows_scale, n, device=dev),
                                          torch.randn(n, n, device=dev))
        width = self.width if kind == "memory-bound" else self.tiny
        rows = (self.big_elements // width if kind == "memory-bound" else self.tiny) * rows_scale
        return _chain, (torch.randn(rows, width, device=dev), torch.ones(width, device=dev),
                        torch.zeros(width, device=dev))


def bf16_units(device: torch.device) -> str:
    """Which bf16 matrix units this machine has: bf16's arm depends on them (lesson 04)."""
    facts = device_facts(device)
    if facts["type"] == "cuda":
        return f"{facts['name']}: bf16 tensor cores {'yes' if facts['cap'] >= (8, 0) else 'no'}"
    return (f"this CPU ({facts['cpu_capability']}): AMX bf16 tiles {'yes' if facts['amx'] else 'no'}, "
            f"AVX512-BF16 {'yes' if facts['avx512_bf16'] else 'no'}")


def predicted(kinds: OpKinds, predict: Callable[..., tuple[str, float]] | None, peak: float,
              memory_roofs: Roofline, call_costs: Mapping[str, float], synchronous: bool
              ) -> tuple[dict[str, tuple[str, float]], Table]:
    """Each op's counts, and its regime and time by `predict`, the learner's predict_time, once it has passed
    its check (exercise 04-predict-time); until then by the course's model. The calls are priced by their
    classes; prints which predicted (lesson 04)."""
    checked = last_outcome("04-predict-time")
    if checked is None or checked.status != "passed":
        predict = None
    print("predicted by " + ("your predict_time (it passed its check)" if predict is not None else
                             "the course's model: your predict_time has not passed its check yet"))
    model, t = {}, Table(["op kind", "FLOPs", "bytes", "calls", "working set MiB", "memory roof GB/s",
                          "one call µs", "predicted regime", "predicted µs"],
                         title="The three ops, counted, before any timing")
    for kind in KINDS:
        fn, args = kinds.inputs(kind)
        cs = list(count_ops(lambda phase, fn=fn, args=args: fn(*args), warmup=0).values())
        flops, nbytes, calls = sum(c.flops for c in cs), sum(c.bytes for c in cs), sum(c.calls for c in cs)
        largest = max(c.bytes / c.calls for c in cs if c.calls)
        bw = memory_roofs.bandwidth_for(largest)
        per_call = sum(c.calls * call_cost(call_costs, c.op, c.phase) for c in cs) / calls  # their mean price
        if predict is not None:
            regime, seconds = predict(flops, nbytes, calls, peak, bw, per_call, synchronous)
        else:
            regime = classify_regime(flops, nbytes, calls, peak_flops=peak, bandwidth=bw, overhead_s=per_call)
            seconds = predicted_time(flops, nbytes, calls, peak_flops=peak, bandwidth=bw, overhead_s=per_call,
                                     synchronous=synchronous)
        model[kind] = (regime, seconds)
        t.add(kind, flops, nbytes, calls, largest / 2**20, bw / 1e9, per_call * 1e6, regime, seconds * 1e6)
    return model, t


OPTIMISATIONS = ("bf16", "compile", "bigger batch", "CUDA graphs")  # section 7's arms, in the table's order


@dataclass
class Effects:
    """What each optimisation did to each kind of op, measured (lesson 04)."""

    effects: dict[str, dict[str, Effect]] = field(default_factory=dict)  # kind -> optimisation -> Effect
    base_s: dict[str, float] = field(default_factory=dict)  # kind -> fp32 eager seconds per call
    compile_s: dict[str, float] = field(default_factory=dict)  # kind -> first compiled call, compiling in
    others: float | None = None

    @property
    def busy(self) -> Busy:
        noise = [e.noise for row in self.effects.values() for e in row.values() if e.speedup is not None]
        return busy(*noise, load=self.others)


def _why_not(optimisation: str, device: torch.device) -> str:
    if optimisation == "CUDA graphs" and device.type != "cuda":
        return "needs a CUDA GPU"
    if optimisation == "compile":
        return "not compiled in the smoke profile (COMPILE_ALL = False)"
    return "not measured"


def time_arms(effects: Effects, kind: str, base: Callable[[], Any], arms: Mapping[str, Callable[[], Any]], *,
              work: Mapping[str, float], device: torch.device, min_run_time: float) -> None:
    """Time each arm beside `base`, the op in fp32 eager, and record its speed-up per unit of work (`work`:
    an arm's work / the base's) in `effects` (lesson 04): ops of a tenth of a second or more as single calls
    alternating (ab, ba, ...), smaller ones in rotating rounds of `min_run_time`. Arms not in `arms` are
    recorded as not measured, with the reason. Prints the fp32 time."""
    row: dict[str, Effect] = {}
    for name in OPTIMISATIONS:
        if name not in arms:
            row[name] = not_measured(_why_not(name, device))
            continue
        if kind == "memory-bound":  # ops of a tenth of a second: single calls, alternating, one warm-up each
            base(), arms[name]()
            base_t, variant_t = time_interleaved(base, arms[name], repeats=3, device=device)
        else:
            timed = benchmark_interleaved({"base": base, "variant": arms[name]}, rounds=3, warmup=2,
                                          min_run_time=min_run_time)
            base_t, variant_t = timed["base"], timed["variant"]
        row[name] = effect(base_t, variant_t, work_ratio=work.get(name, 1.0))
        effects.base_s.setdefault(kind, base_t.median_s)
    effects.effects[kind] = row
    print(f"{kind}: fp32 eager {effects.base_s[kind] * 1e6:,.1f} µs; "
          + ", ".join(f"{o} {e.speedup:.2f}x" for o, e in row.items() if e.speedup is not None)
          + (f"; first compiled call {effects.compile_s[kind]:.1f} s" if kind in effects.compile_s else ""))


def check_against_model(effects: Effects, model: Mapping[str, tuple[str, float]], judge: Judge) -> None:
    """Each op's fp32 time is no faster than its model allows (the least time its counts give), beyond
    `ROOF_MARGIN`: counts too high would make it so; or too busy to judge: on a busy machine the calls'
    measured cost, part of the model, is inflated by other programs (lesson 04)."""
    if not judge.see("predict, then measure", effects.busy):
        print(judge.said("is each op as fast as its counts allow"))
        return
    fast = [f"{k}: {s * 1e6:.1f} µs measured, {model[k][1] / s:.1f}x faster than its model "
            f"({model[k][1] * 1e6:.1f} µs, {model[k][0]}): are its counts right?"
            for k, s in effects.base_s.items() if s < model[k][1] / ROOF_MARGIN]
    assert not fast, "; ".join(fast)
    took = ", ".join(f"{k} {s / model[k][1]:.1f}x" for k, s in effects.base_s.items())
    print(f"checked: each op took {took} its model's time: none faster than its model allows "
          f"(margin {ROOF_MARGIN:g}x)")


def score_table(locked: Locked, effects: Effects, measured_at: float, judge: Judge) -> Table:
    """Each kind's measured speed-ups, what helped most, what it targets on paper, the learner's prediction
    and its verdict; "too busy to judge" in place of the verdicts when the run was (lesson 04)."""
    judged = judge.see("predict, then measure", effects.busy)
    results = score_predictions(locked, effects.effects, measured_at=measured_at)
    names = list(effects.effects[KINDS[0]])
    t = Table(["op kind", *[f"{o} speed-up" for o in names], "helped most here",
               "on paper (targets this regime)", "your prediction", "measured for it", "verdict"],
              title="Predict, then measure (speed-up per unit of work; > 1 + noise = helps)")
    for r in results:
        row = effects.effects[r["kind"]]
        regime = r["kind"].split("-")[0]
        paper = [o for o in row if regime in OPTIMISATION_TARGETS.get(o.lower(), ())]
        cells = ["–" if e.speedup is None else f"{e.speedup:.2f}x" + (" (no)" if judged and not e.helps
                                                                      else "") for e in row.values()]
        yours = "–" if r["predicted"] is None else f"{r['predicted']}, {r['expected']:.2f}x"
        got = "–" if r["measured"] is None else f"{r['measured']:.2f}x"
        best = (r["best"] or "none") if judged else TOO_BUSY_VERDICT
        verdict = r["verdict"] if judged or r["verdict"] in ("not filled in", "not testable here") \
            or r["verdict"].startswith("refused") else TOO_BUSY_VERDICT
        t.add(r["kind"], *cells, best, ", ".join(paper), yours, got, verdict)
    if not judged:
        print(judge.said("which optimisation helped each op most"))
    return t


# --- section 8 and the summary ------------------------------------------------------------------------------

def reconciliation_table(tables: Mapping[str, OpTable]) -> Table:
    """Each profiled step against the plain step timed beside it, the profiler's events taken out
    (lesson 04)."""
    t = Table(["step", "plain ms", "profiled ms", "profiler's events ms", "profiled / plain",
               "less the events / plain", "rounds' spread %", "other programs' CPU %"],
              title="The profile against the plain step (median of the pairs)")
    for name, table in tables.items():
        others = "unknown" if table.others is None else f"{100 * table.others:.0f}"
        t.add(name, table.unprofiled_s * 1e3, table.wall_s * 1e3, table.profiler_cost_s * 1e3, table.ratio,
              table.reconciled_ratio, 100 * table.noise, others)
    return t


def summary(roof: Roofline, tables: Mapping[str, OpTable], shares: Mapping[str, tuple[float, float]],
            sweep: Sweep, decode: Decode, effects: Effects, judge: Judge, *, overhead_s: float,
            gpu: Mapping[str, Any] | None = None) -> MeasuredTable:
    """"What we measured on this machine": this run's numbers next to the claims (`shares`: section 5's
    matmul + attention shares of the FLOPs and of the time); every share, ratio and verdict "too busy to
    judge" when the run was (lesson 04)."""
    state = judge.state
    out = MeasuredTable(f"Lesson 04 on {roof.device_name}")
    quiet = not judge.too_busy

    def shown(value: Any) -> Any:
        return value if quiet else TOO_BUSY_VERDICT

    out.add("ridge point, FLOP/byte (fp32 peak / memory roof beyond the caches)", roof.ridge_point("fp32"))
    out.add("cost of one call of the smallest op (a one-element add), µs", overhead_s * 1e6)
    for name, t in tables.items():
        out.add(f"{name}: step, ms (without the profiler)", t.unprofiled_s * 1e3)
        s = t.shares()
        out.add(f"{name}: compute / memory at the roofs, overhead, below the roofs, % of the step",
                shown(f"{100 * s['compute']:.0f} / {100 * s['memory']:.0f} / {100 * s['overhead']:.0f} / "
                      f"{100 * s[EXCESS]:.0f}"))
    claim = CLAIMS["matmul-time"]
    for name, (flop_share, time_share) in shares.items():
        out.add(f"{name}: matmul + attention share of the FLOPs, %", 100 * flop_share, "~99 %")
        if quiet:
            out.add(f"{name}: matmul + attention share of the time, %", 100 * time_share, claim,
                    rule=AtLeast(100 * C16_RULE.threshold))  # the claim's rule, in percent
        else:
            out.add(f"{name}: matmul + attention share of the time, %", None, claim, verdict=TOO_BUSY_VERDICT,
                    why="; ".join(state.reasons) if state is not None else "")
    out.add(f"time per sample, batch {sweep.batches[0]} / batch {sweep.batches[-1]}",
            shown(f"{sweep.per_sample_ratio:.2f}"))
    out.add(f"decode: {decode.tokens} tokens / one token", shown(f"{decode.ratio.median:.2f}"),
            f"under {decode.tokens / 2:g}: the weights read once")
    for kind, row in effects.effects.items():
        helped = {o: e for o, e in row.items() if e.helps}
        best = max(helped, key=lambda o: helped[o].speedup) if helped else "none"
        out.add(f"helped the {kind} op most here", shown(best))
    for name, value in (gpu or {}).items():
        out.add(name, shown(value))
    return out

