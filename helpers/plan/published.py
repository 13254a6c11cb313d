"""Published training runs and memory figures the planner is calibrated on (lessons 09, 10), each with its
source, rebuilt from what it says and priced by `helpers.plan.fit.Pricer` on its GPU's datasheet roofs.
Guide: docs/plan.md#the-expected-step-time-how-it-is-calibrated"""

from __future__ import annotations

import functools
import math
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.nn import functional as F

from helpers.core.adapt import ModelOutput, ModelShape
from helpers.core.tables import Table
from helpers.core.units import GiB
from helpers.measure.gpus import GPU, gpu
from helpers.measure.levers import Levers
from helpers.plan.calibrate import CALIBRATION, STACKS, Calibration, expected, leave_one_out
from helpers.plan.fit import GpuMemory, Option, Pricer
from helpers.plan.steptime import StepTime

# transformers' model classes are imported inside the functions that build each published model: about 3 s
# (2-core CPU, `python -X importtime`), paid only by the runs that need them

__all__ = ["Source", "PublishedRun", "RUNS", "LORA_RUNS", "MODELS", "TITAN_H100", "A6000", "rebuild", "Row",
           "rebuild_all",
           "rows", "published_table", "MemoryFigure", "MEMORY_FIGURES", "WAITING_MEMORY", "MemoryRow",
           "as_run", "memory_row", "memory_rows", "memory_table", "NanoGPT2022"]

MiB = 2**20


@dataclass(frozen=True)
class Source:
    """Where a published figure comes from: the repository (or paper), the file (or table), its commit (or
    version) and date, and what it says, quoted where it holds the number (lessons 09, 10)."""

    origin: str
    document: str
    version: str
    date: str
    says: str

    def __str__(self) -> str:
        return f"{self.origin}, {self.document} at {self.version} ({self.date}): {self.says}"

    def saying(self, more: str) -> Source:
        """The same document, saying `more` after what it says."""
        return replace(self, says=f"{self.says}{more}")


@dataclass(frozen=True)
class PublishedRun:
    """One published training run: what it trained, on what, with which levers, and its time per optimizer
    step (lessons 09, 10)."""

    name: str
    source: Source
    stack: str  # helpers.plan.calibrate.STACKS: "eager", "compiled" or "fused"
    gpu: GPU  # the board, with the box's count ("8xA100-80")
    model: str  # a key of MODELS
    seq_len: int
    levers: Levers  # micro-batch per GPU, accumulation, GPUs, sharding, checkpointing, 8-bit state, LoRA
    precision: str  # "fp32", "fp16", "bf16"
    measured_s: float  # their time of one optimizer step (every GPU's micro-batches)
    derived: str  # how measured_s follows from what they printed
    not_modelled: str  # what their run did that the plan does not see
    lora_targets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.stack not in STACKS:
            raise ValueError(f"{self.name}: stack must be one of {STACKS}, got {self.stack!r}")
        if self.model not in MODELS:
            raise ValueError(f"{self.name}: model must be one of {sorted(MODELS)}, got {self.model!r}")
        if self.levers.gpus != self.gpu.count:
            raise ValueError(f"{self.name}: {self.gpu.key} has {self.gpu.count} GPU(s), the levers spread "
                             f"over {self.levers.gpus}: name the box, e.g. gpu('8xA100-80')")
        if not self.measured_s > 0:
            raise ValueError(f"{self.name}: measured_s must be > 0 seconds, got {self.measured_s!r}")


# --- the models, as their sources describe them (the Pricer builds them on the meta device) ---------------

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


@dataclass
class _NanoConfig:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    block_size: int = 1024
    vocab_size: int = 50257

    def build(self) -> NanoGPT2022:
        with torch.device("meta"):
            return NanoGPT2022(self)


