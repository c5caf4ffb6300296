"""A server under load, as its operator and its clients see it.

- `metrics_over_time`: what /metrics said while a load test ran, one line per run: requests
  running (the batch), requests waiting (the queue) and KV-cache usage. Below capacity the queue
  stays near zero; past it the queue grows for as long as requests keep arriving.
- `latency_vs_load`: client-side latencies against the offered load, one line per way of serving
  (the engine in-process and the same engine over HTTP): the gap between the lines is what HTTP
  costs, the rise of both is what queueing costs.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from minibatch.viz.latency import _axis_label

GAUGE_LABELS = {"num_requests_running": "running (batch size)", "num_requests_waiting": "waiting (queue depth)",
                "kv_cache_usage_perc": "KV-cache usage (share)"}


def metrics_over_time(runs: Mapping[str, Sequence[tuple[float, Mapping[str, float]]]],
                      gauges: Sequence[str] = tuple(GAUGE_LABELS), max_batch_size: int | None = None) -> Figure:
    """runs: {label: [(seconds since the run began, parsed /metrics scrape), ...]} (MetricsSampler.samples)."""
    unknown = [g for g in gauges if g not in GAUGE_LABELS]
    if unknown or not gauges:
        raise ValueError(f"gauges={tuple(gauges)!r} is not allowed: choose from {', '.join(GAUGE_LABELS)}")
    fig, axes = plt.subplots(len(gauges), 1, figsize=(7.5, 1.9 * len(gauges) + 0.6), sharex=True,
                             squeeze=False, layout="constrained")
    for ax, gauge in zip(axes[:, 0], gauges):
        for label, samples in runs.items():
            ax.step([t for t, _ in samples], [s.get(gauge, 0.0) for _, s in samples], where="post", label=label)
        if gauge == "num_requests_running" and max_batch_size:
            ax.axhline(max_batch_size, color="grey", linestyle=":", linewidth=0.8)
        ax.set_ylabel(GAUGE_LABELS[gauge], fontsize=8)
    axes[0, 0].legend(fontsize=8, loc="upper right")
    axes[-1, 0].set_xlabel("seconds since the load test began")
    axes[0, 0].set_title("/metrics while the load test ran")
    return fig


def latency_vs_load(rows: Sequence[Mapping], metrics: Sequence[str] = ("p50_ttft_s", "p50_e2e_s"),
                    x: str = "rate", series: str = "where") -> Figure:
    """One panel per latency metric: its value against `x` (the offered load), one line per `series`."""
    if not rows:
        raise ValueError("rows=[] is not allowed: pass at least one run's summary")
    missing = [k for k in (*metrics, x, series) if k not in rows[0]]
    if missing:
        raise KeyError(f"rows have no field {missing[0]!r}; fields: {', '.join(rows[0])}")
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4), squeeze=False, layout="constrained")
    for ax, metric in zip(axes[0], metrics):
        for name in dict.fromkeys(r[series] for r in rows):
            group = sorted((r for r in rows if r[series] == name), key=lambda r: r[x])
            ax.plot([r[x] for r in group], [r[metric] for r in group], marker="o", label=str(name))
        ax.set(xlabel=_axis_label(x) if x != "rate" else "offered load (requests/s)", ylabel=_axis_label(metric))
        ax.set_ylim(bottom=0)
    axes[0, -1].legend(fontsize=8)
    return fig
