"""matplotlib figures for the lessons. Every figure has a title, axis labels and units.

Each function returns the `Figure` (Jupyter draws it once; tests count its axes and read its labels).
Sections: shared, benchmarks, attention (lesson 01), memory and training (lessons 02–03),
input pipeline (lesson 06), capstone (lesson 08). One module (about 420 lines) because the figures share one
style and one set of helpers, and a lesson imports its charts from one place.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from helpers.core.compat import optional_import

plt = optional_import("matplotlib.pyplot", "course.plots (the lessons' figures)")
Axes = optional_import("matplotlib.axes", "course.plots").Axes
Figure = optional_import("matplotlib.figure", "course.plots").Figure

__all__ = ["label_axes", "bar_chart", "roofline_chart", "ladder_chart", "confusion_matrix_chart",
           "attention_map_chart", "attention_grid_chart", "attention_sweep_chart", "memory_breakdown_chart",
           "memory_timeline_chart", "loss_curves_chart", "length_histogram_chart", "step_breakdown_chart",
           "where_time_goes_chart"]


# --- shared -----------------------------------------------------------------------------------------

def label_axes(ax: Axes, title: str, xlabel: str, ylabel: str) -> Axes:
    """Set the title and both axis labels (units in brackets), the minimum every figure carries
    (every lesson)."""
    if not (title and xlabel and ylabel):
        raise ValueError("every figure needs a title and both axis labels, with units")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return ax


# --- benchmarks -------------------------------------------------------------------------------------

def bar_chart(values: Mapping[str, float], *, title: str, ylabel: str, xlabel: str = "variant",
              annotate: str = "{:.3g}", baseline: str | None = None) -> Figure:
    """One bar per variant, its value written on top; with `baseline`, also its ratio to that bar
    (lessons 01–08)."""
    if not values:
        raise ValueError("bar_chart needs at least one value")
    names, vals = list(values), list(values.values())
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(names)), 3.6))
    bars = ax.bar(names, vals, color="tab:blue")
    for bar, v in zip(bars, vals):
        text = annotate.format(v)
        if baseline is not None:
            text += f"\n{v / values[baseline]:.2f}×"  # the ratio; what it is relative to is said once, below
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    if baseline is not None:  # a time ratio of 29x must not read as a speed-up: name the baseline
        ax.text(0.01, 0.98, f"n.nn× = value / {baseline}'s value", transform=ax.transAxes, ha="left",
                va="top", fontsize=8, color="dimgray")
    ax.tick_params(axis="x", rotation=30)
    ax.margins(y=0.2)
    label_axes(ax, title, xlabel, ylabel)
    fig.tight_layout()
    return fig


def roofline_chart(roofline, points: Mapping[str, tuple[float, float]] | None = None) -> Figure:
    """Attainable FLOP/s against arithmetic intensity (log-log), one roof per dtype; `points` maps a
    kernel's name to its (FLOP per byte, FLOP/s) (lesson 00)."""
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

def _as_2d_list(weights) -> list[list[float]]:  # noqa: ANN001 - a tensor, an array or nested lists
    data = weights.detach().cpu().tolist() if hasattr(weights, "detach") else (
        weights.tolist() if hasattr(weights, "tolist") else [list(r) for r in weights])
    if not data or not isinstance(data[0], list) or any(len(r) != len(data) for r in data):
        shape = getattr(weights, "shape", None)
        got = tuple(shape) if shape is not None else "?"
        raise ValueError(f"need a square (tokens, tokens) map, got shape {got}")
    return data