class NanoGPT2022(nn.Module):
    """nanoGPT's GPT as of its commit 5a725d9 (2022-12-30): naive causal attention, an untied output layer,
    dropout 0 as bench.py sets it; `forward(input_ids, labels)` returns the loss and logits (lessons 09, 10).
    """

    course_contract = True  # model(**batch).loss is the loss

    def __init__(self, config: _NanoConfig | None = None) -> None:
        super().__init__()
        c = self.config = config or _NanoConfig()
        self.course_shape = ModelShape(c.n_layer, c.n_head, c.n_embd // c.n_head)
        self.wte, self.wpe = nn.Embedding(c.vocab_size, c.n_embd), nn.Embedding(c.block_size, c.n_embd)
        self.h = nn.ModuleList([_NanoBlock(c.n_embd, c.n_head, c.block_size) for _ in range(c.n_layer)])
        self.ln_f, self.lm_head = nn.LayerNorm(c.n_embd), nn.Linear(c.n_embd, c.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> ModelOutput:
        pos = torch.arange(0, input_ids.size(1), dtype=torch.long, device=input_ids.device).unsqueeze(0)
        x = self.wte(input_ids) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab)
        loss = None if labels is None else F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))
        return ModelOutput(logits, loss)


def _gpt3(n_embd: int, n_head: int, n_layer: int) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from transformers import GPT2Config, GPT2LMHeadModel

        # flash-attention's GPT-2 model at 2,048 positions, its vocabulary padded to a multiple of 8
        with torch.device("meta"):
            return GPT2LMHeadModel(GPT2Config(n_positions=2048, vocab_size=50264, n_embd=n_embd,
                                              n_head=n_head, n_layer=n_layer))
    return build


def _llama3_8b() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    # Llama 3.1 8B's shape (torchtitan's llama3 "8B" flavour, torchtune's llama3_1_8b)
    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192)
    with torch.device("meta"):
        return LlamaForCausalLM(cfg)


def _bert_large() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    # bert-large-uncased with a 2-class head; the transformers of early 2022 ran BERT's own (eager) attention
    cfg = BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                     num_labels=2, attn_implementation="eager")
    with torch.device("meta"):
        return BertForSequenceClassification(cfg)


def _gpt_7_5b() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    # a GPT of 7.46 B parameters (36 layers of 4,096): ZeRO's example model has 7.5 B and no other shape
    with torch.device("meta"):
        return GPT2LMHeadModel(GPT2Config(n_positions=1024, n_embd=4096, n_head=32, n_layer=36))


# Each builds its model on the meta device, after its imports: transformers 4.52 cannot import a
# model's module under torch.device("meta") (its "cannot import name" hides the error met there)
MODELS: dict[str, Callable[[], nn.Module]] = {
    "nanoGPT 124M (2022)": _NanoConfig().build,
    "bert-large-uncased": _bert_large,
    "GPT3-125M": _gpt3(768, 12, 12),
    "GPT3-355M": _gpt3(1024, 16, 24),
    "GPT3-760M": _gpt3(1536, 16, 24),
    "GPT3-1.3B": _gpt3(2048, 16, 24),
    "GPT3-2.7B": _gpt3(2560, 20, 32),  # the hdim128 config: 20 heads of 128
    "Llama 3.1 8B": _llama3_8b,
    "GPT 7.5B (ZeRO's example)": _gpt_7_5b,
}


# --- the boards the GPU table lacks, from their datasheets ------------------------------------------------

# torchtitan's H100s: a 96 GB HBM2e board at 2.4 TB/s and a 500 W limit; the datasheet peaks are H100 SXM's
TITAN_H100 = replace(gpu("H100"), key="H100-96GB", total_memory=96 * GiB, bandwidth=2.4e12,
                     bandwidth_source="pytorch/torchtitan, benchmarks/llama3_h100_202412_torchtitan.md: "
                     "'96GB HBM2e with 2.4 TB/sec peak memory bandwidth' (its 500 W limit: not modelled)")
