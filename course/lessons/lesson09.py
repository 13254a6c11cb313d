"""Lesson 09's set-up (`09_plan_your_run`) and plumbing: what the lesson plans at which size, the check of the
planner against this machine's own step, and the published GPU figures the planner is held to.

Planning allocates nothing on any device (`helpers.plan.planner` runs fake tensors on the CPU); the only step
this
lesson runs for real is the small Transformer's, on this machine, to hold the planner to a measurement.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from course.lessons import LessonSetup
from course.profile import get_profile, pick, small_config
from course.sizing import MARGIN, Size, fit_sizes
from helpers.core.adapt import ModelShape, as_course_model
from helpers.core.device import get_device, last_level_cache_bytes
from helpers.core.tables import Table
from helpers.measure.gpus import GPU, gpu
from helpers.measure.memory import estimate_step_memory, estimate_training_memory
from helpers.measure.opcount import OpCount, labelled_step
from helpers.measure.optime import per_call_overhead
from helpers.measure.regimes import (
    EXCESS,
    ROOF_MARGIN,
    MemoryRoofs,
    measure_memory_roofs,
    measure_peak_flops,
    profile_step,
)
from helpers.measure.roofline import Roofline, datasheet_roofline, measure_roofline
from helpers.model.models import SmallTransformer
from helpers.plan.planner import (
    Plan,
    StepTime,
    count_step,
    example_batch,
    gpu_like_attention,
    measured_roofs,
    predict_step,
    step_time,
)

__all__ = ["SIZES", "SMOKE_GPUS", "setup", "check_on_this_machine", "NanoGPT2022", "Published", "PUBLISHED",
           "PUBLISHED_FACTOR", "counts_by_layers", "published_prediction", "published_table",
           "compare_prediction", "measured_table"]

SIZES = {"CHECK_BATCH": Size(full=16, smoke=8, floor=2),  # sequences per step of the step measured here
         "CHECK_SEQ": Size(full=256, smoke=128, floor=64)}  # its tokens per sequence
SMOKE_GPUS = ["T4", "L4", "A100-40", "A100-80", "H100", "H200"]  # six classes: the smoke profile's plans
BBC_TRAIN_ARTICLES = 1780  # the capstone's training split: 80 % of the 2,225 BBC News articles (lesson 08)


def setup(profile: str | None = None) -> LessonSetup:
    """Lesson 09's sizes on this device; prints what it chose and why (lesson 09)."""
    profile = get_profile(profile)
    device = get_device()
    vocab = pick(profile, smoke=2048, full=8192)  # the small Transformer measured on this machine
    with torch.device("meta"):  # its shapes, for the estimate: nothing allocated
        shape = SmallTransformer(small_config(profile, vocab_size=vocab))
    estimates = {"the small Transformer's step, measured here": lambda s: estimate_training_memory(
        shape, s["CHECK_BATCH"], s["CHECK_SEQ"]).peak}
    fit = fit_sizes(SIZES, estimates, shrink=["CHECK_BATCH", "CHECK_SEQ"], profile=profile, device=device,
                    precision="fp32", notes=["the plans themselves allocate nothing on any device"])
    print(fit.line())
    p = fit.profile
    capstone_seq = pick(p, smoke=128, full=512)
    return LessonSetup(
        PROFILE=p, DEVICE=device, FIT=fit, VOCAB=vocab, **fit.sizes,
        CAPSTONE=pick(p, smoke="bert-mini", full="bert-base"),  # lesson 08's model (models.KNOWN_MODELS)
        CAPSTONE_BATCH=32, CAPSTONE_SEQ=capstone_seq,  # lesson 08's batch and longest sequence
        CAPSTONE_TOKENS=BBC_TRAIN_ARTICLES * capstone_seq,  # one epoch, every article padded to the longest
        GPT_SIZES=pick(p, smoke=dict(n_layer=2, n_embd=128, n_head=4), full=dict(n_layer=12, n_embd=768,
                                                                                   n_head=12)),
        GPT_BATCH=8, GPT_SEQ=pick(p, smoke=256, full=1024),
        GPT_TOKENS=pick(p, smoke=1e8, full=1e10),  # the GPT's data set, tokens per epoch
        GPUS=pick(p, smoke=SMOKE_GPUS, full=None))  # None: every class of helpers.measure.gpus


