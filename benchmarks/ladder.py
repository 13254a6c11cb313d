"""The speed ladder of lesson 07 as a benchmark: BERT fine-tuning steps, one optimisation at a time.

Rungs are cumulative, each adds one change to the one before (order as in lesson 07):
fp32 eager -> TF32 -> bf16 autocast -> SDPA -> torch.compile -> fused AdamW -> dynamic padding with
length bucketing. (DDP, the last rung of the lesson, needs several processes: the lesson launches
`scripts/finetune_bert.py` with torchrun for it.)

Weights are random (speed does not depend on their values), shapes are BERT-base's
(`transformers.BertConfig()`) unless `--model` says otherwise, and the sequence lengths are those of the
bundled BBC News corpus tokenised with BERT's WordPiece vocabulary, truncated to `--seq`.

Before a rung is timed it is checked against the rung before it, from the same initial weights on the
same samples: the logits and the loss of one forward pass must agree within the tolerance of the lower
precision of the two (see TOLERANCES); the fused-AdamW rung also checks one optimizer step against the
foreach implementation on identical gradients. A rung that disagrees stops the benchmark.

Writes `ladder-<device>.json`, `.md` and `.png` into `--out`, stamped with device, versions and date.

    python benchmarks/ladder.py                                  # BERT-base, seq 512, batch 32: GPU targets
    python benchmarks/ladder.py --model mini --seq 128 --batch 8 --batches 4   # a small run on a CPU
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import platform
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file from anywhere: make `helpers` importable
    sys.path.insert(0, str(ROOT))

__all__ = ["Rung", "RUNGS", "TOLERANCES", "MODEL_SIZES", "bert_config", "collate", "make_batches", "agree",
           "run_ladder", "to_markdown", "write_results", "main"]


@dataclass(frozen=True)
class Rung:
    """One rung: the full set of switches it runs with (each rung changes one of them)."""

    name: str
    precision: str  # "fp32" | "tf32" | "bf16" (autocast)
    attn: str  # "eager" (materialised softmax) | "sdpa" (F.scaled_dot_product_attention)
    compile: bool  # torch.compile the model
    fused: bool  # fused AdamW instead of the foreach implementation
    bucketing: bool  # pad each batch to its longest sample, batches drawn from length buckets
    claim: str  # what is commonly claimed for this step


RUNGS: tuple[Rung, ...] = (
    Rung("fp32 eager", "fp32", "eager", False, False, False, "baseline"),
    Rung("+ TF32", "tf32", "eager", False, False, False, "up to ~2-3x on fp32 matmuls (Ampere+); no-op on CPU"),
    Rung("+ bf16 autocast", "bf16", "eager", False, False, False, "1.5-2.3x, ~40 % less memory (CLAIMS #2)"),
    Rung("+ SDPA", "bf16", "sdpa", False, False, False, "faster, less memory, most on long sequences (#6)"),
    Rung("+ torch.compile", "bf16", "sdpa", True, False, False, "10-30 % faster (CLAIMS #4)"),
    Rung("+ fused AdamW", "bf16", "sdpa", True, True, False, "a few % (one kernel per step for all params)"),
    Rung("+ dynamic padding", "bf16", "sdpa", True, True, True, "proportional to the padding removed"),
)

# (atol, rtol) for comparing logits/loss: |a - b| <= atol + rtol * max|reference|, per the lower precision.
TOLERANCES: dict[str, tuple[float, float]] = {"fp32": (1e-5, 1e-4), "tf32": (2e-3, 1e-2),
                                              "bf16": (2e-2, 5e-2)}
_RANK = {"fp32": 0, "tf32": 1, "bf16": 2}

MODEL_SIZES: dict[str, dict[str, int]] = {  # BertConfig overrides; "base" is BertConfig() itself
    "base": {},
    "mini": dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024),
    "tiny": dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=512),
}


def bert_config(model: str, n_classes: int):
    """BERT-base shapes (or a smaller named size) with dropout off, so rungs can be compared exactly."""
    from transformers import BertConfig

    if model not in MODEL_SIZES:
        raise ValueError(f"unknown --model {model!r}: use one of {sorted(MODEL_SIZES)}")
    return BertConfig(**MODEL_SIZES[model], num_labels=n_classes, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0)


def corpus_lengths(seq: int) -> list[int]:
    """Token counts ([CLS] text [SEP], truncated to `seq`) of the bundled BBC News articles."""
    from transformers import AutoTokenizer

    from helpers.data import read_bundled_corpus
    from helpers.models import offline_bert_path

    texts, _, _ = read_bundled_corpus()
    tok = AutoTokenizer.from_pretrained(str(offline_bert_path()))  # BERT's uncased WordPiece vocabulary
    return [len(ids) for ids in tok(texts, truncation=True, max_length=seq)["input_ids"]]


def collate(idx: list[int], lengths: list[int], *, seq: int, bucketing: bool, vocab: int, n_classes: int,
            pad_multiple: int = 64, seed: int = 0) -> dict[str, torch.Tensor]:
    """Samples `idx` as one batch of random token ids (sample i always gets the same tokens), padded to
    `seq`, or (bucketing) to the longest sample rounded up to `pad_multiple` (fewer compiled shapes)."""
    lens = [min(lengths[i], seq) for i in idx]
    width = seq if not bucketing else min(seq, -(-max(lens) // pad_multiple) * pad_multiple)
    ids = torch.zeros(len(idx), width, dtype=torch.long)  # 0 = [PAD]
    mask = torch.zeros(len(idx), width, dtype=torch.long)
    for row, (i, n) in enumerate(zip(idx, lens)):
        tg = torch.Generator().manual_seed(seed * 1_000_003 + i)
        ids[row, :n] = torch.randint(1000, vocab, (n,), generator=tg)
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([i % n_classes for i in idx])}


def make_batches(lengths: list[int], *, batch: int, n_batches: int, seq: int, bucketing: bool,
                 vocab: int, n_classes: int, pad_multiple: int = 64, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """`n_batches` batches of the same randomly chosen samples whatever the batching: padded to `seq`, or
    (bucketing) grouped by length, each padded to its longest, the batches in random order."""
    g = torch.Generator().manual_seed(seed)
    need = batch * n_batches
    if len(lengths) < need:
        raise ValueError(f"need {need} lengths for {n_batches} batches of {batch}, got {len(lengths)}")
    order = torch.randperm(len(lengths), generator=g)[:need].tolist()
    if bucketing:
        order = sorted(order, key=lambda i: lengths[i])  # one bucket per batch of similar lengths
    groups = [order[i * batch:(i + 1) * batch] for i in range(n_batches)]
    if bucketing:  # batches in random order, as a bucketed sampler yields them
        groups = [groups[i] for i in torch.randperm(n_batches, generator=g).tolist()]
    return [collate(idx, lengths, seq=seq, bucketing=bucketing, vocab=vocab, n_classes=n_classes,
                    pad_multiple=pad_multiple, seed=seed) for idx in groups]


def agree(a: torch.Tensor, b: torch.Tensor, precision: str) -> tuple[bool, float, float]:
    """Whether `a` matches reference `b` within the tolerance of `precision`: (ok, max |a-b|, allowed)."""
    atol, rtol = TOLERANCES[precision]
    err = (a.float() - b.float()).abs().max().item()
    allowed = atol + rtol * b.float().abs().max().item()
    return err <= allowed, err, allowed


def _set_tf32(on: bool) -> None:
    # "high" lets fp32 matmuls use TF32 tensor cores on Ampere+; CPUs have no TF32 and ignore it
    torch.set_float32_matmul_precision("high" if on else "highest")
    torch.backends.cudnn.allow_tf32 = on


def _build(cfg, state: dict[str, torch.Tensor], rung: Rung, device: torch.device, lr: float):
    """A fresh model with `state` as weights and the rung's switches, its optimizer, and its callable."""
    from transformers import BertForSequenceClassification

    cfg = copy.deepcopy(cfg)
    cfg._attn_implementation = rung.attn
    model = BertForSequenceClassification(cfg)
    model.load_state_dict(state)
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=rung.fused, foreach=None if rung.fused else True)
    run = torch.compile(model) if rung.compile else model
    return model, opt, run


