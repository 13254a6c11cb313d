"""matplotlib figures for the lessons. Every figure has a title, axis labels and units.

Each function returns the `Figure` (Jupyter draws it once; tests count its axes and read its labels).
Sections: shared, benchmarks, attention (lesson 01), memory and training (lessons 02–03),
input pipeline (lesson 05), capstone (lesson 07).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

__all__ = ["label_axes", "bar_chart", "roofline_chart"]


# --- shared -----------------------------------------------------------------------------------------

def label_axes(ax: Axes, title: str, xlabel: str, ylabel: str) -> Axes:
    """Set the title and both axis labels (units in brackets), the minimum every figure carries."""
    if not (title and xlabel and ylabel):
        raise ValueError("every figure needs a title and both axis labels, with units")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return ax


# --- benchmarks -------------------------------------------------------------------------------------

def bar_chart(values: Mapping[str, float], *, title: str, ylabel: str, xlabel: str = "variant",
              annotate: str = "{:.3g}", baseline: str | None = None) -> Figure:
    """One bar per variant, its value written on top; with `baseline`, the speed-up over it too."""
    if not values:
        raise ValueError("bar_chart needs at least one value")
    names, vals = list(values), list(values.values())
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(names)), 3.6))
    bars = ax.bar(names, vals, color="tab:blue")
    for bar, v in zip(bars, vals):
        text = annotate.format(v)
        if baseline is not None:
            text += f"\n{v / values[baseline]:.2f}×"
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.tick_params(axis="x", rotation=30)
    ax.margins(y=0.2)
    label_axes(ax, title, xlabel, ylabel)
    fig.tight_layout()
    return fig


def roofline_chart(roofline, points: Mapping[str, tuple[float, float]] | None = None) -> Figure:
    """Attainable FLOP/s against arithmetic intensity (log-log), one roof per dtype; `points` maps a
    kernel's name to its (FLOP per byte, FLOP/s)."""
    import numpy as np

    peak = max(roofline.matmul_flops.values())
    scale, unit = (1e12, "TFLOP/s") if peak > 5e12 else (1e9, "GFLOP/s")
    ridge = peak / roofline.bandwidth
    x = np.logspace(np.log10(ridge) - 3, np.log10(ridge) + 2, 200)  # FLOP per byte
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, flops in roofline.matmul_flops.items():
        ax.loglog(x, np.minimum(flops, roofline.bandwidth * x) / scale, label=f"{name} matmul roof")
    for name, (intensity, flops) in (points or {}).items():
        ax.loglog([intensity], [flops / scale], "o")
        ax.annotate(name, (intensity, flops / scale), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.legend(fontsize=8)
    label_axes(ax, f"Measured roofline: {roofline.device_name}", "arithmetic intensity [FLOP/byte]",
               f"attainable throughput [{unit}]")
    fig.tight_layout()
    return fig


# --- attention (lesson 01) --------------------------------------------------------------------------


# --- memory and training (lessons 02–03) ------------------------------------------------------------


# --- input pipeline (lesson 05) ---------------------------------------------------------------------


# --- capstone (lesson 07) ---------------------------------------------------------------------------
