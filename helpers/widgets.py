"""ipywidgets explorers over measured data, drawn with `helpers.plots`.

`AttentionExplorer`: layer and head sliders and a token selector over captured attention maps.
Structure (stable, for tests and browser automation): a VBox with the CSS class
`attention-explorer`, holding an HBox of controls (IntSlider "layer", IntSlider "head",
Dropdown "token") and an Output widget with the current figure.
"""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure

from helpers.attention import AttentionMaps
from helpers.plots import attention_map_chart

__all__ = ["AttentionExplorer"]


class AttentionExplorer:
    """Interactive view of attention maps: pick a layer, a head, and optionally one query token."""

    def __init__(self, maps: AttentionMaps, *, layer: int = 0, head: int = 0) -> None:
        import ipywidgets as w

        if not isinstance(maps, AttentionMaps):
            raise ValueError(f"AttentionExplorer needs an AttentionMaps (from capture_attention_maps), "
                             f"got {type(maps).__name__}")
        if not (0 <= layer < maps.n_layers and 0 <= head < maps.n_heads):
            raise ValueError(f"layer must be in [0, {maps.n_layers}) and head in [0, {maps.n_heads}), "
                             f"got layer={layer}, head={head}")
        self.maps = maps
        self.figure: Figure | None = None  # the figure on display now; replaced at every change
        self.layer = w.IntSlider(value=layer, min=0, max=maps.n_layers - 1, description="layer",
                                 continuous_update=False)
        self.head = w.IntSlider(value=head, min=0, max=maps.n_heads - 1, description="head",
                                continuous_update=False)
        # -1 = no token highlighted (a None value would show as an empty selection in the browser)
        options = [("all tokens", -1)] + [(f"{i}: {tok}", i) for i, tok in enumerate(maps.tokens)]
        self.token = w.Dropdown(options=options, value=-1, description="token")
        self.output = w.Output()
        self.widget = w.VBox([w.HBox([self.layer, self.head, self.token]), self.output])
        self.widget.add_class("attention-explorer")
        for control in (self.layer, self.head, self.token):
            control.observe(self._on_change, names="value")
        self.redraw()

    def _on_change(self, _change: dict[str, Any]) -> None:
        self.redraw()

    def redraw(self) -> Figure:
        """Draw the selected layer and head into the output area; returns the new figure."""
        from IPython.display import display

        layer, head = self.layer.value, self.head.value
        row = self.token.value if self.token.value >= 0 else None
        weights: torch.Tensor = self.maps.maps[layer, head]  # (T, T), rows sum to 1
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

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)
