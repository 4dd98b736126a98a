"""Charts as inline SVG, drawn on the server with matplotlib: the pages need no JavaScript."""

from __future__ import annotations

import io
from collections.abc import Sequence


def line(xs: Sequence[float], ys: Sequence[float], xlabel: str, ylabel: str) -> str:
    """A line with markers, as an `<svg>` element; "" when there is nothing to draw."""
    if not xs:
        return ""
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(6.4, 2.8), dpi=72)
    FigureCanvasSVG(figure)
    ax = figure.add_subplot()
    ax.plot(list(xs), list(ys), marker="o", color="#1f5f8b")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    figure.tight_layout()
    out = io.StringIO()
    figure.savefig(out, format="svg")
    text = out.getvalue()
    return text[text.index("<svg") :]