# --- the planner on this machine: predicted beside measured ----------------------------------------------

def _roofs_here(device: torch.device) -> tuple[Roofline, Roofline, MemoryRoofs, float]:
    """This machine's roofs, measured now as lesson 04 measures them: the best matmul rate of a few sizes,
    a copy beyond the caches, the copies that fit the caches, and the cost of one call."""
    gpu_here = device.type == "cuda"
    copy_mb = max(64, -(-(last_level_cache_bytes(device) or 0) // 2**20))
    now = measure_roofline(device, precisions=["fp32"], matmul_size=2048 if gpu_here else 512,
                           copy_mb=copy_mb, min_run_time=0.2)
    peak = max(now.matmul_flops["fp32"], measure_peak_flops(device))
    roofline = Roofline(now.device_name, {"fp32": peak}, now.bandwidth, now.matmul_size, now.copy_bytes)
    overhead = per_call_overhead(device)
    cache = last_level_cache_bytes(device)
    memory = measure_memory_roofs(device, roofline, cache_bytes=cache, overhead_s=overhead)
    roofs = measured_roofs(roofline, overhead_s=overhead, memory_roofs=memory, device=device)
    return roofline, roofs, memory, overhead


def check_on_this_machine(model: nn.Module, batch: Mapping[str, Any], *,
                          device: torch.device | str | None = None) -> tuple[Table, float]:
    """The planner's step time of `model` on `batch` from this machine's measured roofs, beside the step
    measured here, and the measured step split by lesson 04's causes; (the table, measured / predicted)
    (lesson 09). The model is copied to `device` (default: this lesson's) and trained one fp32 step at a
    time (fused AdamW), as the plan assumes. Checks that the step is not faster than the prediction by more
    than lesson 04's noise rule (`ROOF_MARGIN`): a step cannot beat its roofs, so a planner that over-counts
    fails; prints what it checked."""
    import copy

    device = torch.device(device) if device is not None else get_device()
    roofline, roofs, memory, overhead = _roofs_here(device)
    predicted = predict_step(model, batch, roofs)
    here = copy.deepcopy(model).to(device)
    on_device = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    opt = torch.optim.AdamW(here.parameters(), lr=1e-4, fused=True)
    table = profile_step(labelled_step(here, on_device, opt), roofline, device=device, overhead_s=overhead,
                         memory_roofs=memory, steps=3, untimed="estimate")
    measured = table.unprofiled_s or table.total_s
    causes, scale = table.causes(), measured / max(table.total_s, 1e-12)
    t = Table(["", "ms per step", "where it comes from"],
              title=f"The planner on this machine ({roofline.device_name}), one fp32 step")
    t.add("predicted: every op at its roof, plus its calls' cost", predicted.seconds * 1e3,
          "helpers.plan.planner.predict_step on the roofs measured just now")
    t.add("measured: the same step, plain", measured * 1e3, "median of 3 steps beside profiled ones")
    t.add("measured / predicted", measured / predicted.seconds, "the gap the causes below explain")
    t.add("  of which: ops at their roofs (compute + memory)",
          (causes["compute"] + causes["memory"]) * scale * 1e3, "lesson 04's profile, scaled to the step")
    t.add("  of which: calls' cost and time between ops (overhead)", causes["overhead"] * scale * 1e3,
          "lesson 04: the host's Python, dispatcher, autograd")
    t.add(f"  of which: {EXCESS}", causes[EXCESS] * scale * 1e3, "lesson 04: kernels slower than their roof")
    ratio = measured / predicted.seconds
    # the check: a step cannot beat its roofs; by more than lesson 04's noise rule, the planner over-counts
    assert ratio >= 1 / ROOF_MARGIN, (f"the step ran {1 / ratio:.1f}x faster than the planner's roofs allow "
                                      f"(rule: at most {ROOF_MARGIN:g}x, lesson 04): its counts are too high")
    print(f"checked: the measured step is {ratio:.2f}x the planner's prediction (a step cannot beat its "
          f"roofs: at least 1/{ROOF_MARGIN:g}x, lesson 04's noise rule)")
    return t, ratio


# --- published figures the planner is held to ------------------------------------------------------------

class _NanoAttention(nn.Module):
    def __init__(self, d: int, heads: int, block: int) -> None:
        super().__init__()
        self.c_attn, self.c_proj, self.n_head, self.n_embd = nn.Linear(d, 3 * d), nn.Linear(d, d), heads, d
        self.register_buffer("bias", torch.tril(torch.ones(block, block)).view(1, 1, block, block))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in self.c_attn(x).split(self.n_embd, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, H, T, T): naive attention
        att = F.softmax(att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf")), dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))


class _NanoBlock(nn.Module):
    def __init__(self, d: int, heads: int, block: int) -> None:
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(d), _NanoAttention(d, heads, block)
        self.ln_2, self.c_fc, self.c_proj = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        # nanoGPT's torch.jit.script GELU (tanh form) runs as one fused kernel on a GPU: one op here too
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class NanoGPT2022(nn.Module):
    """nanoGPT's GPT as of its commit 5a725d9 (2022-12-30): naive causal attention, an untied output layer,
    dropout 0 as bench.py set it; forward(idx, targets) -> (logits, loss) (lesson 09)."""

    def __init__(self, n_layer: int = 12, n_head: int = 12, n_embd: int = 768, block_size: int = 1024,
                 vocab_size: int = 50257) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, n_embd), nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([_NanoBlock(n_embd, n_head, block_size) for _ in range(n_layer)])
        self.ln_f, self.lm_head = nn.LayerNorm(n_embd), nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device).unsqueeze(0)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def _nanogpt(layers: int) -> nn.Module:
    return as_course_model(NanoGPT2022(n_layer=layers), shape=ModelShape(layers, 12, 64))


def _gpt3(n_embd: int, n_head: int) -> Callable[[int], nn.Module]:
    def build(layers: int) -> nn.Module:
        from transformers import GPT2Config, GPT2LMHeadModel

        # flash-attention's GPT-2 model at 2,048 positions, its vocabulary padded to a multiple of 8
        return GPT2LMHeadModel(GPT2Config(n_positions=2048, vocab_size=50264, n_embd=n_embd, n_head=n_head,
                                          n_layer=layers))
    return build


def _llama3_8b(layers: int) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    # Llama 3.1 8B's shape (torchtitan's llama3 "8B" flavour)
    return LlamaForCausalLM(LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                                        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                        max_position_embeddings=8192))


