"""The check of exercise 00-roofline (lesson 00, `00_setup`): FLOPs, bytes moved, arithmetic intensity
and regime of three fp32 ops (matmul, add, matvec), on the lesson's measured roofline and on made-up
ones; a wrong count is matched to the usual mistake (a multiply-add counted as one FLOP, the output's
bytes left out, the intensity compared with the peak instead of the ridge point).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from helpers.exercises.core import Wrong, close, unpack

__all__ = ["roofline_regime"]


_OPS = {  # op -> (FLOPs, bytes moved in fp32, bytes of the output alone), each tensor read or written once
    "matmul": lambda n: (2 * n ** 3, 3 * n * n * 4, n * n * 4),  # (n, n) @ (n, n)
    "add": lambda n: (n, 3 * n * 4, n * 4),  # x + y, n elements each
    "matvec": lambda n: (2 * n * n, (n * n + 2 * n) * 4, n * 4),  # (n, n) @ (n,)
}
_HALF_FLOPS = {"matmul": lambda n: n ** 3, "matvec": lambda n: n * n, "add": lambda n: n / 2}


def _regime(intensity: float, ridge: float) -> str:
    return "compute-bound" if intensity >= ridge else "memory-bound"


def _check_costs(op: str, n: int, flops: float, bytes_: float, intensity: float) -> None:
    want_f, want_b, out_b = _OPS[op](n)
    if not close(flops, want_f):
        if close(flops, _HALF_FLOPS[op](n)):
            raise Wrong("flops-multiply-add", f"{op} at n={n}: {flops:g} FLOPs, half of {want_f:g}",
                        "a multiply-add is two FLOPs (2n³ for the matmul, 2n² for the matrix-vector product)")
        raise Wrong("flops", f"{op} at n={n}: {flops:g} FLOPs, expected {want_f:g}",
                    "count one FLOP per multiply and one per add")
    if not close(bytes_, want_b):
        if close(bytes_, want_b - out_b):
            raise Wrong("bytes-output", f"{op} at n={n}: {bytes_:g} bytes, which leaves out the output's "
                        f"{out_b:g}", "the output is written to memory: count its bytes too")
        for size in (2, 8):
            if close(bytes_, want_b / 4 * size):
                raise Wrong("bytes-per-element", f"{op} at n={n}: {bytes_:g} bytes, {size} per element",
                            "an fp32 element is 4 bytes")
        raise Wrong("bytes", f"{op} at n={n}: {bytes_:g} bytes, expected {want_b:g}",
                    "count every input read once and the output written once, 4 bytes per fp32 element")
    if not close(intensity, want_f / want_b):
        raise Wrong("intensity", f"{op} at n={n}: intensity {intensity:g}, expected {want_f / want_b:g}",
                    "arithmetic intensity = FLOPs / bytes moved")


def _check_regime(op: str, n: int, regime: Any, roof: Any, label: str) -> None:
    want_f, want_b, _ = _OPS[op](n)
    intensity, ridge = want_f / want_b, roof.matmul_flops["fp32"] / roof.bandwidth
    want = _regime(intensity, ridge)
    if regime == want:
        return
    if regime not in ("compute-bound", "memory-bound"):
        raise Wrong("regime-name", f"regime {regime!r}", 'answer "compute-bound" or "memory-bound"')
    if regime in (_regime(intensity, roof.matmul_flops["fp32"]), _regime(intensity, roof.bandwidth)):
        raise Wrong("ridge", f"{op} at n={n} ({intensity:.3g} FLOP/byte) on {label} (ridge {ridge:.3g}): "
                    f"{regime}", "compare the intensity with the ridge point, peak FLOP/s / bandwidth "
                    "(FLOP per byte), not with the peak or the bandwidth alone")
    raise Wrong("regime", f"{op} at n={n} ({intensity:.3g} FLOP/byte) on {label} (ridge {ridge:.3g} "
                f"FLOP/byte): {regime}, expected {want}",
                "at or above the ridge point an op is compute-bound, below it memory-bound")


def roofline_regime(answer: Callable, roof: Any) -> str:
    """00-roofline: answer(op, n, roof) -> (FLOPs, bytes, intensity, regime) for matmul, add and matvec."""
    from helpers.roofline import Roofline

    made_up = [Roofline("made-up device", {"fp32": 1e12}, bw, 0, 0) for bw in (1e13, 1e12, 1e10, 1e8)]
    roofs = [(roof, "this machine's roofline"), *((r, f"a made-up roofline, ridge {r.ridge_point():g}")
                                                    for r in made_up)]
    for op in _OPS:
        for n in (64, 1000, 4096):
            for r, label in roofs:
                got = unpack(answer(op, n, r), 4, "flops, bytes_moved, intensity, regime")
                _check_costs(op, n, *got[:3])
                _check_regime(op, n, got[3], r, label)
    ridge = roof.matmul_flops["fp32"] / roof.bandwidth
    here = ", ".join(f"{op} {_regime(_OPS[op](4096)[0] / _OPS[op](4096)[1], ridge)}" for op in _OPS)
    return (f"FLOPs, bytes, intensity and regime of matmul, add and matvec at n = 64, 1000, 4096 agree, on "
            f"this machine's roofline (ridge {ridge:.3g} FLOP/byte) and on four made-up ones; at n=4096 "
            f"here: {here}")