def attention_map_chart(weights, tokens: Sequence[str], *, title: str = "attention map",  # noqa: ANN001
                        ax: Axes | None = None, highlight: int | None = None) -> Figure:
    """One attention map (query rows × key columns), tokens on both axes; `highlight` frames a query row
    (lesson 01). Pass one text's maps (`capture_attention_maps` cuts them to its real tokens, no [PAD])."""
    data = _as_2d_list(weights)
    if len(tokens) != len(data):
        raise ValueError(f"{len(tokens)} token labels for a map of shape ({len(data)}, {len(data)}): "
                         "need one label per row and column")
    if ax is None:
        size = min(9.0, 2.5 + 0.28 * len(data))
        fig, ax = plt.subplots(figsize=(size + 1.0, size))
    else:
        fig = ax.figure
    image = ax.imshow(data, cmap="viridis", vmin=0.0, aspect="equal")
    ax.set_xticks(range(len(tokens)), labels=list(tokens), rotation=90, fontsize=8)
    ax.set_yticks(range(len(tokens)), labels=list(tokens), fontsize=8)
    if highlight is not None:
        if not 0 <= highlight < len(data):
            raise ValueError(f"highlight must be a row index in [0, {len(data)}), got {highlight}")
        ax.add_patch(plt.Rectangle((-0.5, highlight - 0.5), len(data), 1, fill=False, edgecolor="red", lw=2))
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04,
                 label="attention weight (probability, sums to 1 per row)")
    label_axes(ax, title, "key token (attended to)", "query token (attending)")
    return fig


def attention_grid_chart(maps, *, layers: Sequence[int] | None = None,  # noqa: ANN001 - (L, H, T, T)
                         heads: Sequence[int] | None = None,
                         title: str = "attention maps by layer and head") -> Figure:
    """A grid of small attention maps: one row per layer, one column per head (token labels omitted)
    (lesson 01)."""
    shape = tuple(getattr(maps, "shape", ()))
    if len(shape) != 4 or shape[-1] != shape[-2]:
        raise ValueError(f"need maps of shape (layers, heads, tokens, tokens), got {shape}")
    layers = list(range(shape[0])) if layers is None else list(layers)
    heads = list(range(shape[1])) if heads is None else list(heads)
    bad_layer = any(not 0 <= i < shape[0] for i in layers)
    if not layers or not heads or bad_layer or any(not 0 <= j < shape[1] for j in heads):
        raise ValueError(f"layers must index [0, {shape[0]}) and heads [0, {shape[1]}), "
                         f"got {layers}, {heads}")
    fig, axes = plt.subplots(len(layers), len(heads), figsize=(1.6 * len(heads) + 1, 1.6 * len(layers) + 0.8),
                             squeeze=False)
    for r, layer in enumerate(layers):
        for c, head in enumerate(heads):
            ax = axes[r][c]
            ax.imshow(_as_2d_list(maps[layer][head]), cmap="viridis", vmin=0.0)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"layer {layer}, head {head}", fontsize=7)
            if r == len(layers) - 1:
                ax.set_xlabel("key (token index)", fontsize=7)
            if c == 0:
                ax.set_ylabel("query (token index)", fontsize=7)
    fig.suptitle(f"{title} (colour: attention weight, 0 to 1)")
    fig.tight_layout()
    return fig


def attention_sweep_chart(seq_lens: Sequence[int], times_s: Mapping[str, Sequence[float | None]],
                          peak_bytes: Mapping[str, Sequence[float | None]], *,
                          title: str = "attention vs sequence length") -> Figure:
    """Time and peak memory against sequence length, log-log, one line per implementation (None = not run)
    (lesson 01)."""
    n = len(seq_lens)
    for what, table in (("times_s", times_s), ("peak_bytes", peak_bytes)):
        bad = {name: len(vals) for name, vals in table.items() if len(vals) != n}
        if bad:
            raise ValueError(f"{what}: every implementation needs {n} values (one per sequence length), "
                             f"got {bad}")
    if not times_s:
        raise ValueError("attention_sweep_chart needs at least one implementation")
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4))
    for ax, table, scale in ((ax_t, times_s, 1e3), (ax_m, peak_bytes, 1 / 2**20)):
        for name, vals in table.items():
            pts = [(s, v * scale) for s, v in zip(seq_lens, vals) if v is not None and v > 0]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    # a dashed guide of slope 2 (∝ N²) from the largest first memory point, to read the slopes against
    starts = [vals[0] for vals in peak_bytes.values() if vals and vals[0]]
    if starts and n > 1:
        v0, s0 = max(starts) / 2**20, seq_lens[0]
        ax_m.plot([s0, seq_lens[-1]], [v0, v0 * (seq_lens[-1] / s0) ** 2], "k--", lw=1, label="∝ N² (guide)")
    label_axes(ax_t, "time per call", "sequence length N (tokens)", "median time (ms)")
    label_axes(ax_m, "peak memory per call", "sequence length N (tokens)", "peak memory (MiB)")
    ax_t.legend(fontsize=8)
    ax_m.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig



