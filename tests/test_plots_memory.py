"""Figures of lessons 02–03: every one has a title, axis labels with units, and the data it was given."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course.plots import loss_curves_chart, memory_breakdown_chart, memory_timeline_chart  # noqa: E402


def test_memory_breakdown_stacks_the_terms():
    fig = memory_breakdown_chart({"estimate": {"parameters": 2 ** 20, "activations": 3 * 2 ** 20},
                                  "measured": {"parameters": 2 ** 20, "activations": 2 ** 21}},
                                 title="memory of one step")
    ax = fig.axes[0]
    assert ax.get_title() == "memory of one step" and ax.get_ylabel() == "memory [MiB]" and ax.get_xlabel()
    tops = sorted(p.get_y() + p.get_height() for p in ax.patches)
    assert tops[-1] == pytest.approx(4.0) and tops[-2] == pytest.approx(3.0)  # stacked, in MiB
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["parameters", "activations"]
    plt.close(fig)
    with pytest.raises(ValueError, match="unit"):
        memory_breakdown_chart({"a": {"x": 1}}, title="t", unit="parsecs")


def test_memory_timeline_chart_draws_each_category():
    held = {"parameter": [2 ** 20] * 3, "activation": [0, 2 ** 21, 0], "unknown": [0, 0, 0]}
    fig = memory_timeline_chart([0.0, 0.001, 0.002], held, title="one step")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "time [ms]" and ax.get_ylabel() == "memory held [MiB]"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["parameter", "activation"]  # empty dropped
    plt.close(fig)
    with pytest.raises(ValueError, match="one value per time"):
        memory_timeline_chart([0.0], {"a": [1, 2]}, title="t")


def test_loss_curves_share_one_axis_and_mark_skipped_steps():
    fig = loss_curves_chart({"fp32": [3.0, 2.0, 1.0], "bf16": [3.0, 2.1, 1.2]}, title="loss",
                            marks={"bf16": [1]})
    ax = fig.axes[0]
    assert len(fig.axes) == 1 and ax.get_xlabel() == "optimizer step" and "loss" in ax.get_ylabel()
    assert [list(line.get_ydata()) for line in ax.lines][:2] == [[3.0, 2.0, 1.0], [3.0, 2.1, 1.2]]
    assert list(ax.lines[2].get_ydata()) == [2.1]  # the mark
    plt.close(fig)
    with pytest.raises(ValueError, match="non-empty run"):
        loss_curves_chart({"a": []}, title="t")


def test_bar_chart_names_its_baseline_once_and_writes_each_ratio():
    import matplotlib.pyplot as plt

    from course.plots import bar_chart

    fig = bar_chart({"fp32 eager (baseline)": 2.0, "+ bf16": 3.0}, title="t", ylabel="y",
                    baseline="fp32 eager (baseline)")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "2\n1.00×" in texts and "3\n1.50×" in texts  # ratios on the bars, short enough to fit
    assert any("fp32 eager (baseline)" in t and "value" in t for t in texts)  # and what they divide by
    plt.close(fig)