def _forward(run, batch: dict[str, torch.Tensor], rung: Rung, device: torch.device):
    from helpers.train import autocast_context

    with autocast_context("bf16" if rung.precision == "bf16" else "fp32", device):
        return run(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])


def _to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def _check_fused(model, lr: float) -> tuple[bool, float, float]:
    """One AdamW step, foreach vs fused, on copies of the same parameters and gradients."""
    params = [p for p in model.parameters() if p.grad is not None]
    res = []
    for fused in (False, True):
        ps = [p.detach().clone().float().requires_grad_(True) for p in params]
        for p, src in zip(ps, params):
            p.grad = src.grad.detach().clone().float()
        opt = torch.optim.AdamW(ps, lr=lr, fused=fused, foreach=None if fused else True)
        opt.step()
        res.append(torch.cat([p.detach().flatten() for p in ps]))
    return agree(res[1], res[0], "fp32")


def _peak_memory_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak_memory(device: torch.device) -> float | None:
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    return None  # CPU: no allocator statistics; lesson 03 shows how to measure it another way


def _peak_flops(device: torch.device, precision: str) -> tuple[float | None, str]:
    """Peak FLOP/s to compute MFU against, and where it came from: the datasheet's dense peak on known
    GPUs, else a matmul roofline measured now, with the threads and the load the rungs run under (a
    cached one from a busier or idler moment would make MFU meaningless, even above 100 %)."""
    from helpers.hardware import measure_roofline
    from helpers.flops import peak_flops

    peak = peak_flops(device, precision)
    if peak is None:
        cpu = device.type == "cpu"
        roof = measure_roofline(device, dtypes=["float32"] if cpu else None)
        peak = peak_flops(device, "fp32" if cpu else precision, roofline=roof)
    if peak is None:
        return None, "no peak available"
    return peak.flops, f"{peak.dtype} peak ({peak.source}, {peak.flops / 1e9:.3g} GFLOP/s)"


