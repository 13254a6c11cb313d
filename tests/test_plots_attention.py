"""course.plots, attention section: figures have the right axes, labels and data."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course.plots import attention_grid_chart, attention_map_chart, attention_sweep_chart  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_attention_map_has_tokens_on_both_axes() -> None:
    tokens = ["[CLS]", "hello", "world", "[SEP]"]
    fig = attention_map_chart(torch.softmax(torch.randn(4, 4), -1), tokens, title="one map", highlight=1)
    ax = fig.axes[0]
    assert len(fig.axes) == 2  # the map and its colour bar
    assert [t.get_text() for t in ax.get_xticklabels()] == tokens
    assert [t.get_text() for t in ax.get_yticklabels()] == tokens
    assert ax.get_title() == "one map" and "key" in ax.get_xlabel() and "query" in ax.get_ylabel()
    assert "probability" in fig.axes[1].get_ylabel()


def test_attention_map_rejects_mismatched_tokens() -> None:
    with pytest.raises(ValueError, match=r"3 token labels for a map of shape \(4, 4\)"):
        attention_map_chart(torch.rand(4, 4), ["a", "b", "c"])
    with pytest.raises(ValueError, match="square"):
        attention_map_chart(torch.rand(4, 3), ["a", "b", "c", "d"])


def test_attention_grid_is_layers_by_heads() -> None:
    maps = torch.rand(3, 4, 6, 6)
    fig = attention_grid_chart(maps, layers=[0, 2], heads=[1, 2, 3])
    assert len(fig.axes) == 6
    assert fig.axes[0].get_title() == "layer 0, head 1" and fig.axes[-1].get_title() == "layer 2, head 3"
    assert fig.axes[0].get_ylabel() and fig.axes[-1].get_xlabel() and fig._suptitle.get_text()
    with pytest.raises(ValueError, match=r"\(layers, heads, tokens, tokens\), got \(3, 6, 6\)"):
        attention_grid_chart(torch.rand(3, 6, 6))


def test_sweep_chart_is_log_log_with_one_line_per_implementation() -> None:
    seq = [128, 256, 512]
    times = {"naive": [1e-3, 4e-3, 1.6e-2], "sdpa": [5e-4, 1e-3, None]}
    mem = {"naive": [2**20, 2**22, 2**24], "sdpa": [2**18, 2**19, None]}
    fig = attention_sweep_chart(seq, times, mem)
    ax_t, ax_m = fig.axes
    assert ax_t.get_xscale() == ax_t.get_yscale() == ax_m.get_yscale() == "log"
    assert [line.get_label() for line in ax_t.get_lines()] == ["naive", "sdpa"]
    assert len(ax_t.get_lines()[1].get_xdata()) == 2  # None: not run at that length, not plotted
    assert "ms" in ax_t.get_ylabel() and "MiB" in ax_m.get_ylabel() and "tokens" in ax_m.get_xlabel()
    assert ax_m.get_lines()[0].get_ydata()[-1] == pytest.approx(16.0)  # 2**24 bytes = 16 MiB
    with pytest.raises(ValueError, match=r"needs 3 values.*'sdpa': 2"):
        attention_sweep_chart(seq, {"naive": [1, 2, 3], "sdpa": [1, 2]}, mem)
