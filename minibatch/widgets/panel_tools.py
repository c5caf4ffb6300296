"""What the panels share: a Figure turned into an image widget's bytes, numbers into an HTML table.

Panels draw into an `ipywidgets.Image` (PNG bytes) rather than a matplotlib output area, so a
panel redraws the same way in JupyterLab, in a static rendering and in a headless test, and no
figure is left open behind it.
"""
from __future__ import annotations

import io
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt

PNG_DPI = 90   # enough to read a timeline's labels; small enough to redraw in a fraction of a second


def figure_png(fig) -> bytes:
    """The figure as PNG bytes; the figure is closed."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=PNG_DPI, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def fmt(value) -> str:
    """A number for a table cell: 3 significant digits, '-' for missing."""
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, bool) or isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return f"{value:d}"
    return f"{value:.3g}"


def html_table(rows: Sequence[Mapping], columns: Mapping[str, str], bold_last: bool = False) -> str:
    """An HTML table: one row per mapping, `columns` maps a row key to its header."""
    head = "".join(f"<th style='padding:2px 8px'>{h}</th>" for h in columns.values())
    body = []
    for i, row in enumerate(rows):
        style = "font-weight:bold" if bold_last and i == len(rows) - 1 else ""
        cells = "".join(f"<td style='padding:2px 8px;text-align:right'>{fmt(row.get(k))}</td>" for k in columns)
        body.append(f"<tr style='{style}'>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"