# --- memory and training (lessons 02–03) ------------------------------------------------------------

def memory_breakdown_chart(breakdowns: Mapping[str, Mapping[str, float]], *, title: str,
                           unit: str = "MiB") -> Figure:
    """Stacked bars: one bar per run or estimate, one colour per memory term (values in bytes) (lesson 03)."""
    scale = {"B": 1, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30, "GB": 1e9}
    if unit not in scale:
        raise ValueError(f"unit must be one of {list(scale)}, got {unit!r}")
    if not breakdowns:
        raise ValueError("memory_breakdown_chart needs at least one breakdown {bar: {term: bytes}}")
    names = list(breakdowns)
    terms = list(dict.fromkeys(t for b in breakdowns.values() for t in b))  # first-seen order
    fig, ax = plt.subplots(figsize=(max(5.5, 1.3 * len(names) + 3), 4.0))
    bottom = [0.0] * len(names)
    for term in terms:
        vals = [breakdowns[n].get(term, 0) / scale[unit] for n in names]
        ax.bar(names, vals, bottom=bottom, label=term)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, total in enumerate(bottom):
        ax.annotate(f"{total:.3g}", (i, total), ha="center", va="bottom", fontsize=8)
    ax.tick_params(axis="x", rotation=20)
    ax.margins(y=0.15)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    label_axes(ax, title, "run", f"memory [{unit}]")
    fig.tight_layout()
    return fig


