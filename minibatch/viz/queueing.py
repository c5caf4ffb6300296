"""The latency curve against offered load, from a load sweep (`minibatch.analysis.queueing`).

`load_sweep_figure` draws four panels against the offered load as a share of the measured
capacity (1.0 is the most the server can finish):
- latency: p50 and p99 of TTFT and e2e, with the SLA's TTFT limit and the load at which
  the p99 TTFT passes it;
- mean queue time, measured and the Pollaczek-Khinchine approximation (M/D/1 by default), marked
  as an approximation, with the loads where the two agree within a factor 2 shaded;
- the queue: mean queue depth and mean number in the system L, with lambda x W beside L (Little's law);
- utilisation: the share of batch slots that computed, and the share of time a step ran.
`at` moves a marker along every curve to the level nearest that load.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from minibatch.analysis.queueing import LoadSweep

APPROXIMATIONS = {0.0: "M/D/1", 1.0: "M/M/1"}   # the queue a squared coefficient of variation of service names


def _mark(ax, x, ys, color="black"):
    ax.axvline(x, color=color, linewidth=0.8, alpha=0.5)
    for y in ys:
        if np.isfinite(y):
            ax.plot([x], [y], "o", markersize=9, markerfacecolor="none", markeredgecolor=color, markeredgewidth=1.5)


def load_sweep_figure(sweep: LoadSweep, at: float | None = None, sla=None, scv: float = 0.0,
                      log_latency: bool = False) -> Figure:
    """Four panels of the sweep against load; `at` (a share of capacity) marks the nearest level;
    `sla` (minibatch.analysis.sla.SLA) draws its TTFT limit; `scv` picks the approximation;
    `log_latency` draws the latency panel on a log scale (linear shows the hockey stick)."""
    x = sweep.shares
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.6), sharex=True, layout="constrained")
    (latency, wait), (queue, used) = axes
    for name, label, style in (("p50_ttft_s", "p50 TTFT", "o-"), ("p99_ttft_s", "p99 TTFT", "s-"),
                               ("p50_e2e_s", "p50 e2e", "o--"), ("p99_e2e_s", "p99 e2e", "s--")):
        latency.plot(x, sweep.column(name), style, markersize=3, label=label)
    latency.set(yscale="log" if log_latency else "linear", ylabel="seconds", title="latency against load")
    if sla is not None and sla.ttft_s is not None:
        latency.axhline(sla.ttft_s, color="tab:red", linestyle=":", label=f"SLA: p{sla.percentile:g} TTFT limit")
        passes = sweep.crossing(f"p{sla.percentile:g}_ttft_s", sla.ttft_s) if sla.percentile in (50, 99) else None
        if passes is not None:
            latency.axvline(passes, color="tab:red", linestyle=":")
            latency.text(passes, 0.97, f"passes at {passes:.2f}x ", color="tab:red", fontsize=8, ha="right", va="top",
                         transform=latency.get_xaxis_transform())
    name = APPROXIMATIONS.get(scv, f"M/G/1 (c2={scv:g})")
    approx = sweep.approximation(scv)
    finite = np.isfinite(approx)
    wait.plot(x, sweep.column("mean_queue_time_s"), "o-", markersize=3, label="measured (simulated clock)")
    wait.plot(x[finite], approx[finite], "k--", label=f"{name} approximation (Pollaczek-Khinchine)")
    band = sweep.agreement(scv)
    if band is not None:
        wait.axvspan(band[0], band[1], color="tab:green", alpha=0.1, label="within a factor 2")
    wait.set(yscale="log", ylabel="seconds", title="mean queue time: measured and an approximation")
    queue.plot(x, sweep.column("mean_queue_depth"), "o-", markersize=3, label="mean queue depth")
    queue.plot(x, sweep.column("mean_in_system"), "s-", markersize=3, label="mean in system L")
    queue.plot(x, sweep.column("lambda_W"), "x", color="tab:red", label="lambda x W (Little's law)")
    queue.set(ylabel="requests", title="the queue", xlabel="offered load / capacity")
    used.plot(x, sweep.column("utilisation"), "o-", markersize=3, label="slots used")
    used.plot(x, sweep.column("busy"), "s-", markersize=3, label="time a step ran")
    used.plot(x, np.minimum(x, 1.0), "k:", linewidth=0.8, label="offered load (at most 1)")
    used.set(ylim=(0, 1.05), ylabel="share", title="utilisation", xlabel="offered load / capacity")
    for ax in axes.flat:
        ax.axvline(1.0, color="grey", linestyle=":", linewidth=0.8)
        ax.legend(fontsize=7, loc="upper left")
    if at is not None:
        point = sweep.nearest(at)
        f = point.figures
        _mark(latency, point.share, [f[k] for k in ("p50_ttft_s", "p99_ttft_s", "p50_e2e_s", "p99_e2e_s")])
        _mark(wait, point.share, [f["mean_queue_time_s"]])
        _mark(queue, point.share, [f["mean_queue_depth"], f["mean_in_system"]])
        _mark(used, point.share, [f["utilisation"], f["busy"]])
    fig.suptitle(f"{sweep.num_requests} requests per level; capacity {sweep.capacity:.3g} requests/s (measured)",
                 fontsize=10)
    return fig
