"""A deep model's step from shallow copies (lessons 09, 10): every layer adds the same ops and bytes, and
every sequence the same activations, so a step of L layers and m sequences is bilinear in (L, m). Four fake
steps of 1-2 layers and 1-2 sequences give the op counts and the dry run of any size in seconds."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import fields, replace
from typing import Any

import torch
from torch import nn

from helpers.measure.memory import MemoryEstimate
from helpers.measure.opcount import OpCount

__all__ = ["LAYER_FIELDS", "layers_of", "with_layers", "bilinear", "counts_at", "memory_at", "corners_of"]

# where a model's config keeps its number of layers (Hugging Face's names; the course's SmallTransformer)
LAYER_FIELDS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")


def _config(model: nn.Module) -> Any:
    for m in model.modules():
        for cfg in (getattr(m, "config", None), getattr(m, "cfg", None)):
            if cfg is not None and any(isinstance(getattr(cfg, f, None), int) for f in LAYER_FIELDS):
                return cfg
    raise ValueError(
        f"{type(model).__name__} has no config with a number of layers ({', '.join(LAYER_FIELDS)}): "
        "plan it at its full depth instead"
    )


def layers_of(model: nn.Module) -> int:
    """The number of layers the model's config gives (lessons 09, 10)."""
    cfg = _config(model)
    return next(getattr(cfg, f) for f in LAYER_FIELDS if isinstance(getattr(cfg, f, None), int))


def with_layers(model: nn.Module, n: int) -> nn.Module:
    """The same architecture with `n` layers, on the meta device: nothing allocated (lesson 10)."""
    cfg = copy.deepcopy(_config(model))
    for f in LAYER_FIELDS:
        if isinstance(getattr(cfg, f, None), int):
            setattr(cfg, f, n)
    with torch.device("meta"):
        if hasattr(cfg, "build"):  # the course's TransformerConfig
            return cfg.build()
        return type(model)(cfg)


def bilinear(corners: Mapping[tuple[int, int], float], layers: int, rows: int) -> float:
    """The value at (layers, rows) of the bilinear form through its values at four corners (L, r), L in
    (1, 2), r in two sizes (lesson 10)."""
    if len(corners) != 4:
        raise ValueError(f"a bilinear form needs four corners, got {sorted(corners)}")
    (l1, r1), (l2, r2) = min(corners), max(corners)
    a, b, c, d = corners[l1, r1], corners[l2, r1], corners[l1, r2], corners[l2, r2]
    k, j = (layers - l1) / (l2 - l1), (rows - r1) / (r2 - r1)
    return a + k * (b - a) + j * (c - a) + k * j * (d - c - b + a)


def _zero(count: OpCount) -> OpCount:
    return replace(count, calls=0, flops=0.0, bytes_read=0.0, bytes_written=0.0)


def counts_at(
    corners: Mapping[tuple[int, int], Mapping[tuple[str, str], OpCount]], layers: int, rows: int
) -> dict[tuple[str, str], OpCount]:
    """Each op's calls, FLOPs and bytes at (layers, rows), from its counts at four corners: they are linear in
    the rows, so the two smallest sizes serve every size (lesson 10)."""
    sizes = sorted({r for _, r in corners})[:2]
    corners = {k: v for k, v in corners.items() if k[1] in sizes}
    keys = set().union(*(c.keys() for c in corners.values()))
    out = {}
    for key in keys:
        some = next(c[key] for c in corners.values() if key in c)
        at = {corner: counts.get(key, _zero(some)) for corner, counts in corners.items()}
        values = {
            f: bilinear({k: getattr(c, f) for k, c in at.items()}, layers, rows)
            for f in ("calls", "flops", "bytes_read", "bytes_written")
        }
        out[key] = replace(
            some, calls=max(round(values.pop("calls")), 0), **{k: max(v, 0.0) for k, v in values.items()}
        )
    return out


