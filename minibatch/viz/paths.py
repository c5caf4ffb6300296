"""The two paths' decode steps against the memory bound (`minibatch.bench.paths.compare_paths` measures them).

`paths_vs_bound(rows)`: for each batch size, the reference path's and the fast path's decode step in ms
as bars, with the memory bound (every weight read once) as a line the bars cannot go under.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

COLOURS = {"reference": "#fdae61", "fast": "#2c7bb6"}


def paths_vs_bound(rows: list[dict], ax=None):
    """Bars of each path's step (ms) per batch size, and the memory bound of each batch size as a tick."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.2), layout="constrained")
    batches = sorted({r["batch"] for r in rows})
    x = np.arange(len(batches))
    for i, path in enumerate(COLOURS):
        steps = [1e3 * next(r["step_s"] for r in rows if r["path"] == path and r["batch"] == b) for b in batches]
        ax.bar(x + (i - 0.5) * 0.38, steps, 0.36, color=COLOURS[path], label=f"{path} path")
    bounds = [1e3 * next(r["bound_s"] for r in rows if r["batch"] == b) for b in batches]
    ax.hlines(bounds, x - 0.45, x + 0.45, colors="black", linestyles="--", label="memory bound (weights read once)")
    ax.set_xticks(x, [f"batch {b}" for b in batches])
    ax.set_ylabel("decode step (ms)")
    ax.set_title("Same tokens, two paths: how close to the memory bound")
    ax.legend(fontsize=8)
    return ax
