"""Attention against sequence length: time and peak memory of every implementation the device has.

Implementations: the naive formula (materialises the (N, N) scores), each SDPA backend (math, flash,
memory-efficient, cuDNN; one the device lacks is reported with torch's reason, not crashed on),
FlexAttention (compiled; its compile time is reported apart; not run below sm_80, where it is reported
broken: `helpers.model.attention.flex_refusal`) and the course's Triton kernel
(`helpers.model.kernels.flash_attention`,
with the tile configurations planned for this GPU's architecture, `helpers.model.kernels.configs`, which the
results record; on a CPU it runs through Triton's interpreter, so it is checked there but not timed:
interpreter times say nothing about the kernel).

On a GPU, a case whose estimated memory (`case_bytes`: the naive formula's two N×N matrices, the math
backend's fp32 ones, the fp32 reference it is checked against) does not fit in 90 % of the GPU's free
memory is reported "not run" with what it needs, not attempted: on a 15 GB T4 the naive formula stops at
N=4096 of the --gpu-target sizes. The GPU's precision follows its capability: bf16 from sm_80, fp16 below
(a T4 has no bf16 units).

Correct before fast: at every length each implementation is first compared with the math backend in fp32 on a
(1, 2, N, d) slice of the same inputs (tolerance per dtype in TOLERANCE); one that disagrees is reported as
wrong and not timed. Times are medians after warm-up (`helpers.core.timing.benchmark`); peak memory is
measured in a separate call (`helpers.measure.memory.peak_increase_bytes`).

Writes `attention_sweep-<slug>[-causal].json`, `.md` and `.png` into `--out` (default
benchmarks/results) through `course.results`, stamped with the device, versions and date: the JSON and
Markdown after every case (a run stopped from outside keeps what it measured), the figure after each pass.
At every length the Triton kernel runs first (with --gpu-target, the target length first as well).
`--time-budget` bounds a run: no case starts after it, except Triton's and SDPA's at the target length
(the point of --gpu-target); cases left are reported as "not run", never guessed.

    python benchmarks/attention_sweep.py                # this device's default sweep (small on a CPU)
    python benchmarks/attention_sweep.py --gpu-target   # the lesson's GPU target, one call: bf16 (fp16 below
                                                        # sm_80), d=128, N up to 8192, non-causal and causal,
                                                        # TFLOP/s vs the matmul peak, Triton vs best SDPA
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from course.results import stamp
from course.results import write_results as write_files
from helpers.core.device import get_device
from helpers.core.precision import PRECISION_DTYPE
from helpers.measure.roofline import measure_roofline, peak_flops

IMPLS = ("naive", "sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flex", "triton")
# |out - ref| <= tol + tol * |ref| against the fp32 math backend, per input precision
TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 3e-2}
# the dtype names this script took before the course's one vocabulary; still read, never written
OLD_NAMES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
INTERPRETER_MAX_LEN = 512  # longest N the Triton interpreter is asked to check (it runs in Python)
TARGET = dict(seq_len=4096, head_dim=128, dtype="bf16", ratio=1.3)  # the performance target
FREE_SHARE = 0.9  # a case runs only if its estimate fits in this share of the GPU's free memory
FUSED = ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flex", "triton")  # tiles: no (N, N) matrix stored


def gpu_dtype(device: torch.device) -> str:
    """The sweep's precision on a GPU: bf16 where it has bf16 tensor cores (sm_80+), else fp16."""
    return "bf16" if torch.cuda.get_device_capability(device) >= (8, 0) else "fp16"


def case_bytes(impl: str, seq_len: int, *, batch: int, heads: int, head_dim: int, dtype: str,
               total_memory: int) -> int:
    """Estimated peak memory of one case on a GPU with `total_memory` bytes: q, k, v and the output, the
    check against the fp32 math backend (on the full inputs or a (1, 2, N, d) slice, as `run_case` picks),
    and the implementation's own buffers."""
    from helpers.model.attention import naive_attention_bytes

    size = PRECISION_DTYPE[dtype].itemsize
    tensors = 4 * batch * heads * seq_len * head_dim * size
    full = batch * heads * seq_len**2 * 4 <= total_memory // 6
    b, h = (batch, heads) if full else (1, 2)
    check = 3 * b * h * seq_len**2 * 4  # fp32 math backend: about 2.5 fp32 N×N matrices (measured on a CPU)
    if impl == "naive":
        own = naive_attention_bytes(batch, heads, seq_len, seq_len, head_dim, PRECISION_DTYPE[dtype])
    elif impl == "sdpa-math":  # upcasts 16-bit inputs to fp32 (torch's default): fp32 matrices
        own = 3 * batch * heads * seq_len**2 * 4
    else:  # fused: the output and a row statistic
        own = batch * heads * seq_len * (head_dim * size + 4)
    return tensors + max(check, own)