# RTX A6000: the table has its peaks; the rest from NVIDIA's RTX A6000 datasheet (48 GB GDDR6, 768 GB/s, PCIe
# 4.0 x16) and the GA102 whitepaper (84 SMs, 6 MB L2); torch's memory figure for it has not been seen
A6000 = replace(gpu("RTXA6000"), capability=(8, 6), total_memory=48 * 10**9, sms=84, l2_bytes=6 * MiB,
                bandwidth=768e9, bandwidth_source="NVIDIA RTX A6000 datasheet (48 GB GDDR6, 768 GB/s)",
                link=gpu("RTX3090").link, host_link=gpu("RTX3090").host_link)


# --- the sources --------------------------------------------------------------------------------------------

_NANO = Source("karpathy/nanoGPT", "README.md", "5a725d9", "2022-12-30",
               "'cutting down iteration time from ~250ms / iter to 135ms / iter' with torch.compile; "
               "bench.py and train.py there: batch 8 x 1024, bf16; no GPU named for it, the README trains "
               "on '1 A100 40GB GPU'")
_HF = Source("huggingface/transformers", "docs/source/en/perf_train_gpu_one.mdx", "0016acf",
             "2022, its nvidia-smi log dated 2022-01-11",
             "bert-large-uncased, 512 sequences of 512 random tokens, one epoch with the Trainer on a "
             "'Tesla V100-SXM2' (16160MiB); ")
_FA = Source("Dao-AILab/flash-attention", "training/README.md", "4a6eaa9", "2022-11-29",
             "'8 x A100 80GB SXM4 80GB (400W) with NVLink'; ")
_FA_CONFIG = ("; training/configs/experiment/pile/{}.yaml there: {} x 2048 per GPU by its gpu_mem rule "
              "(81,920 MiB: 82), {} accumulated to the global batch, {}, bf16")
_TITAN = Source("pytorch/torchtitan", "benchmarks/llama3_h100_202412_torchtitan.md", "9dec370",
                "2024-12-26", "'Table 1 1D Parallelism (FSDP). Llama 3.1 8B model. 8 GPUs. Local batch size "
                "2, global batch size 16. Selective activation checkpointing.'; seq_len 8192 "
                "(train_configs/llama3_8b.toml); ")
_TITAN_128 = replace(_TITAN, says="'Table 3 1D Parallelism (FSDP). Llama 3.1 8B model. 128 GPUs. Local "
                     "batch size 2, global batch size 256. Selective activation checkpointing.'; seq_len "
                     "8192; ")
_TT = Source("pytorch/torchtune", "README.md", "0031bfb", "2024-10-14; the table from 30b8519, 2024-09-24",
             "'Memory and training speed', 'batch size 2 (without gradient accumulation), a dataset packed "
             "to sequence length 2048, and torch compile enabled'; ")


def _fa_run(model: str, config: str, micro: int, accumulation: int, sharding: str,
            tokens_s: float) -> PublishedRun:
    levers = Levers(micro, accumulation, gpus=8, sharding=sharding)
    tokens = levers.global_batch * 2048
    shard = "ZeRO-1 (DDPStrategyZero1)" if sharding == "optimizer" else "DDP"
    return PublishedRun(
        f"{model}, FlashAttention",
        _FA.saying(f"'{model} | {tokens / 2**20:g}M | {tokens_s / 1e3:.0f}k'"
                   + _FA_CONFIG.format(config, micro, accumulation, shard)),
        "fused", gpu("8xA100-80"), model, 2048, levers, "bf16", tokens / tokens_s,
        f"{tokens:,} tokens per step / {tokens_s / 1e3:,.0f}k tokens/s",
        "fused kernels (FlashAttention, dropout + add + LayerNorm, dense + GELU + dense, cross-entropy) move "
        "fewer bytes than the eager ops counted; apex's fused Adam; the 400 W limit")


def _bert_run(name: str, says: str, levers: Levers, precision: str, samples_s: float) -> PublishedRun:
    return PublishedRun(
        name, _HF.saying(says), "eager", gpu("V100-16"), "bert-large-uncased", 512, levers, precision,
        levers.global_batch / samples_s, f"{levers.global_batch} samples per step / {samples_s} samples/s",
        "transformers' own AdamW then (a Python loop, several kernels per parameter); dropout" if
        levers.optimizer == "adamw" else "bitsandbytes' Adam8bit (Adam, not AdamW); dropout")


