"""Prefill and decode, step by step: what a step costs for the tokens it computes, and how long
decoding requests waited for each of their tokens.

- `step_time_vs_tokens`: for groups of steps (say "prefill" and "decode"), the step's time and the
  tokens per second it achieved against the tokens it computed. A prefill computes a whole prompt
  in one matrix-matrix pass; a decode step computes one token per sequence and rereads every
  weight for it, so its time barely grows with the batch.
- `step_durations`: one bar per step at the time it ran, as tall as it lasted, coloured by whether
  it carried prompt tokens. Every request decoding in a step waits the whole step for its next
  token, so a tall bar among short ones is a stall.
- `decode_token_waits`: that wait for every decode token of a run (vLLM calls it the inter-token
  latency), and `budget_tradeoff`: runs with different token budgets at their p99 TTFT and p99
  inter-token latency.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from minibatch.analysis.metrics import RunReport
from minibatch.engine.records import StepRecord
from minibatch.viz.latency import _axis_label

PREFILL_COLOUR, DECODE_COLOUR = "tab:orange", "tab:blue"


def step_tokens(step: StepRecord) -> int:
    """Tokens the step computed: prompt tokens plus one per decoding sequence."""
    return step.num_prefill_tokens + step.num_decode_tokens


def step_time_vs_tokens(groups: Mapping[str, Sequence[StepRecord]]) -> Figure:
    """Left: step time (ms) against tokens in the step; right: tokens per second against the same."""
    if not groups or any(len(steps) == 0 for steps in groups.values()):
        raise ValueError("groups is not allowed: give {name: [StepRecord, ...]} with at least one step each")
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    for name, steps in groups.items():
        steps = sorted(steps, key=step_tokens)
        tokens = [step_tokens(s) for s in steps]
        left.plot(tokens, [1e3 * s.duration for s in steps], "o-", label=name)
        right.plot(tokens, [step_tokens(s) / s.duration for s in steps], "o-", label=name)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens computed in the step")
    left.set(ylabel="step time (ms)", title="what a step costs", ylim=(0, None))
    right.set(ylabel="tokens per second", title="what it achieves", ylim=(0, None))
    left.legend(fontsize=8)
    return fig


def step_durations(reports: Mapping[str, RunReport]) -> Figure:
    """One panel per run: each step as a bar at its start time, as tall as it lasted (ms)."""
    if not reports or not all(isinstance(r, RunReport) for r in reports.values()):
        raise TypeError(f"reports={reports!r} is not allowed: a dict of name -> RunReport")
    fig, axes = plt.subplots(len(reports), 1, figsize=(9, 2.3 * len(reports) + 0.5), sharex=True, sharey=True,
                             squeeze=False, layout="constrained")
    for ax, (name, report) in zip(axes[:, 0], reports.items()):
        for s in report.steps:
            ax.bar(s.start - report.start_time, 1e3 * s.duration, width=s.duration, align="edge",
                   color=PREFILL_COLOUR if s.num_prefill_tokens else DECODE_COLOUR, edgecolor="white", linewidth=0.3)
        ax.set(ylabel="step time (ms)", title=name)
    axes[0, 0].legend(handles=[Patch(color=PREFILL_COLOUR, label="step with prompt tokens"),
                               Patch(color=DECODE_COLOUR, label="decode only")], fontsize=8, loc="upper right")
    axes[-1, 0].set_xlabel("time since start (s)")
    return fig


def decode_token_waits(report: RunReport) -> np.ndarray:
    """Seconds each decode token of the run waited for its step: one entry per decode token."""
    return np.repeat([s.duration for s in report.steps], [s.num_decode_tokens for s in report.steps])


def budget_tradeoff(rows: Sequence[Mapping], x: str = "p99_ttft_s", y: str = "p99_decode_wait_s",
                    along: str = "max_tokens_per_step") -> Figure:
    """One point per run (row: its summary plus its knobs), joined in order of `along` and labelled with it."""
    if not rows or any(k not in rows[0] for k in (x, y, along)):
        raise KeyError(f"rows need the fields {x!r}, {y!r} and {along!r}")
    rows = sorted(rows, key=lambda r: r[along])
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    ax.plot([r[x] for r in rows], [r[y] for r in rows], "o-")
    for r in rows:
        ax.annotate(f"{r[along]}", (r[x], r[y]), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set(xlabel=_axis_label(x), ylabel=_axis_label(y), title=f"labels: {along}", ylim=(0, None))
    return fig