def _versions() -> dict[str, str]:
    import transformers

    v = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
    if torch.version.cuda:
        v["cuda"] = torch.version.cuda
    return v


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from helpers.hardware import device_report

    n = torch.get_num_threads()
    return f"{device_report().cpu.model} ({platform.machine()}), {n} thread{'' if n == 1 else 's'}"


def run_ladder(*, model: str = "base", seq: int = 512, batch: int = 32, n_batches: int = 8,
               device: str = "auto", min_run_time: float = 1.0, lr: float = 5e-5, rungs: tuple[Rung, ...] = RUNGS,
               lengths: list[int] | None = None, n_classes: int = 5, pad_multiple: int = 64,
               peak_flops: float | None = None,
               log=print) -> dict[str, Any]:
    """Check and time every rung; returns a JSON-ready dict of the results and the run's stamp."""
    from helpers.flops import model_flops_per_token
    from helpers.timing import benchmark, time_once

    if device == "auto":
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda asked for, but torch sees no CUDA GPU; use --device cpu or auto")
    if seq < 8 or batch < 1 or n_batches < 1:
        raise ValueError(f"need seq >= 8, batch >= 1, batches >= 1; got {seq}, {batch}, {n_batches}")
    cfg = bert_config(model, n_classes)
    if seq > cfg.max_position_embeddings:
        raise ValueError(f"seq {seq} exceeds BERT's {cfg.max_position_embeddings} positions")
    lengths_source = "given lengths" if lengths is not None else "BBC News token lengths"
    lengths = lengths if lengths is not None else corpus_lengths(seq)
    torch.manual_seed(0)
    from transformers import BertForSequenceClassification
    state = {k: v.clone() for k, v in BertForSequenceClassification(cfg).state_dict().items()}
    n_params = sum(v.numel() for k, v in state.items())
    batches = {b: make_batches(lengths, batch=batch, n_batches=n_batches, seq=seq, bucketing=b,
                               vocab=cfg.vocab_size, n_classes=n_classes, pad_multiple=pad_multiple)
               for b in (False, True)}
    # the check batch: the first padded batch's samples, padded as each rung pads them
    check_ids = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(0))[:batch].tolist()
    check = {b: collate(check_ids, lengths, seq=seq, bucketing=b, vocab=cfg.vocab_size, n_classes=n_classes,
                        pad_multiple=pad_multiple) for b in (False, True)}
    results, prev = [], None
    for rung in rungs:
        _set_tf32(rung.precision in ("tf32", "bf16"))  # cumulative: TF32 stays on for what runs in fp32
        torch._dynamo.reset()  # each compiled rung compiles afresh; its compile time is reported
        _peak_memory_reset(dev)
        mdl, opt, run = _build(cfg, state, rung, dev, lr)
        # 1. agreement with the previous rung: same weights, same samples, one forward pass
        cb = _to(check[rung.bucketing], dev)
        out, first_s = time_once(lambda: _forward(run, cb, rung, dev))  # also the compile, if any
        out.loss.backward()
        row: dict[str, Any] = {**asdict(rung), "first_call_s": first_s}
        ref_logits = out.logits.detach().float().cpu()
        ref_loss = out.loss.detach().float().cpu().reshape(1)
        if prev is not None:
            tol = rung.precision if _RANK[rung.precision] >= _RANK[prev[0]] else prev[0]
            ok_l, err_l, tol_l = agree(ref_logits, prev[1], tol)
            ok_s, err_s, tol_s = agree(ref_loss, prev[2], tol)
            row.update(check_logits_err=err_l, check_logits_tol=tol_l, check_loss_err=err_s, check_loss_tol=tol_s)
            if not (ok_l and ok_s):
                raise AssertionError(f"rung {rung.name!r} disagrees with {prev[3]!r}: logits |Δ| {err_l:.3g} "
                                     f"(allowed {tol_l:.3g}), loss |Δ| {err_s:.3g} (allowed {tol_s:.3g})")
        if rung.fused:
            ok, err, tol_f = _check_fused(mdl, lr)
            row.update(check_fused_err=err, check_fused_tol=tol_f)
            if not ok:
                raise AssertionError(f"fused AdamW step differs from foreach by {err:.3g} (allowed {tol_f:.3g})")
        prev = (rung.precision, ref_logits, ref_loss, rung.name)
        opt.zero_grad(set_to_none=True)
        # 2. time one pass over the rung's batches (the same samples for every rung)
        dev_batches = [_to(b, dev) for b in batches[rung.bucketing]]

        def one_pass() -> None:
            for b in dev_batches:
                _forward(run, b, rung, dev).loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

        _, warm_s = time_once(one_pass)  # warm-up: new shapes compile here (bucketing), allocator grows
        t = benchmark(one_pass, name=rung.name, warmup=0, min_run_time=min_run_time)
        n_samples = sum(len(b["labels"]) for b in dev_batches)
        real_tokens = sum(int(b["attention_mask"].sum()) for b in dev_batches)
        padded_tokens = sum(b["input_ids"].numel() for b in dev_batches)
        # FLOPs the hardware executes: every position of the padded batch, at the batch's own width
        flops = sum(b["input_ids"].numel() * model_flops_per_token(mdl, b["input_ids"].shape[1]) for b in dev_batches)
        row.update(warmup_pass_s=warm_s, pass_median_s=t.median_s, pass_iqr_s=t.iqr_s, runs=t.runs * t.calls_per_run,
                   samples_per_s=n_samples / t.median_s, tokens_per_s=real_tokens / t.median_s,
                   padded_fraction=1 - real_tokens / padded_tokens, flops_per_s=flops / t.median_s,
                   peak_memory_bytes=_peak_memory(dev))
        results.append(row)
        log(f"{rung.name:>20}: {row['samples_per_s']:8.2f} samples/s  (pass {t.median_s:.3f} s, "
            f"IQR {t.iqr_s:.3f} s; first call {first_s:.2f} s)")
        del mdl, opt, run, dev_batches
    _set_tf32(False)
    peak, peak_source = (peak_flops, "given peak") if peak_flops else _peak_flops(dev, "bf16")
    base = results[0]["samples_per_s"]
    for row in results:
        row["speedup"] = row["samples_per_s"] / base
        row["mfu"] = row["flops_per_s"] / peak if peak else None
    best = max(results, key=lambda r: r["samples_per_s"])
    return {
        "stamp": {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                  "device": _device_name(dev), "device_type": dev.type, "versions": _versions()},
        "setup": {"model": model, "params": n_params, "seq": seq, "batch": batch, "batches_per_pass": n_batches,
                  "lr": lr, "lengths": lengths_source,
                  "peak_flops": peak, "peak_source": peak_source, "tolerances": TOLERANCES},
        "rungs": results,
        "summary": {"best": best["name"], "speedup_best_vs_fp32_eager": best["speedup"], "best_mfu": best["mfu"]},
    }