def _titan_run(technique: str, source: Source, stack: str, gpus: int, tps: float) -> PublishedRun:
    return PublishedRun(
        f"Llama 3.1 8B, {technique}, {gpus} GPUs", source.saying(f"'{technique} | {tps:,.0f}'"), stack,
        TITAN_H100.with_count(gpus), "Llama 3.1 8B", 8192, Levers(2, gpus=gpus, sharding="full"), "bf16",
        2 * 8192 / tps, f"2 x 8,192 tokens per GPU per step / {tps:,.0f} tokens/s per GPU",
        "selective activation checkpointing (every other matmul and the pointwise ops recomputed: not "
        "counted); the 500 W limit" + ("; 16 hosts, 400 Gb/s per GPU between them" if gpus > 8 else ""))


RUNS: tuple[PublishedRun, ...] = (
    PublishedRun("nanoGPT GPT-2 124M, eager", _NANO, "eager", gpu("A100-40"), "nanoGPT 124M (2022)", 1024,
                 Levers(8), "bf16", 0.250, "~250 ms per iteration before compiling",
                 "the GPU is inferred; torch's default (foreach) AdamW"),
    PublishedRun("nanoGPT GPT-2 124M, compiled", _NANO, "compiled", gpu("A100-40"), "nanoGPT 124M (2022)",
                 1024, Levers(8), "bf16", 0.135, "135 ms per iteration, compiled",
                 "the GPU is inferred; torch's default (foreach) AdamW"),
    _bert_run("BERT-large, fp32, batch 4", "batch 4: 'Samples/second: 8.86'", Levers(4), "fp32", 8.86),
    _bert_run("BERT-large, fp32, 1 x 4 accumulated",
              "batch 1, gradient_accumulation_steps=4: 'Samples/second: 7.75'", Levers(1, 4), "fp32", 7.75),
    _bert_run("BERT-large, fp32, 1 x 4, checkpointing", "batch 1, 4 accumulated, "
              "gradient_checkpointing=True: 'Samples/second: 5.99'", Levers(1, 4, checkpointing=True), "fp32",
              5.99),
    _bert_run("BERT-large, fp16, batch 4", "batch 4, fp16=True: 'Samples/second: 18.64'", Levers(4), "fp16",
              18.64),
    _bert_run("BERT-large, fp16, 1 x 4, checkpointing", "batch 1, 4 accumulated, checkpointing, fp16: "
              "'Samples/second: 10.09'", Levers(1, 4, checkpointing=True), "fp16", 10.09),
    _bert_run("BERT-large, fp32, batch 4, 8-bit Adam", "batch 4, bitsandbytes' Adam8bit: 'Samples/second: "
              "9.15'", Levers(4, optimizer="adamw8bit"), "fp32", 9.15),
    _fa_run("GPT3-125M", "gpt3s-flash", 32, 1, "none", 1310e3),
    _fa_run("GPT3-355M", "gpt3m-flash", 32, 1, "none", 503e3),
    _fa_run("GPT3-760M", "gpt3l-flash", 16, 2, "optimizer", 245e3),
    _fa_run("GPT3-1.3B", "gpt3xl-flash", 8, 8, "optimizer", 169e3),
    _fa_run("GPT3-2.7B", "gpt3-2.7B-flash-hdim128", 4, 16, "optimizer", 85e3),
    _titan_run("FSDP", _TITAN, "eager", 8, 5762),
    _titan_run("FSDP + torch.compile", _TITAN, "compiled", 8, 6667),
    _titan_run("FSDP", _TITAN_128, "eager", 128, 5605),
    _titan_run("FSDP + torch.compile", _TITAN_128, "compiled", 128, 6514),
)

