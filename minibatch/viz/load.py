"""How loaded the engine was, step by step: batch size, queue depth and KV-cache usage over time.

`load_over_time` stacks one panel per quantity on a shared time axis (seconds since the run
started), each drawn as a staircase, since a value holds from one step's start to the next:
- batch size: sequences that computed in the step, against the `max_batch_size` ceiling;
- queue depth: requests still waiting after the step was scheduled (a queue that keeps growing
  means requests arrive faster than they are served);
- KV usage: the share of KV blocks in use, with the steps that preempted a request marked (a
  cache pinned at 100% that preempts is out of memory, not busy).
"""
from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from minibatch.analysis.metrics import RunReport

PANELS = ("batch_size", "queue_depth", "kv_usage")


def step_series(report: RunReport) -> dict[str, np.ndarray]:
    """Per-step arrays: time (step start, s since the run began), batch_size, queue_depth, kv_usage
    (share of blocks in use, 0..1) and preempted (requests preempted in the step)."""
    steps = report.steps
    return {
        "time": np.array([s.start - report.start_time for s in steps], dtype=float),
        "batch_size": np.array([s.batch_size for s in steps], dtype=float),
        "queue_depth": np.array([s.queue_depth for s in steps], dtype=float),
        "kv_usage": np.array([s.kv_blocks_used / s.kv_blocks_total for s in steps], dtype=float),
        "preempted": np.array([s.num_preempted for s in steps], dtype=int),
    }


def load_over_time(report: RunReport, panels: Sequence[str] = PANELS, title: str | None = None) -> Figure:
    """Stacked staircases of the chosen panels (any of "batch_size", "queue_depth", "kv_usage")."""
    if not panels or any(p not in PANELS for p in panels):
        raise ValueError(f"panels={tuple(panels)!r} is not allowed: choose from {', '.join(PANELS)}")
    series = step_series(report)
    t = series["time"]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 1.9 * len(panels) + 0.4), sharex=True, squeeze=False,
                             layout="constrained")
    for ax, panel in zip(axes[:, 0], panels):
        if panel == "batch_size":
            ax.step(t, series["batch_size"], where="post", color="tab:blue")
            ax.axhline(report.max_batch_size, color="tab:blue", linestyle="--", linewidth=0.8, label="max_batch_size")
            ax.set(ylabel="batch size", ylim=(0, report.max_batch_size * 1.15 + 0.5))
            ax.legend(fontsize=8, loc="upper right")
        elif panel == "queue_depth":
            ax.step(t, series["queue_depth"], where="post", color="tab:orange")
            ax.set(ylabel="queue depth", ylim=(0, max(1.0, series["queue_depth"].max(initial=0)) * 1.15))
        else:
            ax.step(t, 100 * series["kv_usage"], where="post", color="tab:green")
            ax.axhline(100, color="tab:green", linestyle="--", linewidth=0.8)
            hit = series["preempted"] > 0
            if hit.any():
                ax.plot(t[hit], np.full(hit.sum(), 100.0), "v", color="tab:red", label="preemption")
                ax.legend(fontsize=8, loc="lower right")
            ax.set(ylabel="KV blocks used (%)", ylim=(0, 112))
    axes[-1, 0].set_xlabel("time since start (s)")
    if title:
        axes[0, 0].set_title(title)
    return fig