def _slug(result: dict[str, Any]) -> str:
    if result["stamp"]["device_type"] == "cpu":
        return "cpu"
    return "cuda-" + re.sub(r"[^a-z0-9]+", "-", result["stamp"]["device"].lower()).strip("-")


def to_markdown(result: dict[str, Any]) -> str:
    """The ladder as a Markdown table under a stamp line."""
    from helpers.tables import Table

    s, u = result["stamp"], result["setup"]
    vers = ", ".join(f"{k} {v}" for k, v in s["versions"].items())
    table = Table(["rung", "samples/s", "tokens/s", "speed-up", "MFU", "peak memory GB", "padding",
                   "timed passes", "IQR %", "first call s", "claim"])
    for r in result["rungs"]:
        mem = r["peak_memory_bytes"] / 1e9 if r["peak_memory_bytes"] is not None else None
        mfu = f"{100 * r['mfu']:.1f} %" if r["mfu"] is not None else None
        table.add(r["name"], r["samples_per_s"], r["tokens_per_s"], f"{r['speedup']:.2f}x", mfu, mem,
                  f"{100 * r['padded_fraction']:.0f} %", r["runs"], 100 * r["pass_iqr_s"] / r["pass_median_s"],
                  r["first_call_s"], r["claim"])
    summ = result["summary"]
    mfu = f"{100 * summ['best_mfu']:.1f} %" if summ["best_mfu"] is not None else "n/a"
    return "\n".join([
        f"Ladder on **{s['device']}** ({vers}), {s['date']}.",
        f"BERT `{u['model']}` shapes ({u['params'] / 1e6:.1f} M params), seq {u['seq']}, batch {u['batch']}, "
        f"{u['batches_per_pass']} batches per timed pass of BBC-News-length samples; MFU against "
        f"{u['peak_source']}.",
        *([f"Note: {s['note']}"] if s.get("note") else []),
        "",
        table.to_markdown(),
        "",
        f"Best rung: **{summ['best']}**, {summ['speedup_best_vs_fp32_eager']:.2f}x the fp32 eager baseline; "
        f"MFU {mfu}.",
        *_targets(result),
    ])