# torchtitan's H100s: a 96 GB HBM2e board at 2.4 TB/s and a 500 W limit; the datasheet peaks are H100 SXM's
_TITAN_H100 = replace(gpu("H100"), key="H100 96GB (torchtitan's)", total_memory=96 * 2**30,
                      bandwidth=2.4e12, bandwidth_source="torchtitan, benchmarks/llama3_h100_202412_"
                      "torchtitan.md: 96GB HBM2e with 2.4 TB/sec peak memory bandwidth (500 W: not modelled)")


@dataclass(frozen=True)
class Published:
    """One published training step time: the model and step it describes, rebuilt, and where it comes from
    (lesson 09)."""

    name: str
    source: str  # repository, file, commit and date, and what it says
    gpu: GPU
    build: Callable[[int], nn.Module]  # the model with n layers (built on the meta device)
    layers: int
    batch: int  # sequences per GPU per step
    seq: int
    fused_adamw: bool
    measured_s: float  # their time of one such step on one GPU
    derived: str  # how measured_s follows from what they printed
    not_modelled: str  # what their run did that the plan does not see


PUBLISHED = (
    Published("nanoGPT GPT-2 124M, eager", "karpathy/nanoGPT README.md at commit 5a725d9 (2022-12-30): "
              "'cutting down iteration time from ~250ms / iter to 135ms / iter' with torch.compile; bench.py "
              "there: batch 8 x 1024, bf16 autocast, dropout 0. The README names no GPU for it; it trains on "
              "'1 A100 40GB GPU'", gpu("A100-40"), _nanogpt, 12, 8, 1024, False, 0.250,
              "~250 ms per iteration before compiling", "the run's data loading; the GPU is inferred"),
    Published("nanoGPT GPT-2 124M, compiled", "the same line: 135 ms per iteration with torch.compile",
              gpu("A100-40"), _nanogpt, 12, 8, 1024, False, 0.135, "135 ms per iteration, compiled",
              "compile's fusion moves fewer bytes than the eager ops counted"),
    Published("GPT3-125M, FlashAttention", "Dao-AILab/flash-attention training/README.md at commit 4a6eaa9 "
              "(2022-11-29): 1310k tokens/s on 8 x A100 80GB SXM4; its config gpt3s-flash: 32 x 2048 "
              "per GPU, bf16", gpu("A100-80"), _gpt3(768, 12), 12, 32, 2048, True, 32 * 2048 / (1310e3 / 8),
              "1310k tokens/s / 8 GPUs, per step of 32 x 2048", "fused kernels (dropout+add+LayerNorm, "
              "MLP, cross-entropy) move fewer bytes than the eager ops counted; DDP"),
    Published("GPT3-1.3B, FlashAttention", "the same table: 169k tokens/s on 8 x A100 80GB; config "
              "gpt3xl-flash: 8 x 2048 per GPU on 80 GB", gpu("A100-80"), _gpt3(2048, 16), 24, 8, 2048, True,
              8 * 2048 / (169e3 / 8), "169k tokens/s / 8 GPUs, per step of 8 x 2048",
              "the same fused kernels; ZeRO-1 and DDP"),
    Published("Llama 3.1 8B, torchtitan FSDP", "pytorch/torchtitan benchmarks/llama3_h100_202412_"
              "torchtitan.md (Dec 2024), table 1: 5,762 tokens/s per GPU, FSDP on 8 H100, local batch 2; "
              "seq_len 8192 from the llama3_8b.toml of the commit it names (9dec370)",
              _TITAN_H100, _llama3_8b, 32, 2, 8192, True, 2 * 8192 / 5762,
              "5,762 tokens/s per GPU, per step of 2 x 8192",
              "selective activation checkpointing (recompute), FSDP's communication, the 500 W limit"),
)
# The planner puts every op at its roof: a real eager step is slower (kernels below their roofs, the host's
# gaps, as lesson 04 splits a CPU step; the published eager GPU steps above ran about 3x their plan); fused
# and compiled steps move fewer bytes than the eager ops the planner counts and can beat it. The factor:
# measured / predicted within [1/1.5, 3.5].
PUBLISHED_FACTOR = (1 / 1.5, 3.5)