# LoRA fine-tunes: rebuilt (the dry run and the op count take a peft model), and left out of the calibration:
# their tokens/s are faster than the planner's step with every kernel at its roof (the 4090's 1.33 s against
# 1.52; the A6000's 0.87 s against 1.28, checkpointing off there since its 30.3 GiB peak is the weights with
# every activation kept), so what their tokens count is not the step the planner counts (tests say so).
# Left out: torchtune's full fine-tunes (on the A6000, 2,579 tokens/s with checkpointing needs about the
# board's whole peak; on the 4090, PagedAdamW8bit's state can move to the CPU).
LORA_RUNS: tuple[PublishedRun, ...] = (
    PublishedRun("Llama 3.1 8B LoRA, RTX 4090", _TT.saying(
        "'Llama 3.1 8B | LoRA | 1x 4090 | 16.2 GiB | 3083'; recipes/configs/llama3_1/8B_lora_single_device."
        "yaml: LoRA r=8 on q_proj and v_proj, activation checkpointing, bf16"), "compiled", gpu("RTX4090"),
        "Llama 3.1 8B", 2048, Levers(2, checkpointing=True, lora_rank=8), "bf16", 2 * 2048 / 3083,
        "2 x 2,048 tokens per step / 3,083 tokens/s", "torchtune's chunked cross-entropy",
        lora_targets=("q_proj", "v_proj")),
    PublishedRun("Llama 3.1 8B LoRA, RTX A6000", _TT.saying(
        "'Llama 3.1 8B | LoRA | 1x A6000 | 30.3 GiB | 4699'; the same config, checkpointing off (above)"),
        "compiled", A6000, "Llama 3.1 8B", 2048, Levers(2, lora_rank=8), "bf16", 2 * 2048 / 4699,
        "2 x 2,048 tokens per step / 4,699 tokens/s", "torchtune's chunked cross-entropy",
        lora_targets=("q_proj", "v_proj")),
)


# --- rebuilding a run ------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _pricer(model: str, seq_len: int, lora_targets: tuple[str, ...]) -> Pricer:
    """One Pricer per model, sequence length and LoRA targets: its dry runs and counts are made once."""
    built = MODELS[model]()  # on the meta device
    return Pricer(built, seq_len, lora_targets=tuple(lora_targets) or "all-linear")


def rebuild(run: PublishedRun, **changes: object) -> Option:
    """`run` priced by the planner on its GPU's datasheet roofs: memory per GPU and the roof step time; with
    `changes`, the run's fields replaced first (a planted error, a what-if) (lessons 09, 10)."""
    run = replace(run, **changes) if changes else run
    pricer = _pricer(run.model, run.seq_len, run.lora_targets)
    return pricer.option(run.gpu, run.levers, precision=run.precision)


def rebuild_step(run: PublishedRun) -> StepTime:
    """`run`'s roof step time alone: the op counts, no dry run (lessons 09, 10)."""
    pricer = _pricer(run.model, run.seq_len, run.lora_targets)
    return pricer.step(run.gpu, run.levers, precision=run.precision)


def _rebuild_all(runs: Sequence[PublishedRun]) -> list[StepTime]:
    return [rebuild_step(r) for r in runs]


def _variant_key(run: PublishedRun) -> tuple:
    """What one Pricer variant's dry runs and counts depend on: runs sharing it are rebuilt together."""
    lv = run.levers
    return (run.model, run.seq_len, run.lora_targets, run.precision == "fp32", lv.checkpointing, lv.lora_rank,
            lv.weights16)


