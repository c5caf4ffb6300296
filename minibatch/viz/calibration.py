"""The simulated clock against the real engine, and the batching timeout on the real engine.

- `step_ratio_figure`: a decode step of b sequences relative to a step of one, measured on the real
  engine and predicted by the simulated clock's cost model, side by side: where the two lines
  agree, the simulated sweeps that follow move as this machine would.
- `timeout_figure`: one run per batching timeout on the real engine (`tools.timeout_trial`):
  the sequences per decode step, and each request's TTFT with the bound the timeout sets.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure


def step_ratio_figure(measured: Mapping[int, float], simulated: Mapping[int, float],
                      simulated_label: str = "simulated clock") -> Figure:
    """step(b) / step(1) against b: the real engine's (measured) and the cost model's (simulated)."""
    if not measured or not simulated:
        raise ValueError("measured and simulated are not allowed empty: give {batch size: step(b) / step(1)}")
    fig, ax = plt.subplots(figsize=(6, 3.8), layout="constrained")
    for ratios, label, style in ((measured, "measured (this machine, real engine)", "o-"),
                                 (simulated, simulated_label, "s--")):
        batches = sorted(ratios)
        ax.plot(batches, [ratios[b] for b in batches], style, label=label)
    top = max(max(measured), max(simulated))
    ax.plot([1, top], [1, top], ":", color="grey", label="b sequences cost b steps of one")
    ax.set(xscale="log", yscale="log", xlabel="sequences in the decode step (b)", ylabel="step(b) / step(1)",
           title="What a decode step of b costs, relative to a step of one")
    ax.set_xticks(sorted(set(measured) | set(simulated)), [str(b) for b in sorted(set(measured) | set(simulated))])
    ax.legend(fontsize=8)
    return fig


def timeout_figure(runs: Sequence[dict]) -> Figure:
    """Left: mean sequences per decode step for each timeout; right: each request's TTFT for each timeout,
    with the median's bound (no timeout's median + the timeout + the longest step)."""
    if not runs:
        raise ValueError("runs is not allowed empty: give the list timeout_trial returns")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
    labels = [f"{r['batch_timeout_s']:g} s" for r in runs]
    left.bar(labels, [r["mean_decode_batch"] for r in runs], color="tab:blue")
    left.set(xlabel="batch_timeout_s", ylabel="sequences per decode step (mean)", title="Fuller steps")
    base = runs[0]
    for i, run in enumerate(runs):
        ttft = np.asarray(run["ttft_s"]) * 1e3
        jitter = np.linspace(-0.15, 0.15, len(ttft))
        right.plot(i + jitter, ttft, "o", alpha=0.6, color="tab:orange")
        right.plot([i - 0.3, i + 0.3], [run["median_ttft_s"] * 1e3] * 2, "-", color="black")
        if i:
            step = max(run["longest_step_s"], base["longest_step_s"])
            bound = (base["median_ttft_s"] + run["batch_timeout_s"] + step) * 1e3
            right.plot([i - 0.3, i + 0.3], [bound] * 2, "--", color="tab:red")
    right.plot([], [], "-", color="black", label="median TTFT")
    right.plot([], [], "--", color="tab:red", label="bound: no timeout's median + timeout + a step")
    right.set_xticks(range(len(runs)), labels)
    right.set(xlabel="batch_timeout_s", ylabel="TTFT (ms)", title="The price: time to first token", ylim=(0, None))
    right.legend(fontsize=8)
    return fig