def counts_by_layers(build: Callable[[int], nn.Module], layers: int, batch: int, seq: int, *,
                     precision: str = "bf16", fused_adamw: bool = True) -> dict[tuple[str, str], OpCount]:
    """The op counts of the `layers`-layer model, from counts of its 1- and 2-layer versions: every layer
    adds the same ops, so calls, FLOPs and bytes are linear in the layers (checked against a direct count
    in tests/test_plan_published.py); a 32-layer 8B model is counted in seconds (lesson 09)."""
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    found = []
    for n in (1, 2):
        with torch.device("meta"):
            model = build(n)
        found.append(count_step(model, example_batch(model, batch, seq), precision=precision,
                                fused_adamw=fused_adamw))
    one, two = found
    out = {}
    for key in one.keys() | two.keys():
        a, b = one.get(key), two.get(key)
        base = a or replace(b, calls=0, flops=0.0, bytes_read=0.0, bytes_written=0.0)
        step = b or replace(a, calls=0, flops=0.0, bytes_read=0.0, bytes_written=0.0)
        k = layers - 1  # layers beyond the first, each adding (two-layer count - one-layer count)
        out[key] = replace(base, calls=base.calls + k * (step.calls - base.calls),
                           flops=base.flops + k * (step.flops - base.flops),
                           bytes_read=base.bytes_read + k * (step.bytes_read - base.bytes_read),
                           bytes_written=base.bytes_written + k * (step.bytes_written - base.bytes_written))
    return out


