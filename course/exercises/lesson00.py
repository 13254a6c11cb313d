"""The check of exercise 00-roofline (lesson 00, `00_setup`): FLOPs, bytes moved, arithmetic intensity and
regime of three fp32 ops (matmul, add, matvec), at sizes drawn per run, on the lesson's measured roofline and
on rooflines made up around each op's intensity: GPU-like ones whose bf16/fp16 rate is many times fp32's (so a
ridge taken from the fastest precision puts an fp32 op on the wrong side), CPU-like ones whose bf16 is slower
than fp32, precisions listed in different orders. A wrong count or regime is named only when it is what a
typical mistake gives at every size (a multiply-add counted once, the output's bytes left out, the ridge of
another precision, ...); otherwise the line says which number differs and by how much.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
from collections.abc import Callable
from typing import Any

from course.exercises.contract import Task, contract, reference, search
from course.exercises.core import Wrong, close, unpack

__all__ = ["roofline_regime", "task"]

_E = 4  # bytes per fp32 element
_OPS = {  # op -> n -> (FLOPs, elements moved, elements of the output), each tensor read or written once
    "matmul": lambda n: (2 * n ** 3, 3 * n * n, n * n),  # (n, n) @ (n, n)
    "add": lambda n: (n, 3 * n, n),  # x + y, n elements each
    "matvec": lambda n: (2 * n * n, n * n + 2 * n, n),  # (n, n) @ (n,)
}
_SIZES = {"matmul": (8, 4096), "add": (1_000, 100_000_000), "matvec": (8, 8192)}

_EXACT_ADDS_HINT = ("the roofline's convention counts every multiply-add as two FLOPs, the first product's "
                    "add included: 2n per output element")
_FLOP_MISTAKES = {  # op -> [(key, FLOPs that mistake gives, what, hint)]
    "matmul": [("flops-multiply-add", lambda n: n ** 3, "a multiply-add counted as one FLOP",
                "a multiply-add is two FLOPs: 2n³ for the matmul"),
               ("flops-exact-adds", lambda n: n * n * (2 * n - 1),
                "n multiplications and n − 1 additions per output element, n²(2n − 1)",
                f"{_EXACT_ADDS_HINT}: 2n³ for the matmul")],
    "matvec": [("flops-multiply-add", lambda n: n * n, "a multiply-add counted as one FLOP",
                "a multiply-add is two FLOPs: 2n² for the matrix-vector product"),
               ("flops-exact-adds", lambda n: n * (2 * n - 1),
                "n multiplications and n − 1 additions per output element, n(2n − 1)",
                f"{_EXACT_ADDS_HINT}: 2n² for the matrix-vector product")],
    "add": [("flops-add-doubled", lambda n: 2 * n, "two FLOPs per element of an add",
             "an add is one FLOP per element; only a multiply-add counts two")],
}
_BYTE_MISTAKES = {  # op -> [(key, bytes that mistake gives, what, hint)]
    "matmul": [("bytes-no-reuse", lambda n: (2 * n ** 3 + n * n) * _E,
                "A and B read once per multiply-add, as if nothing were reused",
                "the roofline counts the least traffic: each matrix read (or written) once, 3n² elements")],
    "matvec": [("bytes-no-reuse", lambda n: (2 * n * n + n) * _E,
                "the vector read again for every row",
                "the roofline counts the least traffic: the matrix and the vector read once, n² + 2n "
                "elements")],
    "add": [],
}


# op -> (what, hint) when one of the three tensors' bytes is left out (which one cannot be told)
_MISSING_TENSOR = {
    "matmul": ("two of the three n×n matrices counted (2n² elements)",
               "A and B are read and C is written: 3n² elements, 4 bytes each"),
    "add": ("two of the three vectors counted (8 bytes per element, as for x + x, which reads one input)",
            "x + y reads x and y and writes the sum: 3n elements, 12 bytes per element"),
    "matvec": ("the matrix and one of the two vectors counted (n² + n elements)",
               "the matrix and x are read and y is written: n² + 2n elements, 4 bytes each"),
}


def _bytes_generic(op: str) -> list[tuple[str, Callable[[int], float], str, str]]:
    def elems(n: int) -> int:
        return _OPS[op](n)[1]

    return [("bytes-missing-tensor", lambda n: (elems(n) - _OPS[op](n)[2]) * _E, *_MISSING_TENSOR[op]),
            ("bytes-per-element", lambda n: elems(n) * 2, "2 bytes per element", "an fp32 element is 4 "
                                                                                 "bytes"),
            ("bytes-per-element", lambda n: elems(n) * 8, "8 bytes per element", "an fp32 element is 4 "
                                                                                 "bytes"),
            ("bytes-in-elements", elems, "elements, not bytes", "bytes = elements × 4 for fp32")]


def _named(op: str, sizes: list[int], got: list[float],
           mistakes: list[tuple[str, Callable[[int], float], str, str]]) -> None:
    """Wrong naming the one mistake that gives what the answer gave at every size (none, or several: no
    name, the caller says what differs)."""
    matched = [(key, what, hint) for key, value, what, hint in mistakes
               if all(close(g, value(n)) for n, g in zip(sizes, got))]
    if len({m[0] for m in matched}) == 1:
        key, what, hint = matched[0]
        raise Wrong(key, f"{op}: {what} ({got[-1]:g} at n={sizes[-1]:,})", hint)


def _check_costs(op: str, sizes: list[int], rows: list[tuple]) -> None:
    """rows: (FLOPs, bytes, intensity) the answer gave at each size."""
    flops = [r[0] for r in rows]
    want = [_OPS[op](n)[0] for n in sizes]
    if not all(close(g, w) for g, w in zip(flops, want)):
        _named(op, sizes, flops, _FLOP_MISTAKES[op])
        n, g, w = next((n, g, w) for n, g, w in zip(sizes, flops, want) if not close(g, w))
        raise Wrong("flops", f"{op} at n={n:,}: {g:g} FLOPs, expected {w:g} ({g / w:.3g}x)",
                    "count two FLOPs per multiply-add (a multiply and an add), one per add alone")
    bytes_ = [r[1] for r in rows]
    want = [_OPS[op](n)[1] * _E for n in sizes]
    if not all(close(g, w) for g, w in zip(bytes_, want)):
        _named(op, sizes, bytes_, _BYTE_MISTAKES[op] + _bytes_generic(op))
        n, g, w = next((n, g, w) for n, g, w in zip(sizes, bytes_, want) if not close(g, w))
        raise Wrong("bytes", f"{op} at n={n:,}: {g:g} bytes, expected {w:g} ({g / w:.3g}x)",
                    "count every input read once and the output written once, 4 bytes per fp32 element")
    for n, (f, b, i) in zip(sizes, rows):
        if not close(i, f / b):
            if close(i, f // b):
                raise Wrong("intensity-floor-division", f"{op} at n={n:,}: intensity {i:g}, which is "
                            f"FLOPs // bytes rounded down, not {f / b:g}", "divide with `/`: `//` drops the "
                            "fraction (an add's 1/12 FLOP per byte becomes 0)")
            if close(i, b / f):
                raise Wrong("intensity-inverted", f"{op} at n={n:,}: intensity {i:g}, which is bytes / FLOPs",
                            "arithmetic intensity = FLOPs / bytes moved (FLOP per byte)")
            raise Wrong("intensity", f"{op} at n={n:,}: intensity {i:g}, expected {f / b:g}",
                        "arithmetic intensity = FLOPs / bytes moved")


# --- the regime ----------------------------------------------------------------------------------------

def _side(intensity: float, ridge: float) -> str:
    return "compute-bound" if intensity >= ridge else "memory-bound"


_REGIME_MISTAKES = {  # key -> (ridge-or-rule from (roof, intensity) -> regime, what, hint)
    "ridge-fastest": (lambda r, i: _side(i, max(r.matmul_flops.values()) / r.bandwidth),
                      "the ridge of the fastest precision",
                      'these ops are fp32: the ridge is roof.matmul_flops["fp32"] / roof.bandwidth; a GPU\'s '
                      "bf16 or fp16 rate puts its ridge many times higher"),
    "ridge-first-precision": (lambda r, i: _side(i, next(iter(r.matmul_flops.values())) / r.bandwidth),
                              "the ridge of the first precision the roofline lists",
                              'take the fp32 entry by name: roof.matmul_flops["fp32"]'),
    "ridge-tf32": (lambda r, i: _side(i, r.matmul_flops.get("tf32", r.matmul_flops["fp32"]) / r.bandwidth),
                   "the ridge of TF32 where the roofline lists it",
                   'these ops are fp32: TF32 is a matmul mode a program opts into, not what an add or a '
                   'matrix-vector product runs; the ridge is roof.matmul_flops["fp32"] / roof.bandwidth'),
    "ridge-slowest": (lambda r, i: _side(i, min(r.matmul_flops.values()) / r.bandwidth),
                      "the ridge of the slowest precision", 'these ops are fp32: roof.matmul_flops["fp32"]'),
    "ridge-not-a-ratio": (lambda r, i: _side(i, min(r.matmul_flops["fp32"], r.bandwidth)),
                          "the intensity compared with the peak FLOP/s or the bandwidth itself (every op "
                          "memory-bound)", "compare the intensity with the ridge point, peak FLOP/s / "
                                           "bandwidth "
                          "(FLOP per byte)"),
    "ridge-inverted": (lambda r, i: _side(i, r.bandwidth / r.matmul_flops["fp32"]),
                       "a ridge of bandwidth over peak FLOP/s",
                       "the ridge point is peak FLOP/s over bandwidth (FLOP per byte)"),
    "regime-inverted": (lambda r, i: ("memory-bound" if _side(i, r.matmul_flops["fp32"] / r.bandwidth)
                                      == "compute-bound" else "compute-bound"),
                        "the rule with the regimes swapped (compute-bound below the ridge)",
                        "at or above the ridge point an op is compute-bound (the arithmetic is the limit), "
                        "below it memory-bound"),
}


def _made_up_roofs(rng: random.Random, intensity: float) -> list[tuple[Any, str]]:
    """Rooflines around an op's intensity: on each side of its fp32 ridge, and with other precisions listed
    first or after fp32, so that the ridge of the fastest, of the slowest, of the first-listed precision and
    of TF32 each put the op on the wrong side of some of them (and not of the same ones): one GPU has the
    op's intensity between its TF32 ridge (6-10x fp32's) and its bf16 one (12-30x)."""
    from helpers.measure.roofline import Roofline

    def roof(label: str, fp32_ridge: float, order: tuple[str, ...], **others: float) -> tuple[Any, str]:
        bw = 10 ** rng.uniform(10, 12.7)  # 10 GB/s .. 5 TB/s
        flops = {k: fp32_ridge * bw * f for k, f in others.items()}
        flops["fp32"] = fp32_ridge * bw
        return Roofline(f"made-up {label}", {k: flops[k] for k in order}, bw, 0, 0), label

    def gpu() -> dict[str, float]:  # tensor cores: bf16 and fp16 12-30x fp32, TF32 6-10x
        return {"bf16": rng.uniform(12, 30), "fp16": rng.uniform(12, 30), "tf32": rng.uniform(6, 10)}

    gpu_label, cpu_label = "GPU (bf16/fp16 tensor cores 12-30x fp32)", "CPU without fast bf16 (bf16 slower)"
    return [
        roof("fp32-only device", intensity / rng.uniform(2, 8), ("fp32",)),
        roof("fp32-only device", intensity * rng.uniform(2, 8), ("fp32",)),
        roof(gpu_label, intensity / rng.uniform(1.3, 3), ("fp32", "tf32", "bf16", "fp16"), **gpu()),
        roof(gpu_label, intensity / rng.uniform(1.3, 3), ("bf16", "fp16", "fp32", "tf32"), **gpu()),
        roof(gpu_label, intensity / rng.uniform(11, 11.9), ("fp32", "tf32", "bf16", "fp16"), **gpu()),
        roof(cpu_label, intensity * rng.uniform(1.2, 2), ("bf16", "fp32"), bf16=1 / rng.uniform(2.5, 4)),
        roof(cpu_label, intensity * rng.uniform(1.2, 2), ("fp32", "bf16"), bf16=1 / rng.uniform(2.5, 4)),
    ]


def _check_regimes(cases: list[tuple[str, int, Any, str, Any]]) -> None:
    """cases: (op, n, roof, roof's label, the regime the answer gave)."""
    want = []
    for op, n, roof, label, got in cases:
        if got not in ("compute-bound", "memory-bound"):
            raise Wrong("regime-name", f"regime {got!r} ({op} at n={n:,} on {label})",
                        'answer "compute-bound" or "memory-bound"')
        flops, elems, _ = _OPS[op](n)
        want.append(_side(flops / (elems * _E), roof.matmul_flops["fp32"] / roof.bandwidth))
    got = [c[4] for c in cases]
    if got == want:
        return
    matched = [(key, what, hint) for key, (rule, what, hint) in _REGIME_MISTAKES.items()
               if [rule(roof, _OPS[op](n)[0] / (_OPS[op](n)[1] * _E)) for op, n, roof, _, _ in cases] == got]
    if len(matched) == 1:  # one mistake gives exactly these regimes: name it
        key, what, hint = matched[0]
        raise Wrong(key, f"every regime ({len(cases)} cases) is the one {what} gives", hint)
    _roof_ignored(cases, got, want)
    wrong = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    at_ridge = [i for i in wrong if cases[i][4] == "memory-bound" and _OPS[cases[i][0]](cases[i][1])[0] / (
        _OPS[cases[i][0]](cases[i][1])[1] * _E) == cases[i][2].matmul_flops["fp32"] / cases[i][2].bandwidth]
    if at_ridge == wrong:  # wrong only where the intensity is the ridge itself: `>` where `>=` is meant
        op, n, _, label, _ = cases[wrong[0]]
        raise Wrong("regime-at-ridge", f"{op} at n={n:,} on {label}: the op's intensity is the ridge itself, "
                    "and it answered memory-bound", "at or above the ridge an op is compute-bound: compare "
                    "with >=, not >")
    i = wrong[0]
    op, n, roof, label, regime = cases[i]
    intensity = _OPS[op](n)[0] / (_OPS[op](n)[1] * _E)
    ridge = roof.matmul_flops["fp32"] / roof.bandwidth
    raise Wrong("regime", f"{op} at n={n:,} ({intensity:.3g} FLOP/byte) on {label} (fp32 ridge {ridge:.3g} "
                f"FLOP/byte): {regime}, expected {want[i]}",
                "at or above the fp32 ridge point (peak fp32 FLOP/s / bandwidth) an op is compute-bound, "
                "below it memory-bound")


def _roof_ignored(cases: list[tuple[str, int, Any, str, Any]], got: list[str], want: list[str]) -> None:
    """Wrong when, for each op and size, the answer gives one regime on every roofline, though the right ones
    change with the roof: a ridge point of its own (a number copied from one roofline), not the roof's."""
    by_size: dict[tuple[str, int], tuple[set, set]] = {}
    for (op, n, *_), g, w in zip(cases, got, want):
        mine, right = by_size.setdefault((op, n), (set(), set()))
        mine.add(g)
        right.add(w)
    varied = [key for key, (mine, right) in by_size.items() if len(right) > 1]
    if varied and all(len(mine) == 1 for mine, _ in by_size.values()):
        op, n = varied[0]
        raise Wrong("ridge-hard-coded", f"{op} at n={n:,} is {next(iter(by_size[op, n][0]))} on every "
                    f"roofline ({sum(c[:2] == (op, n) for c in cases)} of them), though their fp32 ridge "
                    "points put it on both sides: the regime does not depend on the roofline",
                    'take the ridge from the roofline you are given, roof.matmul_flops["fp32"] / '
                    "roof.bandwidth: a number copied from this machine's roofline fits no other")


# --- the contract and the differential search ---------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Case:
    op: str
    n: int
    roof: Any
    label: str

    def __repr__(self) -> str:
        ridge = self.roof.matmul_flops["fp32"] / self.roof.bandwidth
        return f"op={self.op!r}, n={self.n:,} on {self.label} (fp32 ridge {ridge:.6g} FLOP/byte)"


def _exact_tie(op: str, n: int) -> bool:
    """Whether the op's intensity times its bytes is its FLOPs exactly: a roofline can then put the ridge on
    the intensity itself, and every way of writing the comparison sees the tie (matmul n = 6m: n/6 FLOP per
    byte; matvec n = 2^k - 2: a power-of-two denominator)."""
    flops, elems, _ = _OPS[op](n)
    return (flops / (elems * _E)) * (elems * _E) == flops and flops < 2 ** 52


def _tie_roof(rng: random.Random, op: str, n: int) -> tuple[Any, str]:
    from helpers.measure.roofline import Roofline

    flops, elems, _ = _OPS[op](n)
    bw = 2.0 ** rng.randint(33, 42)  # a power of two: fp32 / bw is the intensity, to the last bit
    fp32 = flops / (elems * _E) * bw
    return (Roofline("made-up tie", {"fp32": fp32, "bf16": 16 * fp32}, bw, 0, 0),
            "a made-up roofline whose fp32 ridge is the op's intensity exactly")


def _draw(rng: random.Random, roof: Any) -> _Case:
    """One case: small sizes (where shortcuts hide), sizes whose intensity can sit exactly on the ridge, and
    sizes across the whole range; on a roofline whose ridge is the op's intensity exactly, on one around it
    (GPU-like, CPU-like, fp32 only), or on the lesson's."""
    op = rng.choice(list(_OPS))
    lo, hi = _SIZES[op]
    kind = rng.random()
    if kind < 0.3:
        n = rng.randint(1, 40)
    elif kind < 0.55 and op != "add":
        n = 6 * rng.randint(1, hi // 6) if op == "matmul" else 2 ** rng.randint(2, 13) - 2
    else:
        n = int(math.exp(rng.uniform(0, math.log(hi))))
    flops, elems, _ = _OPS[op](n)
    where = rng.random()
    if where < 0.35 and _exact_tie(op, n):
        return _Case(op, n, *_tie_roof(rng, op, n))
    if where < 0.85:
        made_up, label = rng.choice(_made_up_roofs(rng, flops / (elems * _E)))
        return _Case(op, n, made_up, f"a made-up roofline ({label})")
    return _Case(op, n, roof, "this machine's roofline")


def _shrink(case: _Case) -> list[_Case]:
    smaller = sorted({1, 2, 6, case.n // 2, case.n - 1} - {case.n})
    return [dataclasses.replace(case, n=n) for n in smaller if 1 <= n < case.n]


def _agree(got: tuple, want: tuple, case: _Case) -> str | None:
    for i, what in enumerate(("FLOPs", "bytes moved", "intensity")):
        if not close(got[i], want[i], 1e-9):
            return f"its {what} {got[i]:.10g}, the solution's {want[i]:.10g}"
    return None if got[3] == want[3] else f"its regime {got[3]!r}, the solution's {want[3]!r}"


def _name_case(answer: Callable, case: _Case, got: tuple, want: tuple) -> None:
    """Name a known mistake on the case the search found (a count's, at its size; a regime wrong exactly at
    the ridge and right just below it); otherwise the search's line says what differs."""
    op, n = case.op, case.n
    if not close(got[0], want[0], 1e-9):
        _named(op, [n], [got[0]], _FLOP_MISTAKES[op])
    elif not close(got[1], want[1], 1e-9):
        _named(op, [n], [got[1]], _BYTE_MISTAKES[op] + _bytes_generic(op))
    elif got[3] != want[3] and got[3] in ("compute-bound", "memory-bound"):
        intensity, ridge = want[2], case.roof.matmul_flops["fp32"] / case.roof.bandwidth
        below = dataclasses.replace(case.roof, matmul_flops={"fp32": case.roof.matmul_flops["fp32"] * 0.999})
        if intensity == ridge and unpack(answer(op, n, below), 4, "")[3] == "compute-bound":
            raise Wrong("regime-at-ridge", f"{case}: the op's intensity is the ridge itself, and it answered "
                        f"{got[3]}", "at or above the ridge an op is compute-bound: compare with >=, not >")
        raise Wrong("regime", f"{case}: {got[3]}, expected {want[3]} (intensity {intensity:.6g} FLOP/byte)",
                    "at or above the fp32 ridge point (peak fp32 FLOP/s / bandwidth) an op is compute-bound, "
                    "below it memory-bound, at every size and for every op")


def _fresh(roof: Any) -> Any:
    """A copy of a roofline, its dict of peaks included (an answer may change the one it is given)."""
    return dataclasses.replace(roof, matmul_flops=dict(roof.matmul_flops))


def _validate(returned: Any, case: _Case) -> None:
    unpack(returned, 4, "flops, bytes_moved, intensity, regime")


def task(roof: Any) -> Task:
    """00-roofline's function for the contract and the search (draws on `roof` and made-up rooflines)."""
    return Task(reference("00_setup/intensity_and_regime.py", "intensity_and_regime"),
                draw=lambda rng: _draw(rng, roof),
                arguments=lambda c: {"op": c.op, "n": c.n, "roof": _fresh(c.roof)},
                agree=_agree, show=repr, shrink=_shrink, name="intensity_and_regime",
                result="what it returned", validate=_validate,
                hint="FLOPs and bytes from the op's shapes at every size, 4 bytes per fp32 element; "
                     "intensity = FLOPs / bytes; compute-bound at or above the fp32 ridge")


def roofline_regime(answer: Callable, roof: Any, seed: int) -> str:
    """00-roofline: answer(op, n, roof) -> (FLOPs, bytes, intensity, regime) for matmul, add and matvec at
    sizes drawn from `seed`, on the lesson's roofline and on made-up ones."""
    rng = random.Random(seed)
    the_task = task(roof)
    first = rng.choice(_made_up_roofs(rng, 1.0)[2:5])  # a GPU-like roofline: fp32 and three more precisions
    contract(answer, the_task, _Case("matmul", rng.randint(64, 512), first[0], first[1]))
    regimes, shown, made_up_count = [], [], 0
    for op, (lo, hi) in _SIZES.items():
        # two sizes anywhere in the range and one in its top quarter (in log scale): every run has a large
        # matmul, whose 2n³ FLOPs pass 2³¹ (an int32 count overflows; a Python loop counting them never ends)
        top = math.log(lo) + 0.75 * (math.log(hi) - math.log(lo))
        sizes = sorted({int(math.exp(rng.uniform(math.log(lo), math.log(hi)))) for _ in range(2)}
                       | {int(math.exp(rng.uniform(top, math.log(hi))))})
        rows = [unpack(answer(op, n, roof), 4, "flops, bytes_moved, intensity, regime") for n in sizes]
        _check_costs(op, sizes, [r[:3] for r in rows])
        regimes += [(op, n, roof, "this machine's roofline", r[3]) for n, r in zip(sizes, rows)]
        for n in sizes:
            flops, elems, _ = _OPS[op](n)
            for made_up, label in _made_up_roofs(rng, flops / (elems * _E)):
                got = unpack(answer(op, n, made_up), 4, "flops, bytes_moved, intensity, regime")
                regimes.append((op, n, made_up, f"a made-up roofline ({label})", got[3]))
                made_up_count += 1
        shown.append(f"{op} at n = {', '.join(f'{n:,}' for n in sizes)}")
    _check_regimes(regimes)
    searched = search(answer, the_task, rng, draws=150, name=functools.partial(_name_case, answer))
    ridge = roof.matmul_flops["fp32"] / roof.bandwidth
    big = {op: _SIZES[op][1] for op in _OPS}
    here = ", ".join(f"{op} {_side(_OPS[op](n)[0] / (_OPS[op](n)[1] * _E), ridge)}" for op, n in big.items())
    return (f"FLOPs, bytes, intensity and regime agree for {'; '.join(shown)}, on this machine's roofline "
            f"(fp32 ridge {ridge:.3g} FLOP/byte) and on {made_up_count} made-up ones (GPU-like "
            f"with fast bf16, CPU-like without, fp32 only), and as the course's solution on {searched} more "
            f"drawn inputs (sizes from 1, ridges on the intensity itself); at the largest sizes here: {here}")