def _pooled(work: Callable[[list], list], items: Sequence, keys: Sequence[tuple], processes: int) -> list:
    """`work` over `items` in `processes` worker processes, the items of one key in one call (their Pricer
    variant made once); results in the items' order. Counting is Python-bound: one core each."""
    if not (isinstance(processes, int) and processes >= 1):
        raise ValueError(f"processes must be a whole number >= 1, got {processes!r}")
    if processes == 1:
        return work(list(items))

    groups: dict[tuple, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    out: list = [None] * len(items)
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = {pool.submit(work, [items[i] for i in idx]): idx for idx in groups.values()}
        for future, idx in done.items():
            for i, result in zip(idx, future.result()):
                out[i] = result
    return out


def rebuild_all(runs: Sequence[PublishedRun], *, processes: int = 1) -> list[StepTime]:
    """`rebuild_step` of every run, the runs that share a model's counts together, in `processes` worker
    processes (lessons 09, 10)."""
    return _pooled(_rebuild_all, runs, [_variant_key(r) for r in runs], processes)


@dataclass(frozen=True)
class Row:
    """One published run beside its roof plan (lessons 09, 10)."""

    run: PublishedRun
    step: StepTime

    @property
    def stack(self) -> str:
        return self.run.stack

    @property
    def measured_s(self) -> float:
        return self.run.measured_s

    @property
    def ratio(self) -> float:
        """Theirs / the roof plan."""
        return self.run.measured_s / self.step.seconds


def rows(runs: Sequence[PublishedRun] = RUNS, *, processes: int = 1) -> list[Row]:
    """Every run rebuilt: ten dry runs and counts of 1-2-layer copies per model variant, 10 to 25 s each on
    one core of the 2-core CPU (lessons 09, 10)."""
    return [Row(r, step) for r, step in zip(runs, rebuild_all(runs, processes=processes))]


def published_table(found: Sequence[Row] | None = None, calibration: Calibration = CALIBRATION) -> Table:
    """Each published run: their step, the roof plan, the expected time and its range, theirs / expected, and
    theirs / expected when the run is left out of the fit (lessons 09, 10)."""
    found = rows() if found is None else found
    held_out = leave_one_out(found, calibration.estimate)
    factors = ", ".join(f"{k} {v:.2g}" for k, v in calibration.factors.items())
    t = Table(["run", "GPU", "stack", "theirs (ms)", "roof (ms)", "expected (ms)", "range (ms)",
               "theirs / expected", "left out of the fit", "not modelled", "source"],
              title=f"Published runs against the planner: expected = compute-bound kernels at their roof + "
                    f"memory-bound ones x the stack's factor ({factors}), range x{calibration.low:.2f} to "
                    f"x{calibration.high:.2f}")
    for row, out in zip(found, held_out):
        e = expected(row.step, row.stack, calibration)
        t.add(row.run.name, row.run.gpu.key, row.stack, row.measured_s * 1e3, row.step.seconds * 1e3,
              e.seconds * 1e3, f"{e.low * 1e3:,.3g} to {e.high * 1e3:,.3g}", row.measured_s / e.seconds,
              out, row.run.not_modelled, str(row.run.source))
    return t


# --- published memory figures for the levers -------------------------------------------------------------

@dataclass(frozen=True)
class MemoryFigure:
    """A published memory figure for a lever, the run it describes, and how far the planner's memory per GPU
    may be from it, with the reason (lessons 09, 10)."""

    name: str
    source: Source
    model: str
    seq_len: int
    gpu: GPU
    levers: Levers
    precision: str
    theirs: float  # bytes, as published
    part: str  # "model states" (weights, gradients, optimizer state) or "peak" (everything at the peak)
    held: tuple[float, float]  # ours / theirs must lie within
    why: str  # what the range allows for
    not_tensors: float = 0.0  # bytes of theirs that no tensor holds (a CUDA context), taken off theirs
    parameters: float | None = None  # their model's parameters, when ours has a few more or less: scaled

    def __post_init__(self) -> None:
        if self.part not in ("model states", "peak"):
            raise ValueError(f"{self.name}: part must be 'model states' or 'peak', got {self.part!r}")


_ZERO = Source("arXiv 1910.02054 (Rajbhandari et al., ZeRO)", "Figure 1 and Table 1", "v3", "2020",
               "model states per device, 7.5B parameters, mixed-precision Adam (K = 12), N_d = 64: ")
_ZERO_LEVERS = dict(model="GPT 7.5B (ZeRO's example)", seq_len=64, gpu=gpu("64xA100-80"), precision="bf16",
                    part="model states", parameters=7.5e9)
_BERT_MEMORY = dict(model="bert-large-uncased", seq_len=512, gpu=gpu("V100-16"), part="peak",
                    not_tensors=1343 * MiB, held=(1 / 1.4, 1.0))
_NVML = ("theirs is nvidia-smi's memory in use less the CUDA context (1,343 MB, measured on the same page): "
         "it still holds what the caching allocator keeps beyond the live tensors, so ours is at most theirs "
         "and at least 1/1.4 of it")

MEMORY_FIGURES: tuple[MemoryFigure, ...] = (
    MemoryFigure("ZeRO: plain data parallelism", _ZERO.saying("'Baseline' 120GB"), levers=Levers(1, gpus=64),
                 theirs=120e9, held=(0.97, 1.03), why="the same 16 bytes per parameter: PyTorch's AMP "
                 "keeps fp32 weights (4) and gradients (4) and Adam's two states (8); DeepSpeed fp16 weights "
                 "(2) and gradients (2) and fp32 master weights with the states (12)", **_ZERO_LEVERS),
    MemoryFigure("ZeRO-1: optimizer state sharded", _ZERO.saying("'P_os' 31.4GB"),
                 levers=Levers(1, gpus=64, sharding="optimizer"), theirs=31.4e9, held=(1.88, 2.00),
                 why="not the same layout: DeepSpeed shards its fp32 master weights with the optimizer state "
                 "(4 + 12/64 bytes per parameter), PyTorch keeps fp32 weights and gradients whole and shards "
                 "Adam's states (8 + 8/64): 1.94x by that arithmetic, held within 3 %", **_ZERO_LEVERS),
    MemoryFigure("ZeRO-3 / FSDP2: everything sharded", _ZERO.saying("'P_os+g+p' 1.9GB (Table 1: 1.88)"),
                 levers=Levers(1, gpus=64, sharding="full"), theirs=1.88e9, held=(0.97, 1.03),
                 why="16 bytes per parameter / 64 in both layouts; the layer FSDP gathers is not a model "
                 "state (ZeRO's figure leaves it out too)", **_ZERO_LEVERS),
    MemoryFigure("BERT-large, fp32, batch 4", _HF.saying("batch 4: 'GPU memory occupied: 14949 MB.'"),
                 levers=Levers(4), precision="fp32", theirs=14949 * MiB, why=_NVML, **_BERT_MEMORY),
    MemoryFigure("BERT-large, fp16, batch 4", _HF.saying("fp16=True: 'GPU memory occupied: 13939 MB.'"),
                 levers=Levers(4), precision="fp16", theirs=13939 * MiB, why=_NVML, **_BERT_MEMORY),
    MemoryFigure("BERT-large, batch 4, 8-bit Adam", _HF.saying("Adam8bit: 'GPU memory occupied: 13085 MB.'"),
                 levers=Levers(4, optimizer="adamw8bit"), precision="fp32", theirs=13085 * MiB, why=_NVML,
                 **_BERT_MEMORY),
    MemoryFigure("BERT-large, 1 x 4, checkpointing", _HF.saying(
                 "batch 1, 4 accumulated, checkpointing: 'GPU memory occupied: 6775 MB.'"),
                 levers=Levers(1, 4, checkpointing=True), precision="fp32", theirs=6775 * MiB, why=_NVML,
                 **_BERT_MEMORY),
)
# Waiting for the planner: accumulation's figure (its dry run of 1-2 layers at one sequence peaks at the
# optimizer step, so the deep model's backward peak is lost: 5.00 GiB extrapolated, 5.75 GiB by a direct dry
# run of 24 layers) and LoRA's (the dry run does not take a peft model yet).
WAITING_MEMORY: tuple[MemoryFigure, ...] = (
    MemoryFigure("BERT-large, fp32, 1 x 4 accumulated", _HF.saying(
                 "batch 1, gradient_accumulation_steps=4: 'GPU memory occupied: 8681 MB.'"),
                 levers=Levers(1, 4), precision="fp32", theirs=8681 * MiB, why=_NVML, **_BERT_MEMORY),
    MemoryFigure("Llama 3.1 8B LoRA, RTX 4090", _TT.saying("'Llama 3.1 8B | LoRA | 1x 4090 | 16.2 GiB'"),
                 "Llama 3.1 8B", 2048, gpu("RTX4090"), Levers(2, checkpointing=True, lora_rank=8), "bf16",
                 16.2 * GiB, "peak", (1 / 1.25, 1.25), "torchtune chunks its cross-entropy: the logits' fp32 "
                 "copy is never whole; its peak is torch's reserved memory"),
)


@dataclass(frozen=True)
class MemoryRow:
    """One memory figure beside the planner's (lessons 09, 10)."""

    figure: MemoryFigure
    ours: float  # bytes per GPU: the part the figure counts

    @property
    def theirs(self) -> float:
        """Their bytes, less what no tensor holds, for a model of our size."""
        f = self.figure
        bytes_ = f.theirs - f.not_tensors
        if f.parameters:
            bytes_ *= _parameters(f.model) / f.parameters
        return bytes_

    @property
    def ratio(self) -> float:
        return self.ours / self.theirs

    @property
    def held(self) -> bool:
        low, high = self.figure.held
        return low <= self.ratio <= high


@functools.lru_cache(maxsize=None)
def _parameters(model: str) -> int:
    return sum(p.numel() for p in MODELS[model]().parameters())  # on the meta device


def as_run(figure: MemoryFigure) -> PublishedRun:
    """The run a memory figure describes, for `rebuild` (its time is not theirs: 1 s stands in)."""
    return PublishedRun(figure.name, figure.source, "eager", figure.gpu, figure.model, figure.seq_len,
                        figure.levers, figure.precision, 1.0, "a memory figure", "",
                        ("q_proj", "v_proj") if figure.levers.lora_rank else ())


def rebuild_memory(figure: MemoryFigure, **changes: object) -> GpuMemory:
    """The planner's memory per GPU for the run `figure` describes, from the dry runs alone; with `changes`,
    the figure's fields replaced first (a planted error) (lessons 09, 10)."""
    f = replace(figure, **changes) if changes else figure
    run = as_run(f)
    pricer = _pricer(run.model, run.seq_len, run.lora_targets)
    return pricer.memory(run.gpu, run.levers, precision=run.precision)


def memory_row(figure: MemoryFigure, memory: GpuMemory | None = None) -> MemoryRow:
    """A memory figure beside the planner's memory per GPU (`memory`, else rebuilt) (lessons 09, 10)."""
    m = rebuild_memory(figure) if memory is None else memory
    ours = m.weights + m.gradients + m.optimizer if figure.part == "model states" else m.total
    return MemoryRow(figure, ours)


def _rebuild_memory_all(figures: Sequence[MemoryFigure]) -> list[GpuMemory]:
    return [rebuild_memory(f) for f in figures]


def memory_rows(figures: Sequence[MemoryFigure] = MEMORY_FIGURES, *, processes: int = 1) -> list[MemoryRow]:
    """Each memory figure rebuilt by the planner, in `processes` worker processes (lessons 09, 10)."""
    found = _pooled(_rebuild_memory_all, figures, [_variant_key(as_run(f)) for f in figures], processes)
    return [memory_row(f, m) for f, m in zip(figures, found)]


def memory_table(found: Sequence[MemoryRow] | None = None) -> Table:
    """Published memory figures for the levers beside the planner's memory per GPU (lessons 09, 10)."""
    found = memory_rows() if found is None else found
    t = Table(["figure", "part", "theirs (GiB)", "planner (GiB)", "planner / theirs", "held to", "why",
               "source"], title="Published memory figures against the planner's dry run")
    for r in found:
        low, high = r.figure.held
        t.add(r.figure.name, r.figure.part, r.theirs / GiB, r.ours / GiB, r.ratio,
              f"{low:.2f} to {high:.2f}", r.figure.why, str(r.figure.source))
    return t
