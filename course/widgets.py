"""ipywidgets explorers over measured data, drawn with `course.plots`.

`AttentionExplorer`: layer and head sliders and a token selector over captured attention maps; given
the maps of several texts (`capture_attention_maps` of a list), also a text selector. Each text's maps
hold its real tokens only, so no [PAD] row or column is ever drawn.
Structure (stable, for tests and browser automation): a VBox with the CSS class
`attention-explorer`, holding an HBox of controls (Dropdown "text" only for several texts, IntSlider
"layer", IntSlider "head", Dropdown "token") and an Output widget with the current figure.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from course.plots import attention_map_chart
from helpers.core.compat import optional_import
from helpers.model.attention import AttentionMaps

plt = optional_import("matplotlib.pyplot", "course.widgets (the lessons' explorers)")
Figure = optional_import("matplotlib.figure", "course.widgets").Figure

__all__ = ["AttentionExplorer"]


class AttentionExplorer:
    """Interactive view of attention maps (lesson 01): pick a text, a layer, a head, and one query token."""

    def __init__(self, maps: AttentionMaps | Sequence[AttentionMaps], *, layer: int = 0, head: int = 0,
                 text: int = 0) -> None:
        w = optional_import("ipywidgets", "course.widgets' explorers")

        texts = [maps] if isinstance(maps, AttentionMaps) else list(maps) if isinstance(maps, Sequence) \
            else []
        if not texts or not all(isinstance(m, AttentionMaps) for m in texts):
            raise ValueError(f"AttentionExplorer needs an AttentionMaps or a list of them (from "
                             f"capture_attention_maps), got {type(maps).__name__}")
        if not 0 <= text < len(texts):
            raise ValueError(f"text must be in [0, {len(texts)}), got {text}")
        first = texts[text]
        if any((m.n_layers, m.n_heads) != (first.n_layers, first.n_heads) for m in texts):
            raise ValueError("the maps of every text must come from one model (same layers and heads)")
        if not (0 <= layer < first.n_layers and 0 <= head < first.n_heads):
            raise ValueError(f"layer must be in [0, {first.n_layers}) and head in [0, {first.n_heads}), "
                             f"got layer={layer}, head={head}")
        self.texts = texts
        self.maps = first  # the chosen text's maps
        self.figure: Figure | None = None  # the figure on display now; replaced at every change
        self.text = w.Dropdown(options=[(self._label(i, m), i) for i, m in enumerate(texts)], value=text,
                               description="text")
        self.layer = w.IntSlider(value=layer, min=0, max=first.n_layers - 1, description="layer",
                                 continuous_update=False)
        self.head = w.IntSlider(value=head, min=0, max=first.n_heads - 1, description="head",
                                continuous_update=False)
        # -1 = no token highlighted (a None value would show as an empty selection in the browser)
        self.token = w.Dropdown(options=self._token_options(), value=-1, description="token")
        self.output = w.Output()
        controls = [self.layer, self.head, self.token]
        if len(texts) > 1:
            controls.insert(0, self.text)
        self.widget = w.VBox([w.HBox(controls), self.output])
        self.widget.add_class("attention-explorer")
        self.text.observe(self._on_text, names="value")
        for control in (self.layer, self.head, self.token):
            control.observe(self._on_change, names="value")
        self.redraw()

    @staticmethod
    def _label(i: int, maps: AttentionMaps) -> str:
        words = " ".join(t for t in maps.tokens[1:6] if not t.startswith("["))
        return f"{i}: {words[:30]} ({len(maps.tokens)} tokens)"

    def _token_options(self) -> list[tuple[str, int]]:
        return [("all tokens", -1)] + [(f"{i}: {tok}", i) for i, tok in enumerate(self.maps.tokens)]

    def _on_text(self, _change: dict[str, Any]) -> None:
        self.maps = self.texts[self.text.value]
        with self.token.hold_trait_notifications():
            self.token.unobserve(self._on_change, names="value")
            self.token.options = self._token_options()  # another text, other tokens
            self.token.value = -1
            self.token.observe(self._on_change, names="value")
        self.redraw()

    def _on_change(self, _change: dict[str, Any]) -> None:
        self.redraw()

    def redraw(self) -> Figure:
        """Draw the selected text, layer and head into the output area; returns the new figure."""
        from IPython.display import display

        layer, head = self.layer.value, self.head.value
        row = self.token.value if self.token.value >= 0 else None
        weights: torch.Tensor = self.maps.maps[layer, head]  # (T, T), the text's real tokens; rows sum to 1
        title = f"layer {layer}, head {head}"
        if row is not None:
            top = int(weights[row].argmax())
            title += (f": '{self.maps.tokens[row]}' attends most to '{self.maps.tokens[top]}' "
                      f"({float(weights[row, top]):.2f})")
        fig = attention_map_chart(weights, self.maps.tokens, title=title, highlight=row)
        with self.output:
            self.output.clear_output(wait=True)
            display(fig)
        plt.close(fig)  # shown once, in the output area; closed so the inline backend does not show it again
        if self.figure is not None:
            plt.close(self.figure)
        self.figure = fig
        return fig

    def _ipython_display_(self) -> None:
        # the explorer shows as its widget: display() draws it with ipywidgets 7 (Colab's), which has no
        # _repr_mimebundle_ on widgets, and with 8 alike
        from IPython.display import display

        display(self.widget)