TARGETS = {"speedup": 10.0, "mfu": 0.50}  # lesson 07's targets for BERT-base at seq 512 on an H100/H200-class GPU


def _targets(result: dict[str, Any]) -> list[str]:
    """Lines saying whether the GPU targets were met, and by how much they fell short if not."""
    s, u, summ = result["stamp"], result["setup"], result["summary"]
    if s["device_type"] != "cuda" or u["model"] != "base" or u["seq"] != 512:
        return ["", f"(The targets, >= {TARGETS['speedup']:.0f}x and >= {100 * TARGETS['mfu']:.0f} % MFU, apply to "
                    "BERT-base at seq 512 on an H100/H200-class GPU; this run is not that.)"]
    lines = [""]
    sp = summ["speedup_best_vs_fp32_eager"]
    lines.append(f"- Target speed-up >= {TARGETS['speedup']:.0f}x: {sp:.2f}x, "
                 + ("met." if sp >= TARGETS["speedup"] else f"short by {TARGETS['speedup'] / sp:.2f}x."))
    m = summ["best_mfu"]
    if m is None:
        lines.append("- Target MFU: no peak known for this GPU, not computed.")
    else:
        lines.append(f"- Target MFU >= {100 * TARGETS['mfu']:.0f} % (dense bf16 peak): {100 * m:.1f} %, "
                     + ("met." if m >= TARGETS["mfu"] else f"short by {100 * (TARGETS['mfu'] - m):.1f} points."))
    return lines


def write_results(result: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write `ladder-<device>.json`, `.md` and `.png` into `out_dir`; returns their paths."""
    from helpers.plots import ladder_chart

    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"ladder-{_slug(result)}"
    paths = {"json": stem.with_suffix(".json"), "md": stem.with_suffix(".md"), "png": stem.with_suffix(".png")}
    paths["json"].write_text(json.dumps(result, indent=2) + "\n")
    paths["md"].write_text(to_markdown(result) + "\n")
    fig = ladder_chart({r["name"]: r["samples_per_s"] for r in result["rungs"]},
                       title=f"BERT fine-tuning ladder, {result['stamp']['device']}\n"
                             f"({result['setup']['model']}, seq {result['setup']['seq']}, {result['stamp']['date'][:10]})")
    fig.savefig(paths["png"], dpi=120)
    return paths


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Command line: run the ladder and write the results."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="base", choices=sorted(MODEL_SIZES), help="BERT shapes (base = BertConfig())")
    p.add_argument("--seq", type=int, default=512, help="longest sequence (tokens)")
    p.add_argument("--batch", type=int, default=32, help="samples per step")
    p.add_argument("--batches", type=int, default=8, help="steps per timed pass")
    p.add_argument("--min-run-time", type=float, default=1.0, help="seconds of timed passes per rung (at least one)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--note", default="", help="a line about the conditions (shared machine, ...) for the results")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="folder for the results")
    args = p.parse_args(argv)
    result = run_ladder(model=args.model, seq=args.seq, batch=args.batch, n_batches=args.batches,
                        device=args.device, min_run_time=args.min_run_time)
    if args.note:
        result["stamp"]["note"] = args.note
    paths = write_results(result, args.out)
    print(to_markdown(result))
    print("wrote", ", ".join(str(p) for p in paths.values()))
    return result


if __name__ == "__main__":
    main()