def _segment(
    corners: Mapping[tuple[int, int], MemoryEstimate], lo: int, hi: int, layers: int, rows: int
) -> MemoryEstimate:
    """The dry run's terms, peak and categories at (layers, rows) from the four corners at rows lo and hi."""
    corners = {k: v for k, v in corners.items() if k[1] in (lo, hi)}
    one = corners[min(corners)]
    terms = ("parameters", "gradients", "optimizer", "weight_copies", "activations", "temporary")
    ints = {
        f.name: max(round(bilinear({k: getattr(e, f.name) for k, e in corners.items()}, layers, rows)), 0)
        for f in fields(MemoryEstimate)
        if f.name in terms
    }
    peak = bilinear({k: e.peak for k, e in corners.items()}, layers, rows)
    at_peak = {
        c: max(round(bilinear({k: e.at_peak.get(c, 0) for k, e in corners.items()}, layers, rows)), 0)
        for c in set().union(*(e.at_peak for e in corners.values()))
    }
    return replace(
        one,
        **ints,
        batch_size=rows,
        dry_run_peak=max(round(peak), 0),
        at_peak=at_peak,
        assumes=(*one.assumes, f"extrapolated from dry runs of 1 and 2 layers at {lo} and {hi} sequences"),
    )


def _moment(e: MemoryEstimate) -> bool:
    """Whether a dry run peaked with gradients alive (late in the backward, the optimizer step), not after the
    forward."""
    return e.at_peak.get("Gradient", 0) > 0


def consistent(corners: Mapping[tuple[int, int], MemoryEstimate], lo: int, hi: int) -> bool:
    """Whether the four corners at rows lo and hi peaked at one moment: only then is each category bilinear
    between them (lesson 10)."""
    return len({_moment(e) for (_, r), e in corners.items() if r in (lo, hi)}) == 1


def memory_at(corners: Mapping[tuple[int, int], MemoryEstimate], layers: int, rows: int) -> MemoryEstimate:
    """The dry run at (layers, rows) from its corners: the largest segment's bilinear answer (lesson 10)."""
    # the peak is the largest of several moments' bytes (the backward's, the optimizer step's), each bilinear:
    # a 1-2-layer copy at one sequence can peak at its optimizer step where the whole model peaks in its
    # backward. A segment whose corners peaked at different moments is still its sizes' best line
    sizes = sorted({r for _, r in corners})
    segments = list(zip(sizes, sizes[1:]))
    usable = segments
    # a segment speaks for the sizes up to its upper end (below it, a moment its copies did not show may
    # take over: the larger answer counts); above the last size, the last segment's moment holds the peak
    found = [_segment(corners, lo, hi, layers, rows) for lo, hi in usable if rows <= hi] or [
        _segment(corners, *usable[-1], layers, rows)
    ]
    # a moment seen with gradients alive (late in the backward) grows with the batch too: extrapolated up,
    # it bounds the peak from below where a segment above shows another moment
    found += [_segment(corners, lo, hi, layers, rows) for lo, hi in usable
              if hi < rows and _moment(corners[1, hi]) and _moment(corners[2, hi])]
    return max(found, key=lambda e: e.peak)


def corners_of(
    run: Callable[[nn.Module, int], Any],
    model: nn.Module,
    rows: tuple[int, ...] = (1, 2),
    *,
    prepare: Callable[[nn.Module], nn.Module] | None = None,
) -> dict[tuple[int, int], Any]:
    """`run(model, rows)` at the corners: the model with 1 and 2 layers, each made ready by `prepare` (LoRA,
    checkpointing: what a rebuilt copy would lose), at each number of sequences in `rows` (lesson 10)."""
    out = {}
    for n in (1, 2):
        shallow = with_layers(model, n)
        shallow = prepare(shallow) if prepare is not None else shallow
        for r in rows:
            out[n, r] = run(shallow, r)
    return out