RESULTS = Path(__file__).resolve().parent / "results"


def _attention_fn(impl: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  causal: bool) -> Callable[[], torch.Tensor]:
    """A no-argument call of one implementation on these inputs (FlexAttention's block mask built here)."""
    from helpers.model.attention import flex_attention_fn, naive_attention, sdpa_attention

    if impl == "naive":
        return lambda: naive_attention(q, k, v, causal=causal)
    if impl.startswith("sdpa-"):
        backend = impl.removeprefix("sdpa-")
        return lambda: sdpa_attention(q, k, v, causal=causal, backend=backend)
    if impl == "flex":
        from torch.nn.attention.flex_attention import create_block_mask

        block_mask = None
        if causal:
            block_mask = create_block_mask(lambda b, h, qi, ki: ki <= qi, None, None, q.shape[2], k.shape[2],
                                           device=q.device)
        flex = flex_attention_fn()
        return lambda: flex(q, k, v, block_mask=block_mask)
    if impl == "triton":
        from helpers.model.kernels import flash_attention

        return lambda: flash_attention(q, k, v, causal=causal)
    raise ValueError(f"unknown implementation {impl!r}: use some of {IMPLS}")


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:200]}" if text else type(err).__name__


def run_case(impl: str, seq_len: int, *, batch: int, heads: int, head_dim: int, dtype: str, causal: bool,
             device: torch.device, min_run_time: float) -> dict[str, Any]:
    """Check one implementation at one length against the math reference, then time it and measure memory."""
    from helpers.core.timing import benchmark, time_once
    from helpers.measure.memory import peak_increase_bytes
    from helpers.model.attention import attention_flops, sdpa_attention
    from helpers.model.kernels import uses_interpreter

    row: dict[str, Any] = dict(impl=impl, seq_len=seq_len, status="ok", reason="", median_s=None, iqr_s=None,
                               peak_bytes=None, tflops=None, max_abs_err=None, first_call_s=None)
    if device.type == "cuda":  # fits, or is not attempted
        free, total = torch.cuda.mem_get_info(device)
        need = case_bytes(impl, seq_len, batch=batch, heads=heads, head_dim=head_dim, dtype=dtype,
                          total_memory=total)
        if need > FREE_SHARE * free:
            row.update(status="not run", reason=f"needs ~{need / 2**30:.1f} GiB (estimate), the GPU has "
                                                f"{free / 2**30:.1f} GiB free")
            return row
        if impl == "flex":
            from helpers.model.attention import flex_refusal

            if why := flex_refusal(device):
                row.update(status="unavailable", reason=why)
                return row
    gen = torch.Generator(device=device).manual_seed(seq_len)
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, device=device, dtype=PRECISION_DTYPE[dtype],
                           generator=gen) for _ in range(3))
    interpreted = impl == "triton" and uses_interpreter(device)
    if interpreted and seq_len > INTERPRETER_MAX_LEN:
        row.update(status="not run", reason=f"Triton interpreter: too slow beyond N={INTERPRETER_MAX_LEN}; "
                                            "checked at the shorter lengths")
        return row
    try:
        with torch.no_grad():
            fn = _attention_fn(impl, q, k, v, causal)
            # compile / autotune on the full shape, timed apart
            if impl in ("flex", "triton") and not interpreted:
                _, row["first_call_s"] = time_once(fn)
            # correctness first, against fp32 math: on the full inputs if their fp32 score matrix fits
            # comfortably, else on a (1, 2, N, d) slice (the interpreter: a (1, 1, N, d) slice)
            # (the math backend holds ~3 such matrices: a sixth of the GPU's memory leaves room for the rest)
            limit = (torch.cuda.get_device_properties(device).total_memory // 6 if device.type == "cuda"
                     else 2**30)
            if interpreted:
                check = tuple(x[:1, :1].contiguous() for x in (q, k, v))
            elif batch * heads * seq_len**2 * 4 <= limit:
                check = (q, k, v)
            else:
                check = tuple(x[:1, :2].contiguous() for x in (q, k, v))
            ref = sdpa_attention(*(x.float() for x in check), causal=causal, backend="math")
            out = _attention_fn(impl, *check, causal)()
            err = (out.float() - ref).abs()
            row["max_abs_err"] = float(err.max())
            tol = TOLERANCE[dtype]
            if not bool((err <= tol + tol * ref.abs()).all()):
                row.update(status="wrong", reason="differs from the math backend by up to "
                                                  f"{row['max_abs_err']:.3g} "
                                                  f"(tolerance {tol:g})")
                return row
            del ref, out, err
            if interpreted:
                row.update(status="checked", reason="Triton interpreter: correct on a (1, 1, N, d) slice, "
                                                    "not "
                                                    "timed (interpreter speed says nothing about the kernel)")
                return row
            t = benchmark(fn, name=impl, warmup=2, min_run_time=min_run_time)
            row.update(median_s=t.median_s, iqr_s=t.iqr_s,
                       tflops=attention_flops(batch, heads, seq_len, seq_len, head_dim, causal)
                       / t.median_s / 1e12)
            row["peak_bytes"] = peak_increase_bytes(fn, device)
    except torch.cuda.OutOfMemoryError as err:
        row.update(status="out of memory", reason=_first_line(err))
        torch.cuda.empty_cache()
    except (RuntimeError, ValueError, NotImplementedError) as err:  # a backend the device lacks, and the like
        row.update(status="unavailable", reason=_first_line(err))
    return row


