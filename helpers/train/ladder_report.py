"""Lesson 08's ladder report: each rung's row, the table, your stack's figures, and the reason for each
result from the facts of the device that ran it (benchmarks/ladder.py).
Guide: docs/library/train.md#helperstrainladder_report"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from helpers.core.device import device_facts
from helpers.core.tables import Table
from helpers.train.runspec import RunSpec

# helpers.train.ladder's classes, read by their fields: ladder imports this module, never the other way
Rung = Decision = Arm = Step = Any

__all__ = ["explain", "ladder_rows", "your_stack", "ladder_table"]


def _why_precision(rung: Rung, f: Mapping[str, Any]) -> str:
    gpu, cap = f["type"] == "cuda", f.get("cap", (0, 0))
    if rung.value == "tf32":
        if gpu and cap >= (8, 0):
            return "fp32 matmuls ran on TF32 tensor cores"
        if gpu:
            return (f"{f['name']} (compute capability {cap[0]}.{cap[1]}) has no TF32 units: the same fp32 "
                    "math ran")
        return "a CPU has no TF32 units: the same fp32 math ran"
    if rung.value == "fp16":
        if gpu and cap >= (7, 0):
            return ("matmuls on fp16 tensor cores, half the bytes moved; the GradScaler's loss scale keeps "
                    "small gradients from underflowing (steps with an overflow are skipped)")
        if gpu:
            return f"{f['name']} (compute capability {cap[0]}.{cap[1]}) has no fp16 tensor cores"
        return ("a CPU's fp16 matmuls have no fp16 units behind them: the casts and the loss scale cost, and "
                "any gain comes from moving half the bytes")
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
    what = {"packed": "documents packed into rows, kept apart by a document mask; a row's tail that no whole "
                      "document fits stays padding",
            "bucketed": "batches drawn from length buckets, each padded to its longest",
            "dynamic": "each batch padded to its own longest, in random order"}.get(rung.value, rung.claim)
    return what + before + after


def _verdict(decision: Decision) -> str:
    if getattr(decision, "too_busy", False):
        return f"{decision.busy}: no verdict, not kept (rerun on a quiet machine)"
    if decision.keep:
        return "faster beyond the noise: it pays here"
    if decision.ratio > 1:
        return f"faster by less than the noise (needs > {decision.threshold:.2f}x): not shown to pay here"
    return "not faster here"


def explain(rung: Rung, decision: Decision, device: torch.device, *,
            padded_removed: float | None = None, padded_left: float | None = None) -> str:
    """Why a rung measured what it did (ratio and verdict), from the facts of the device that ran it
    (lesson 08)."""
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


def _spec_of(row: Mapping[str, Any]) -> RunSpec:
    return RunSpec(**{f.name: row[f.name] for f in dataclasses.fields(RunSpec)})


def your_stack(rows: Sequence[Mapping[str, Any]], final: RunSpec) -> dict[str, Any]:
    """The final stack's name, speed-up, samples/s and MFU, and the baseline's, from its row's one timing
    session (lesson 08)."""
    row = next((r for r in reversed(rows[1:]) if "samples_per_s" in r and _spec_of(r) == final), rows[0])
    out = {"name": row["name"], "speedup": row["speedup"], "samples_per_s": row["samples_per_s"],
           "mfu": row.get("mfu"), "median_s": row["pass_median_s"], "passes": row["passes"]}
    out["baseline_samples_per_s"] = row.get("baseline_samples_per_s", rows[0]["samples_per_s"])
    out["baseline_median_s"] = row.get("baseline_median_s", rows[0]["pass_median_s"])
    return out


def ladder_rows(base: Arm, steps: Sequence[Step], device: torch.device, *,
                greedy: bool) -> list[dict[str, Any]]:
    """One JSON-ready row per stack: switches, numbers of one timing session, decision, why (lesson 08)."""
    rows = [{"name": "fp32 eager (baseline)", **dataclasses.asdict(base.stack), **base.row,
             "speedup": 1.0, "vs_below": None, "kept": True, "why": "the reference", "claim": "baseline"}]
    for s in steps:
        row: dict[str, Any] = {"name": s.rung.name, **dataclasses.asdict(s.stack), "claim": s.rung.claim}
        if s.arm is None:
            row.update(kept=False, why=s.note)
            if getattr(s, "skipped", False):  # the device cannot run it, or the model take it: not a failure
                row["skipped"] = s.note
        elif s.decision is None:
            row.update(kept=True, why="already in the stack")
        else:
            # padding removed by the padding rung: what the fixed-width baseline computed in vain
            pad = s.rung.switch == "padding"
            removed = base.row["padded_fraction"] if pad else None
            left = s.arm.row["padded_fraction"] if pad else None
            row.update(**s.arm.row, speedup=s.speedup, vs_below=s.decision.ratio,
                       threshold=s.decision.threshold, kept=s.decision.keep if greedy else True,
                       why=explain(s.rung, s.decision, device, padded_removed=removed, padded_left=left))
            if getattr(s.decision, "too_busy", False):  # no verdict: helpers.core.timing.busy's reasons
                row["too_busy"] = str(s.decision.busy)
        rows.append(row)
    return rows


def ladder_table(result: Mapping[str, Any]):
    """The ladder as a helpers.core.tables.Table (lesson 08)."""
    greedy = result["mode"] == "greedy"
    table = Table(["rung", "samples/s", "tokens/s (real)", "baseline samples/s, same timing", "speed-up",
                   "vs stack below", "MFU (useful FLOPs)", "peak memory GB", "padding", "IQR %",
                   "first call s", "kept" if greedy else "check"])
    for r in result["rows"]:
        if "samples_per_s" not in r:
            table.add(r["name"], *[None] * 10, r["why"])
            continue
        mem = r["peak_memory_bytes"] / 1e9 if r.get("peak_memory_bytes") else None
        mfu = f"{100 * r['mfu']:.1f} %" if r.get("mfu") is not None else None
        last = ("too busy to judge" if r.get("too_busy") else "yes" if r["kept"] else "no") if greedy \
            else r.get("check_logits", "reference")
        table.add(r["name"], r["samples_per_s"], r["tokens_per_s"],
                  r.get("baseline_samples_per_s", r["samples_per_s"]), f"{r['speedup']:.2f}x",
                  f"{r['vs_below']:.2f}x" if r["vs_below"] else "", mfu, mem,
                  f"{100 * r['padded_fraction']:.0f} %",
                  100 * r["pass_iqr_s"] / r["pass_median_s"], r["first_call_s"], last)
    return table