def published_prediction(fig: Published) -> StepTime:
    """The planner's step time of a published run, rebuilt (lesson 09)."""
    counts = counts_by_layers(fig.build, fig.layers, fig.batch, fig.seq, fused_adamw=fig.fused_adamw)
    return step_time(counts, datasheet_roofline(fig.gpu), "bf16")


def published_table(figures: tuple[Published, ...] = PUBLISHED) -> tuple[Table, list[float]]:
    """Each published step time beside the planner's, rebuilt from what the source describes; (the table,
    the ratios measured / predicted) (lesson 09)."""
    t = Table(["run", "GPU", "their step (ms)", "planned (ms)", "theirs / planned", "not modelled", "source"],
              title="The planner against published step times (bf16, one GPU's share of the step)")
    ratios, planned = [], {}
    for fig in figures:
        key = (fig.build, fig.layers, fig.batch, fig.seq, fig.fused_adamw, fig.gpu)
        predicted = planned[key] = planned[key] if key in planned else published_prediction(fig)
        ratios.append(fig.measured_s / predicted.seconds)
        t.add(fig.name, fig.gpu.key, fig.measured_s * 1e3, predicted.seconds * 1e3, ratios[-1],
              fig.not_modelled, fig.source)
    return t, ratios


# --- the exercise's prediction beside the planner's search, and the lesson's summary ------------------------

def compare_prediction(answer: Callable[..., int], model: nn.Module, the_plan: Plan, key: str = "T4") -> None:
    """Your `largest_batch_from` for class `key`, from two dry runs (the plan's batch and twice it), beside
    the largest batch the planner searched (lesson 09); an untouched skeleton shows the planner's alone."""
    from course.exercises import is_skeleton

    c = the_plan[key]
    rows = the_plan.batch_size
    batch = example_batch(model, 2 * rows, the_plan.seq_len)
    with gpu_like_attention():
        peaks = [estimate_step_memory(model, {k: v[:n] for k, v in batch.items()}, precision="bf16").peak
                 for n in (rows, 2 * rows)]
    line = (f"{key}: dry runs {peaks[0] / 2**30:.2f} GiB at batch {rows} and {peaks[1] / 2**30:.2f} GiB at "
            f"{2 * rows}; {c.gpu.total_memory / 2**30:.1f} GiB, {MARGIN:.0%} kept free")
    print(line)
    print(f"the planner's search: {c.largest_batch} (dry runs until one fits next to one that does not)")
    if is_skeleton(answer):
        print("your line: write largest_batch_from above to see your prediction here")
    else:
        print(f"your line: {answer(rows, peaks[0], peaks[1], c.gpu.total_memory, MARGIN)}")


def measured_table(plans: Mapping[str, Plan], here_ratio: float, published: list[float]) -> Table:
    """This run's numbers next to what the lesson claims (lesson 09)."""
    t = Table(["claim", "this run", "where"], title="What we measured on this machine")
    low, high = PUBLISHED_FACTOR
    t.add("a plan takes seconds on a CPU, nothing on a GPU",
          ", ".join(f"{name} {p.seconds:.0f} s ({len(p.classes)} classes)" for name, p in plans.items()),
          "sections 1 and 4")
    t.add("a real step is slower than every op at its roof", f"{here_ratio:.2f}x on this machine",
          "section 5, lesson 04's causes")
    t.add(f"published GPU steps are within {low:.2f}x to {high:.1f}x of the plan",
          ", ".join(f"{r:.2f}" for r in published), "section 5, tests/test_plan_published.py")
    return t
