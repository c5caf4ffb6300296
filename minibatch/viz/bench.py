"""The benchmark's results (`python -m minibatch bench`, its bench.json) as one figure.

- offline: output tokens/s against max batch size, one line per system (median, with the min-max
  range of the repetitions as error bars); each system's best batch size is circled, and a
  system whose outputs differed from the greedy reference is drawn dashed and marked.
- online: p50 TTFT (solid) and p99 TTFT (dotted) against the Poisson arrival rate.
- roofline: minibatch's measured decode step time next to the memory and compute bounds.
Panels whose measurement was skipped are left out. `balance_figure` draws the roofline cost model
of several (model, machine) pairs side by side: where batching stops being free, and how much of a
step is fixed overhead.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

COLOURS = {"minibatch-continuous": "#1b9e77", "minibatch-static": "#7570b3", "hf-generate": "#d95f02",
           "hf-continuous": "#e7298a"}


def _line(ax, xs, stats, name, verified, scale=1.0, style="-", label=True):
    med = np.array([s["median"] * scale for s in stats])
    err = np.array([[(s["median"] - s["min"]) * scale for s in stats],
                    [(s["max"] - s["median"]) * scale for s in stats]])                   # (2, N): below, above
    tag = name if verified else f"{name} (UNVERIFIED)"
    ax.errorbar(xs, med, yerr=err, marker="o", ms=4, capsize=3, color=COLOURS.get(name), label=tag if label else None,
                linestyle=style if verified else "--")
    return med


def bench_figure(results: dict) -> Figure:
    """Offline throughput, online TTFT and the roofline, from a results dict (bench.json)."""
    panels = ["offline"] + [k for k in ("online", "roofline") if results.get(k)]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.9), layout="constrained", squeeze=False)
    for ax, panel in zip(axes[0], panels):
        {"offline": _offline, "online": _online, "roofline": _roofline}[panel](ax, results[panel])
    m = results["machine"]
    fig.suptitle(f"{results['settings']['model']} on {m['cpu']} ({m['usable_cores']} cores, "
                 f"{m['torch_threads']} torch threads)", fontsize=10)
    return fig


def _offline(ax, offline):
    for name, s in offline["systems"].items():
        xs = [r["batch_size"] for r in s["by_batch_size"]]
        med = _line(ax, xs, [r["tok_s"] for r in s["by_batch_size"]], name, s["verified"])
        best = xs.index(s["best_batch_size"])
        ax.plot(xs[best], med[best], "o", ms=11, mfc="none", color=COLOURS.get(name))
    ax.set_xscale("log", base=2)
    sizes = sorted({r["batch_size"] for s in offline["systems"].values() for r in s["by_batch_size"]})
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("max batch size")
    ax.set_ylabel("output tokens/s")
    ax.set_title("Offline throughput (circle: best)")
    ax.legend(fontsize=7)


def _online(ax, online):
    rates = online["rates"]
    for name, s in online["systems"].items():
        _line(ax, rates, [r["p50_ttft_s"] for r in s["by_rate"]], name, s["verified"], 1e3)
        _line(ax, rates, [r["p99_ttft_s"] for r in s["by_rate"]], name, s["verified"], 1e3, style=":", label=False)
    ax.set_yscale("log")
    ax.set_xlabel("arrival rate (requests/s)")
    ax.set_ylabel("TTFT (ms): p50 solid, p99 dotted")
    ax.set_title("Online: time to first token")
    ax.legend(fontsize=7)


def _roofline(ax, roof):
    decode = roof["decode"]
    x = np.arange(len(decode))
    width = 0.27
    for i, (key, label, colour) in enumerate([("step_s", "measured step", "#1b9e77"),
                                              ("memory_bound_s", "memory bound", "#666666"),
                                              ("compute_bound_s", "compute bound", "#bbbbbb")]):
        ax.bar(x + (i - 1) * width, [d[key] * 1e3 for d in decode], width, label=label, color=colour)
    for xi, d in zip(x, decode):
        ax.annotate(f"{d['fraction_of_bound']:.0%} of bound", (xi - width, d["step_s"] * 1e3), ha="center",
                    va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(x, [f"batch {d['batch_size']}" for d in decode])
    ax.set_ylabel("ms per decode step")
    ax.set_title(f"Roofline ({roof['memory_bandwidth_Bps'] / 1e9:.0f} GB/s, {roof['peak_flops'] / 1e9:.0f} GFLOP/s)")
    ax.legend(fontsize=7)


def balance_figure(costs: dict, context: int = 512, max_batch: int = 1024) -> Figure:
    """For each (model, machine) cost model (`minibatch.sim.costmodel.RooflineCostModel`): decode tokens/s
    against batch size, its saturating batch marked (`minibatch.analysis.roofline.saturating_batch`), and
    the share of a step that is fixed overhead."""
    from minibatch.analysis.roofline import saturating_batch, step_parts

    batches = np.unique(np.geomspace(1, max_batch, 48).astype(int))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.9), layout="constrained")
    for label, cost in costs.items():
        parts = [step_parts(cost, int(b), context) for b in batches]
        line, = left.plot(batches, [b / p["step_s"] for b, p in zip(batches, parts)], label=label)
        right.plot(batches, [p["overhead_s"] / p["step_s"] for p in parts], color=line.get_color(), label=label)
        saturated = saturating_batch(cost, context)
        if saturated <= max_batch:
            at = step_parts(cost, saturated, context)
            left.plot(saturated, saturated / at["step_s"], "o", color=line.get_color())
    left.set(xscale="log", yscale="log", xlabel="batch size", ylabel="decode tokens/s",
             title=f"Decode throughput, {context} tokens of context (dot: saturating batch)")
    right.set(xscale="log", xlabel="batch size", ylabel="share of the step", ylim=(0, 1),
              title="Fixed per-step overhead as a share of the step")
    left.legend(fontsize=7)
    return fig
