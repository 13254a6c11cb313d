"""course.widgets: the attention explorer builds and redraws without a browser."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from course.widgets import AttentionExplorer  # noqa: E402
from helpers.model.attention import AttentionMaps  # noqa: E402


def _maps(layers: int = 3, heads: int = 2, t: int = 5) -> AttentionMaps:
    g = torch.Generator().manual_seed(0)
    maps = torch.softmax(torch.randn(layers, heads, t, t, generator=g), dim=-1)
    return AttentionMaps(maps=maps, tokens=[f"tok{i}" for i in range(t)])


def test_structure_is_stable() -> None:
    ex = AttentionExplorer(_maps())
    controls, output = ex.widget.children
    assert [c.description for c in controls.children] == ["layer", "head", "token"]
    assert output is ex.output and "attention-explorer" in ex.widget._dom_classes
    assert (ex.layer.min, ex.layer.max, ex.head.max) == (0, 2, 1)
    assert ex.token.options[0] == ("all tokens", -1) and ex.token.label == "all tokens"
    assert len(ex.token.options) == 6


def test_moving_the_sliders_redraws_the_selected_map() -> None:
    maps = _maps()
    ex = AttentionExplorer(maps)
    first = ex.figure
    assert first.axes[0].get_title() == "layer 0, head 0"
    ex.layer.value = 2
    assert ex.figure is not first and ex.figure.axes[0].get_title() == "layer 2, head 0"
    ex.head.value = 1
    shown = ex.figure.axes[0].images[0].get_array()
    torch.testing.assert_close(torch.as_tensor(shown.data, dtype=torch.float32), maps.maps[2, 1])
    ex.token.value = 3
    title = ex.figure.axes[0].get_title()
    top = maps.tokens[int(maps.maps[2, 1, 3].argmax())]
    assert title.startswith("layer 2, head 1: 'tok3' attends most to") and f"'{top}'" in title
    assert len(ex.figure.axes[0].patches) == 1  # the highlighted row
    ex.token.value = -1  # back to "all tokens": no highlight
    assert len(ex.figure.axes[0].patches) == 0 and ex.figure.axes[0].get_title() == "layer 2, head 1"


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="needs an AttentionMaps"):
        AttentionExplorer(torch.rand(2, 2, 3, 3))
    with pytest.raises(ValueError, match=r"layer must be in \[0, 3\)"):
        AttentionExplorer(_maps(), layer=3)


def test_several_texts_show_one_chosen_text_without_padding() -> None:
    short, long = _maps(t=4), _maps(t=7)
    short.tokens[:] = ["[CLS]", "a", "b", "[SEP]"]
    ex = AttentionExplorer([short, long])
    controls, _ = ex.widget.children
    assert [c.description for c in controls.children] == ["text", "layer", "head", "token"]
    labels = [t.get_text() for t in ex.figure.axes[0].get_xticklabels()]
    assert labels == short.tokens and len(ex.token.options) == 5
    ex.token.value = 2
    ex.text.value = 1  # another text: its own tokens, the token choice reset
    assert ex.token.value == -1 and len(ex.token.options) == 8
    assert [t.get_text() for t in ex.figure.axes[0].get_xticklabels()] == long.tokens
    with pytest.raises(ValueError, match=r"text must be in \[0, 2\)"):
        AttentionExplorer([short, long], text=2)
