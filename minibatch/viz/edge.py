"""Pictures for one user on an edge device: edge mode against a server, and speculative decoding.

- `request_lanes`: one lane per request, from arrival to finish: how long it queued, waited for its
  first token, and spent generating. Under edge mode (a batch of one) the queue grows down the
  lanes; a server batching the same arrivals keeps them short and overlapping.
- `edge_vs_server`: the lanes of one mode beside the latencies and throughput of both.
- `speculation_speedups`: tokens/s of each proposer over plain decoding, per task, with acceptance rates.
- `speedup_vs_batch`: the speed-up of speculative decoding, its tokens per step and its step cost, by batch size.
- `formats_vs_bounds`: decode tokens/s of each weight format at batch 1 inside its own memory bound.
"""
from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from minibatch.analysis.metrics import RunReport

PHASE_COLOURS = {"queued": "#bbbbbb", "to first token": "#fdae61", "generating": "#2c7bb6"}
LATENCIES = (("ttft", "p50 TTFT"), ("tpot", "p50 TPOT"), ("e2e", "p50 e2e"))


def request_lanes(report: RunReport, ax=None, title: str | None = None):
    """Horizontal lanes, request 0 at the top: queued (arrival to first scheduled), to first token, generating."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.25 * len(report.requests) + 1.5), layout="constrained")
    for row, r in enumerate(report.requests):
        start = r.arrival_time - report.start_time
        spans = {"queued": r.queue_time or 0.0, "to first token": (r.ttft or 0.0) - (r.queue_time or 0.0),
                 "generating": (r.e2e or 0.0) - (r.ttft or 0.0)}
        for phase, width in spans.items():
            ax.barh(row, width, left=start, color=PHASE_COLOURS[phase], height=0.7, label=phase if row == 0 else None)
            start += width
    ax.invert_yaxis()
    ax.set(xlabel="time since start (s)", ylabel="request", title=title)
    ax.legend(loc="upper right", fontsize=8)
    return ax


def edge_vs_server(reports: Mapping[str, RunReport], current: str) -> Figure:
    """Left: the lanes of reports[current]. Right: p50 latencies and throughput of every report given."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.22 * len(reports[current].requests) + 2.2),
                                      gridspec_kw={"width_ratios": [3, 2]}, layout="constrained")
    request_lanes(reports[current], ax=left, title=f"{current}: one lane per request")
    width = 0.8 / len(reports)
    for i, (name, report) in enumerate(reports.items()):
        s = report.summary()
        values = [s[f"p50_{key}_s"] or 0.0 for key, _ in LATENCIES]
        right.bar([j + i * width for j in range(len(LATENCIES))], values, width,
                  label=f"{name}: {s['throughput_tok_s']:.0f} tok/s")
    right.set_xticks([j + width * (len(reports) - 1) / 2 for j in range(len(LATENCIES))], [n for _, n in LATENCIES])
    right.set(ylabel="seconds", title="latency (legend: throughput)")
    right.legend(fontsize=8)
    return fig


def speculation_speedups(results: Mapping[str, list[dict]]) -> Figure:
    """Grouped bars: the speed-up over plain decoding of each engine (rows of
    `minibatch.bench.speculative.compare_speculation`) for each task in `results` ({task: rows})."""
    fig, ax = plt.subplots(figsize=(8, 3.6), layout="constrained")
    engines = [r["engine"] for r in next(iter(results.values()))]
    width = 0.8 / len(results)
    for i, (task, rows) in enumerate(results.items()):
        xs = [j + i * width for j in range(len(rows))]
        bars = ax.bar(xs, [r["speedup"] for r in rows], width, label=task)
        for bar, r in zip(bars, rows):
            if r["acceptance_rate"] is not None:
                ax.annotate(f"a={r['acceptance_rate']:.2f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=8)
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xticks([j + width * (len(results) - 1) / 2 for j in range(len(engines))], engines)
    ax.set(ylabel="speed-up over plain decoding", title="one user, greedy: tokens/s against plain (a: acceptance rate)")
    ax.legend(fontsize=8)
    return fig


def speedup_vs_batch(rows: list[dict]) -> Figure:
    """The speed-up of speculative decoding against the batch size, with the two numbers that make it:
    tokens per step and step cost (rows of `speedup_by_batch`)."""
    fig, ax = plt.subplots(figsize=(6, 3.6), layout="constrained")
    sizes = [r["batch_size"] for r in rows]
    ax.plot(sizes, [r["speedup"] for r in rows], "o-", label="speed-up (tokens/s, measured)")
    ax.plot(sizes, [r["tokens_per_step"] for r in rows], "s--", label="tokens per step")
    ax.plot(sizes, [r["step_cost"] for r in rows], "^:", label="step cost (verify step / plain step)")
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set(xlabel="batch size (sequences decoding together)", ylabel="ratio",
           title="speed-up \u2248 tokens per step \u00f7 step cost")
    ax.legend(fontsize=8)
    return fig


def formats_vs_bounds(rows: list[dict]) -> Figure:
    """One bar per weight format (rows of `minibatch.bench.formats.compare_formats`): its measured decode
    tokens/s at batch 1, drawn inside an outline at its memory bound (bandwidth / bytes a step reads)."""
    fig, ax = plt.subplots(figsize=(7, 3.6), layout="constrained")
    xs = range(len(rows))
    ax.bar(xs, [r["bound_tok_s"] for r in rows], 0.7, fill=False, edgecolor="#555555", ls="--",
           label="memory bound: copy bandwidth / bytes read per step")
    bars = ax.bar(xs, [r["tok_s"] for r in rows], 0.5, color="#2c7bb6", label="measured, fastest round")
    for bar, r in zip(bars, rows):
        ax.annotate(f"{r['of_bound']:.0%}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), [f"{r['format']}\n{r['bytes_per_weight']:.2f} B/weight" for r in rows])
    ax.set(ylabel="decode tokens/s, batch 1", title="fewer bytes per weight: a higher bound (labels: share reached)")
    ax.legend(fontsize=8, loc="upper left")
    return fig