def sweep(seq_lens: list[int], *, impls: list[str], batch: int, heads: int, head_dim: int, dtype: str,
          causal: bool, device: torch.device, min_run_time: float, verbose: bool = True,
          deadline: float | None = None, protect: set[tuple[int, str]] = frozenset(),
          on_row: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Every implementation at every length, lengths in the order given, Triton first at each; returns the
    stamped results (rows as dicts). Cases after `deadline` (a `time.monotonic()` value) are reported "not
    run", except the (length, implementation) pairs in `protect`; `on_row(result so far)` after each case."""
    from tqdm.auto import tqdm

    dtype = OLD_NAMES.get(dtype, dtype)
    bad = [i for i in impls if i not in IMPLS]
    if bad or dtype not in TOLERANCE:
        raise ValueError(f"implementations must be among {IMPLS} and dtype among {list(TOLERANCE)}, "
                         f"got {bad or impls}, {dtype!r}")
    rows: list[dict[str, Any]] = []
    config = dict(seq_lens=sorted(seq_lens), batch=batch, heads=heads, head_dim=head_dim, dtype=dtype,
                  causal=causal, min_run_time=min_run_time, tolerance=TOLERANCE[dtype],
                  triton_tiles=triton_tiles(device, head_dim))
    # stamped again at the end: the load average then covers the sweep
    result: dict[str, Any] = {"stamp": stamp(device), "config": config, "rows": rows}
    first = sorted(impls, key=lambda i: i != "triton")  # Triton's cold compile first: a budget cut spares it
    cases = [(n, impl) for n in seq_lens for impl in first]
    for n, impl in tqdm(cases, desc="attention sweep", disable=not verbose):
        if deadline is not None and time.monotonic() > deadline and (n, impl) not in protect:
            rows.append(dict(impl=impl, seq_len=n, status="not run", reason="time budget spent",
                             median_s=None, iqr_s=None, peak_bytes=None, tflops=None, max_abs_err=None,
                             first_call_s=None))
            if on_row is not None:
                on_row(result)
            continue
        row = run_case(impl, n, batch=batch, heads=heads, head_dim=head_dim, dtype=dtype, causal=causal,
                       device=device, min_run_time=min_run_time)
        rows.append(row)
        if verbose:
            t = f"{row['median_s'] * 1e3:9.3f} ms" if row["median_s"] else f"{row['status']:>12}"
            m = f"{row['peak_bytes'] / 2**20:9.2f} MiB" if row["peak_bytes"] is not None else ""
            tqdm.write(f"N={n:6d} {impl:15s} {t} {m} {row['reason'][:90]}")
        if on_row is not None:
            on_row(result)
    result["stamp"] = stamp(device)
    return result


def triton_tiles(device: torch.device, head_dim: int) -> dict[str, list[str]] | str:
    """The tile configurations the Triton kernel launches with on this GPU at `head_dim`, per kernel (the
    forward autotunes over its list), or why there are none."""
    from helpers.model.kernels import configs

    if device.type != "cuda":
        return "no GPU: the interpreter runs 16x16 tiles"
    cc = tuple(torch.cuda.get_device_capability(device))
    try:
        return {k: [str(c) for c in configs.tile_configs(k, cc, head_dim)] for k in configs.KERNELS}
    except ValueError as err:
        return str(err)


def _impl_order(rows: list[dict[str, Any]]) -> list[str]:
    """The implementations of `rows`, in IMPLS order (the order they ran in puts Triton first)."""
    return sorted({r["impl"] for r in rows}, key=IMPLS.index)


def _slope(rows: list[dict[str, Any]], impl: str) -> float | None:
    """Log-log slope of peak memory against N between the shortest and longest measured lengths."""
    pts = sorted((r["seq_len"], r["peak_bytes"]) for r in rows if r["impl"] == impl and r["peak_bytes"])
    if len(pts) < 2 or pts[0][1] <= 0:
        return None
    (n0, m0), (n1, m1) = pts[0], pts[-1]
    return math.log(m1 / m0) / math.log(n1 / n0)


def gpu_target(result: dict[str, Any], peak: dict[str, Any]) -> dict[str, Any]:
    """Triton vs the fastest SDPA backend at the target length, and TFLOP/s against the matmul peaks
    (`peak`: "measured_flops" from this run's roofline, "datasheet_flops" and its "source" or None)."""
    n = TARGET["seq_len"]
    at_n = {r["impl"]: r for r in result["rows"] if r["seq_len"] == n and r["median_s"]}
    sdpa = {k: r for k, r in at_n.items() if k.startswith("sdpa-")}
    summary: dict[str, Any] = {"seq_len": n, "target_ratio": TARGET["ratio"], **peak}
    if "triton" not in at_n or not sdpa:
        summary["verdict"] = "not measured: Triton or every SDPA backend did not run at this length"
        return summary
    best = min(sdpa.values(), key=lambda r: r["median_s"])
    ratio = at_n["triton"]["median_s"] / best["median_s"]
    summary.update(best_sdpa=best["impl"], best_sdpa_ms=best["median_s"] * 1e3,
                   triton_ms=at_n["triton"]["median_s"] * 1e3, triton_over_best=ratio,
                   triton_tflops=at_n["triton"]["tflops"], best_sdpa_tflops=best["tflops"])
    for which in ("measured", "datasheet"):
        if peak.get(f"{which}_flops"):
            flops = peak[f"{which}_flops"]
            summary[f"triton_fraction_of_{which}_peak"] = at_n["triton"]["tflops"] * 1e12 / flops
            summary[f"best_sdpa_fraction_of_{which}_peak"] = best["tflops"] * 1e12 / flops
    within = ratio <= TARGET["ratio"]
    summary["verdict"] = (f"Triton takes {ratio:.2f}x the time of {best['impl']} at N={n}: "
                          f"{'within' if within else 'NOT within'} the {TARGET['ratio']}x target")
    return summary


def to_markdown(result: dict[str, Any]) -> str:
    """The results as Markdown: stamp, one table of times and one of peak memory (rows: N; columns: impls)."""
    s, c, rows = result["stamp"], result["config"], result["rows"]
    impls = _impl_order(rows)
    lines = [f"# Attention sweep: {s['device']}", "",
             f"torch {s['torch']}, triton {s['triton']}, CUDA {s['cuda']}, Python {s['python']}; "
             f"{s['date']}; load average {s.get('load_average_1min') or 0:.1f} on {s.get('cpu_count')} CPUs "
             "when it finished "
             "(a load above the CPU count means other work was competing for the cores)", "",
             f"B={c['batch']}, H={c['heads']}, d={c['head_dim']}, {c['dtype']}, "
             f"{'causal' if c['causal'] else 'non-causal'}; checked against the fp32 math backend "
             f"(tolerance {c['tolerance']:g}) before timing; median of timed runs after warm-up.", ""]
    tiles = c.get("triton_tiles")
    if isinstance(tiles, dict):
        lines += ["Triton tiles planned for this GPU: " + "; ".join(f"{k} {', '.join(v)}"
                                                                   for k, v in tiles.items()), ""]
    cell = {(r["seq_len"], r["impl"]): r for r in rows}
    for title, key, fmt in (("Median time (ms)", "median_s", lambda v: f"{v * 1e3:.3f}"),
                            ("Throughput (TFLOP/s, attention matmuls)", "tflops", lambda v: f"{v:.3g}"),
                            ("Peak memory above the inputs (MiB)", "peak_bytes",
                             lambda v: f"{v / 2**20:.2f}")):
        lines += [f"## {title}", "", "| N | " + " | ".join(impls) + " |", "|---" * (len(impls) + 1) + "|"]
        for n in c["seq_lens"]:
            vals = []
            for impl in impls:
                r = cell.get((n, impl))
                vals.append(fmt(r[key]) if r and r[key] is not None else (r["status"] if r else "–"))
            lines.append(f"| {n} | " + " | ".join(vals) + " |")
        lines.append("")
    slopes = {impl: _slope(rows, impl) for impl in impls}
    lines += ["## Memory growth", "", "Log-log slope of peak memory against N (2 = grows as N², 1 = as N):",
              ""]
    lines += [f"- {impl}: {sl:.2f}" for impl, sl in slopes.items() if sl is not None]
    notes = sorted({f"- {r['impl']}: {r['status']}: {r['reason']}" for r in rows if r["reason"]})
    compile_s = [f"- {r['impl']} at N={r['seq_len']}: {r['first_call_s']:.2f} s" for r in rows
                 if r["first_call_s"]]
    if compile_s:
        lines += ["", "## First call (compile / autotune), excluded from the times", "", *compile_s]
    if notes:
        lines += ["", "## Not timed", "", *notes]
    if "target" in result:
        t = result["target"]
        lines += ["", "## GPU target", "", f"{t['verdict']}."]
        if t.get("triton_tflops"):
            measured = f"{t['measured_flops'] / 1e12:.0f}" if t.get("measured_flops") else "?"
            sheet = (f"; datasheet {t['datasheet_flops'] / 1e12:.0f} TFLOP/s ({t['datasheet_source']})"
                     if t.get("datasheet_flops") else "; no datasheet peak for this GPU")
            lines.append(f"Triton {t['triton_tflops']:.0f} TFLOP/s, {t['best_sdpa']} "
                         f"{t['best_sdpa_tflops']:.0f} TFLOP/s; {t['dtype']} matmul peak measured in this "
                         f"run {measured} TFLOP/s{sheet}.")
    return "\n".join(lines) + "\n"


def write_results(result: dict[str, Any], out_dir: Path, figure: bool = True) -> list[Path]:
    """Write JSON, Markdown and (with `figure`) the sweep plot (PNG) named after the device; the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course.plots import attention_sweep_chart

    seq = result["config"]["seq_lens"]
    impls = _impl_order(result["rows"])
    cell = {(r["seq_len"], r["impl"]): r for r in result["rows"]}
    times = {i: [(cell.get((n, i)) or {}).get("median_s") for n in seq] for i in impls
             if figure and any((cell.get((n, i)) or {}).get("median_s") for n in seq)}
    mem = {i: [(cell.get((n, i)) or {}).get("peak_bytes") for n in seq] for i in times}
    c, s = result["config"], result["stamp"]
    fig = None
    if times:  # nothing timed (every case unavailable or not run): no figure
        fig = attention_sweep_chart(seq, times, mem, title=f"attention, B={c['batch']} H={c['heads']} "
                                    f"d={c['head_dim']} {c['dtype']}{' causal' if c['causal'] else ''} — "
                                    f"{s['device']}")
    paths = write_files("attention_sweep", result, to_markdown(result), fig=fig, out_dir=out_dir,
                        variant="causal" if c["causal"] else "")
    if fig is not None:
        plt.close(fig)
    return list(paths.values())  # json, md[, png]


def measure_peaks(device: torch.device, dtype: str) -> dict[str, Any]:
    """This run's measured matmul FLOP/s for `dtype`, and the datasheet's
    (`helpers.measure.roofline.peak_flops`)."""
    measured = measure_roofline(device, precisions=[dtype]).matmul_flops[dtype]
    sheet = peak_flops(device, dtype)
    return {"dtype": dtype, "measured_flops": measured, "datasheet_flops": sheet.flops if sheet else None,
            "datasheet_source": sheet.source if sheet else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--seq-lens", type=int, nargs="+", help="sequence lengths (default: per device)")
    p.add_argument("--batch", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--head-dim", type=int)
    p.add_argument("--dtype", choices=list(TOLERANCE))
    p.add_argument("--causal", action="store_true")
    p.add_argument("--impls", nargs="+", default=list(IMPLS), help=f"some of {IMPLS}")
    p.add_argument("--min-run-time", type=float, default=None, help="seconds of timed runs per case")
    p.add_argument("--gpu-target", action="store_true",
                   help="CUDA: bf16 (fp16 below sm_80), d=128, B=4, H=16, N=4096 first then 1024..8192, "
                        "non-causal then causal; Triton vs best SDPA at N=4096 and TFLOP/s against the "
                        "matmul peak; cases that do not fit the GPU's memory are reported, not run")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds for the sweep's cases: no case starts after it (default: none; 70 with "
                        "--gpu-target, whose non-causal pass may start cases until 2/3 of it, and whose "
                        "Triton and SDPA cases at the target length always run). A call takes the budget "
                        "plus start-up, the matmul peak and the case under way when it ends (a compile or "
                        "autotune): leave a caller's limit that margin")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)

    device = get_device("cuda" if args.gpu_target else args.device)
    gpu = device.type == "cuda"
    if not gpu:  # Triton must choose its interpreter before it is first imported (torch.compile imports it)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    seq_lens = args.seq_lens or ([1024, 2048, 4096, 8192] if args.gpu_target else
                                 [512, 1024, 2048, 4096, 8192, 16384] if gpu else
                                 [128, 256, 512, 1024, 2048])
    if args.gpu_target and TARGET["seq_len"] in seq_lens:  # the target length first: it survives a budget cut
        seq_lens = [TARGET["seq_len"]] + [n for n in seq_lens if n != TARGET["seq_len"]]
    sizes = dict(batch=args.batch or (4 if gpu else 1), heads=args.heads or (16 if gpu else 4),
                 head_dim=args.head_dim or (TARGET["head_dim"] if gpu else 64),
                 dtype=args.dtype or (gpu_dtype(device) if gpu else "fp32"),
                 min_run_time=args.min_run_time or 0.3, impls=args.impls, device=device)
    peak = measure_peaks(device, sizes["dtype"]) if args.gpu_target else None
    budget = args.time_budget if args.time_budget is not None else (70.0 if args.gpu_target else None)
    passes = [False, True] if args.gpu_target else [args.causal]
    shares = [2 / 3, 1.0] if args.gpu_target else [1.0]  # the non-causal pass holds the target comparison
    target = {(TARGET["seq_len"], i) for i in args.impls if i == "triton" or i.startswith("sdpa-")}
    start = time.monotonic()
    for i, causal in enumerate(passes):
        deadline = start + budget * shares[i] if budget else None
        protect = target if args.gpu_target and not causal else set()

        def keep(partial: dict[str, Any]) -> None:  # a run stopped from outside keeps every finished case
            if peak is not None:
                partial["target"] = gpu_target(partial, peak)
            write_results(partial, args.out, figure=False)

        result = sweep(seq_lens, causal=causal, deadline=deadline, protect=protect, on_row=keep, **sizes)
        if peak is not None:
            result["target"] = gpu_target(result, peak)
            print(result["target"]["verdict"])
        for path in write_results(result, args.out):
            print(f"wrote {path}")
    print(f"done in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