def memory_timeline_chart(times_s: Sequence[float], bytes_by_category: Mapping[str, Sequence[float]], *,
                          title: str, unit: str = "MiB") -> Figure:
    """Memory held over time, stacked by category (e.g. a `helpers.measure.memory.MemoryTimeline`) (lesson
    03)."""
    scale = {"KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30}
    if unit not in scale:
        raise ValueError(f"unit must be one of {list(scale)}, got {unit!r}")
    series = {k: [v / scale[unit] for v in vals] for k, vals in bytes_by_category.items() if any(vals)}
    if not times_s or not series:
        raise ValueError("memory_timeline_chart needs times and at least one non-empty category")
    if any(len(v) != len(times_s) for v in series.values()):
        raise ValueError("every category needs one value per time")
    fig, ax = plt.subplots(figsize=(8.0, 4.0))
    ax.stackplot([t * 1e3 for t in times_s], list(series.values()), labels=list(series), step="post")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    label_axes(ax, title, "time [ms]", f"memory held [{unit}]")
    fig.tight_layout()
    return fig


def loss_curves_chart(runs: Mapping[str, Sequence[float]], *, title: str,
                      ylabel: str = "training loss [nats]", xlabel: str = "optimizer step",
                      logy: bool = False,
                      marks: Mapping[str, Sequence[int]] | None = None) -> Figure:
    """Several runs' curves on one axis (loss per step, or a GradScaler's scale); `marks` put an x on
    chosen steps of a run (e.g. the steps a GradScaler skipped) (lesson 02)."""
    if not runs or not all(len(v) for v in runs.values()):
        raise ValueError("loss_curves_chart needs at least one non-empty run {name: values}")
    fig, ax = plt.subplots(figsize=(7.0, 4.0))
    for name, values in runs.items():
        (line,) = ax.plot(range(len(values)), list(values), label=name, linewidth=1.4)
        for step in (marks or {}).get(name, []):
            if 0 <= step < len(values):
                ax.plot(step, values[step], "x", color=line.get_color(), markersize=8)
    if logy:
        ax.set_yscale("log", base=2)
    ax.legend(fontsize=8)
    label_axes(ax, title, xlabel, ylabel)
    fig.tight_layout()
    return fig


# --- input pipeline (lesson 06) ---------------------------------------------------------------------

def length_histogram_chart(lengths: Sequence[int], *, title: str, max_length: int | None = None,
                           bins: int = 40) -> Figure:
    """Histogram of sequence lengths in tokens, with the truncation length drawn as a line (lesson 06)."""
    if len(lengths) == 0:
        raise ValueError("length_histogram_chart needs at least one length")
    fig, ax = plt.subplots(figsize=(6.0, 3.4))
    ax.hist(list(lengths), bins=bins, color="tab:blue")
    if max_length is not None:
        ax.axvline(max_length, color="tab:red", linestyle="--", label=f"truncation at {max_length}")
        ax.legend()
    label_axes(ax, title, "length [tokens]", "sequences [count]")
    fig.tight_layout()
    return fig


def step_breakdown_chart(phases_s: Mapping[str, float], *, title: str) -> Figure:
    """Where one training step's time goes: one horizontal bar per phase, in ms and % of the step
    (lesson 06)."""
    if not phases_s or any(v < 0 for v in phases_s.values()):
        raise ValueError(f"step_breakdown_chart needs phase -> seconds (>= 0), got {dict(phases_s)!r}")
    names, ms = list(phases_s), [v * 1e3 for v in phases_s.values()]
    total = sum(ms) or 1.0
    fig, ax = plt.subplots(figsize=(6.5, 0.5 * len(names) + 1.5))
    bars = ax.barh(names, ms, color="tab:blue")
    for bar, v in zip(bars, ms):
        ax.annotate(f"{v:.3g} ms ({100 * v / total:.0f} %)",
                    (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                    xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    ax.invert_yaxis()  # phases top to bottom in the order of the step
    ax.margins(x=0.3)
    label_axes(ax, title, "time per step [ms]", "phase")
    fig.tight_layout()
    return fig


# --- capstone (lesson 08) ---------------------------------------------------------------------------

def ladder_chart(speedups: Mapping[str, float], *, title: str, accuracy: Mapping[str, float] | None = None,
                 kept: Mapping[str, bool] | None = None,
                 vs_below: Mapping[str, float] | None = None) -> Figure:
    """The speed ladder: each stack's speed-up over the baseline, timed beside it (never a late timing over
    an early one), written on its bar; with `kept` (the greedy ladder) the rungs kept in your stack solid
    and the dropped ones pale and hatched, with a legend; with `vs_below`, each rung's ratio to the stack
    below it (the keep rule's number, from the same session) written inside its bar; with `accuracy`, each
    rung's validation accuracy as dots on a second axis (no speed bought with accuracy) (lesson 08)."""
    from matplotlib.patches import Patch

    if not speedups:
        raise ValueError("ladder_chart needs at least one rung")
    for name, given in (("accuracy", accuracy), ("kept", kept), ("vs_below", vs_below)):
        if given is not None and set(given) - set(speedups):
            raise ValueError(f"{name} names rungs that have no speed: {sorted(set(given) - set(speedups))}")
    fig = bar_chart(speedups, title=title, ylabel="speed-up over the baseline [×]", xlabel="rung",
                    annotate="{:.2f}×")
    ax = fig.axes[0]
    ax.axhline(1.0, color="dimgray", lw=0.8, ls="--")  # the baseline: below the line is slower
    if kept is not None:
        for bar, name in zip(ax.patches, speedups):
            if not kept.get(name, True):  # the baseline and rungs not judged count as part of the stack
                bar.set(facecolor="#d9d9d9", edgecolor="dimgray", hatch="//")
        ax.legend(handles=[Patch(facecolor="tab:blue", label="kept in your stack"),
                           Patch(facecolor="#d9d9d9", edgecolor="dimgray", hatch="//",
                                 label="dropped: not faster beyond the noise")], loc="upper left", fontsize=8)
    if vs_below:
        # each session times a rung beside its own stack below: a dropped bar can stand taller than a kept
        # one timed in another session; the ratio inside the bar is what the keep rule judged
        for bar, name in zip(ax.patches, speedups):
            if vs_below.get(name):
                ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height() / 2,
                        f"{vs_below[name]:.2f}×\nthe stack\nbelow", ha="center", va="center", fontsize=7,
                        bbox=dict(facecolor="white", alpha=0.85, lw=0, pad=1))
    if accuracy:
        acc_ax = ax.twinx()
        names = list(speedups)
        xs = [names.index(n) for n in accuracy]
        acc_ax.plot(xs, [100 * a for a in accuracy.values()], "o", color="tab:orange", label="val accuracy")
        acc_ax.set_ylim(0, 105)
        acc_ax.set_ylabel("validation accuracy [%]")
        acc_ax.legend(loc="upper right", fontsize=8)
        fig.tight_layout()
    return fig


def confusion_matrix_chart(matrix: Sequence[Sequence[int]], labels: Sequence[str], *, title: str) -> Figure:
    """A confusion matrix: rows are true classes, columns predicted ones, each cell's count written in it
    (lesson 08)."""
    n = len(labels)
    if len(matrix) != n or any(len(row) != n for row in matrix):
        raise ValueError(f"matrix must be {n}×{n} to match {n} labels, got "
                         f"{len(matrix)}×{len(matrix[0]) if len(matrix) else 0}")
    fig, ax = plt.subplots(figsize=(1.0 * n + 2.5, 0.9 * n + 1.8))
    im = ax.imshow(matrix, cmap="Blues")
    top = max(max(row) for row in matrix) or 1
    for i in range(n):
        for j in range(n):
            v = matrix[i][j]
            ax.text(j, i, str(v), ha="center", va="center", color="white" if v > top / 2 else "black")
    ax.set_xticks(range(n), labels, rotation=30, ha="right")
    ax.set_yticks(range(n), labels)
    fig.colorbar(im, ax=ax, label="test documents [count]")
    label_axes(ax, title, "predicted class", "true class")
    fig.tight_layout()
    return fig


# --- where the time goes (lesson 04) ----------------------------------------------------------------

def where_time_goes_chart(roofline, points: Mapping[str, Sequence[Mapping[str, float | str]]],  # noqa: ANN001
                          breakdowns: Mapping[str, Mapping[str, float]], *, precision: str = "fp32",
                          title: str = "Where one training step's time goes", label_top: int = 4) -> Figure:
    """Left: each op of a step on the measured roofline (log-log), coloured by regime, sized by its share of
    the step, with the ridge point; right: each step's time stacked by regime (lesson 04).

    `points`: model -> `helpers.measure.regimes.OpTable.points()`; `breakdowns`: model ->
    `OpTable.breakdown()`."""
    import numpy as np

    from helpers.measure.regimes import REGIME_COLORS, REGIMES

    if not breakdowns or any(v < 0 for b in breakdowns.values() for v in b.values()):
        raise ValueError("where_time_goes_chart needs {model: {regime: seconds >= 0}} for at least one model")
    bad = {k for b in breakdowns.values() for k in b} | {p["regime"] for ps in points.values() for p in ps}
    if bad - set(REGIMES):
        raise ValueError(f"unknown regime(s) {sorted(bad - set(REGIMES))}: use {REGIMES}")
    peak, bw = roofline.matmul_flops.get(precision), roofline.bandwidth
    if peak is None:
        raise ValueError(f"the roofline has no {precision!r} roof; it has {list(roofline.matmul_flops)}")
    scale, unit = (1e12, "TFLOP/s") if peak > 5e12 else (1e9, "GFLOP/s")
    ridge = peak / bw
    xs = [p["intensity"] for ps in points.values() for p in ps] or [ridge]
    lo, hi = min(min(xs), ridge) / 4, max(max(xs), ridge) * 4
    x = np.logspace(np.log10(lo), np.log10(hi), 200)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12.5, 4.8), gridspec_kw={"width_ratios": [1.35, 1]})
    ax.loglog(x, np.minimum(peak, bw * x) / scale, color="black", lw=1.5,
              label=f"roof: {precision} matmul {peak / scale:.3g} {unit}, copy {bw / 1e9:.3g} GB/s")
    ax.axvline(ridge, color="dimgray", ls="--", lw=1)
    # the ridge's label runs up the dashed line from the bottom, clear of the ops that crowd near the roof
    ax.annotate(f"ridge {ridge:.3g} FLOP/byte", (ridge, 0.03), xycoords=("data", "axes fraction"),
                textcoords="offset points", xytext=(-3, 0), rotation=90, ha="right", va="bottom", fontsize=8,
                color="dimgray")
    markers = "osD^v<>"
    for i, (model, ps) in enumerate(points.items()):
        for p in ps:
            ax.scatter(p["intensity"], p["flops_per_s"] / scale, s=20 + 600 * p["share"],
                       color=REGIME_COLORS[p["regime"]], marker=markers[i % len(markers)], alpha=0.7,
                       edgecolor="black", linewidth=0.4)
        ax.scatter([], [], marker=markers[i % len(markers)], color="white", edgecolor="black", label=model)
    # each model's `label_top` largest ops are named, an op that two models share once (at its larger point;
    # "bernoulli" and its in-place "bernoulli_" count as one)
    top = [p for ps in points.values() for p in sorted(ps, key=lambda p: -p["share"])[:label_top]]
    named: set[str] = set()
    for p in sorted(top, key=lambda p: -p["share"]):
        name = p["label"].replace("aten::", "")
        if name.strip("_") not in named:
            named.add(name.strip("_"))
            ax.annotate(name, (p["intensity"], p["flops_per_s"] / scale), textcoords="offset points",
                        xytext=(5, 3), fontsize=7)
    for regime in REGIMES[:3]:
        ax.scatter([], [], color=REGIME_COLORS[regime], label=f"{regime}-bound")
    ax.legend(fontsize=7, loc="upper left")  # above the roof: no op can be there
    label_axes(ax, "Ops on the measured roofline (area: share of the step)",
               "arithmetic intensity [FLOP/byte]", f"achieved [{unit}]")
    names = list(breakdowns)
    left = [0.0] * len(names)
    for regime in REGIMES:
        ms = [breakdowns[n].get(regime, 0.0) * 1e3 for n in names]
        if not any(ms):
            continue
        bars = bx.barh(names, ms, left=left, color=REGIME_COLORS[regime], label=regime)
        for bar, v, n in zip(bars, ms, names):
            share = v / (sum(breakdowns[n].values()) * 1e3 or 1.0)
            if share >= 0.06:
                bx.annotate(f"{100 * share:.0f} %", (bar.get_x() + bar.get_width() / 2,
                                                      bar.get_y() + bar.get_height() / 2),
                            ha="center", va="center", fontsize=8, color="white")
        left = [a + b for a, b in zip(left, ms)]
    bx.invert_yaxis()
    bx.legend(fontsize=8, loc="lower right")
    label_axes(bx, "One step by regime", "time per step [ms]", "model")
    fig.suptitle(title)
    fig.tight_layout()
    return fig
