"""Latency distributions and the throughput-latency trade-off, drawn from finished runs.

- `latency_cdf`: for one run or several, the share of requests served within x seconds, one panel
  per metric (TTFT, TPOT, e2e, queue time). Dotted lines mark p50 and p99: read a tail latency
  where a curve crosses the p99 line.
- `throughput_latency`: one point per configuration of a sweep, throughput against a tail latency,
  points of the same series joined; the Pareto front (the configurations no other one beats on
  both) is drawn as a staircase.
- `pareto_rows`: those configurations, as a list.
- `sla_map`: configurations at their two tail latencies (say p99 TTFT and p99 TPOT), with the
  SLA's box: the ones inside it meet the SLA.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from minibatch.analysis.metrics import RunReport

LATENCY_LABELS = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "e2e latency", "queue_time": "queue time"}


def _named_reports(reports) -> dict[str, RunReport]:
    if isinstance(reports, RunReport):
        return {"run": reports}
    if isinstance(reports, Mapping) and reports and all(isinstance(r, RunReport) for r in reports.values()):
        return {str(k): v for k, v in reports.items()}
    raise TypeError(f"reports={reports!r} is not allowed: a RunReport or a dict of name -> RunReport")


def latency_cdf(reports, metrics: Sequence[str] = ("ttft", "tpot", "e2e"), log_x: bool = False) -> Figure:
    """Empirical CDFs of per-request latencies; `reports` is a RunReport or {name: RunReport}."""
    named = _named_reports(reports)
    unknown = [m for m in metrics if m not in LATENCY_LABELS]
    if unknown or not metrics:
        raise ValueError(f"metrics={tuple(metrics)!r} is not allowed: choose from {', '.join(LATENCY_LABELS)}")
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4), squeeze=False, layout="constrained")
    for ax, metric in zip(axes[0], metrics):
        for name, report in named.items():
            values = np.sort([v for r in report.requests if (v := getattr(r, metric)) is not None])
            if len(values) == 0:
                continue
            share = np.arange(1, len(values) + 1) / len(values)
            ax.step(values, share, where="post", label=name)
        for level in (0.5, 0.99):
            ax.axhline(level, color="grey", linestyle=":", linewidth=0.8)
            ax.text(1.0, level, f" p{round(level * 100)}", transform=ax.get_yaxis_transform(),
                    va="center", ha="left", fontsize=8, color="grey")
        if log_x:
            ax.set_xscale("log")
        ax.set(xlabel=f"{LATENCY_LABELS[metric]} (s)", ylim=(0, 1.02), title=LATENCY_LABELS[metric])
    axes[0][0].set_ylabel("share of requests")
    if len(named) > 1:
        axes[0][-1].legend(fontsize=8, loc="lower right")
    return fig


def pareto_rows(rows: Sequence[Mapping], latency: str = "p99_e2e_s",
                 throughput: str = "throughput_tok_s") -> list[Mapping]:
    """The rows no other row beats on both counts (lower latency and higher throughput), by latency."""
    points = sorted((r for r in rows if r.get(latency) is not None and r.get(throughput) is not None),
                    key=lambda r: (r[latency], -r[throughput]))
    front, best = [], -np.inf
    for row in points:
        if row[throughput] > best:
            front.append(row)
            best = row[throughput]
    return front


def _axis_label(field: str) -> str:
    """A summary key as an axis label: "sla_p99_ttft_s" -> "p99 TTFT (s)", "goodput_req_s" -> "goodput (req/s)"."""
    stem, unit = field, ""
    for suffix, name in (("_tok_s", " (tok/s)"), ("_req_s", " (req/s)"), ("_per_s", " (/s)"), ("_s", " (s)")):
        if field.endswith(suffix):
            stem, unit = field[: -len(suffix)], name
            break
    words = [{"ttft": "TTFT", "tpot": "TPOT", "sla": ""}.get(w, w) for w in stem.split("_")]
    return " ".join(w for w in words if w) + unit


def throughput_latency(rows: Sequence[Mapping], latency: str = "p99_e2e_s", throughput: str = "throughput_tok_s",
                       series: str | None = None, along: str | None = None, front: bool = True,
                       log_x: bool = False, ax=None) -> Figure:
    """Throughput against a latency, one point per row (a run's summary plus its configuration).

    Rows sharing a value of `series` are joined in order of `along` and labelled with it (e.g.
    series="batch_timeout_s", along="max_batch_size"); `front` draws the Pareto front; `ax` draws
    into that Axes instead of a new figure.
    """
    if not rows:
        raise ValueError("rows=[] is not allowed: pass at least one run's summary")
    missing = [k for k in (latency, throughput, series, along) if k is not None and k not in rows[0]]
    if missing:
        raise KeyError(f"rows have no field {missing[0]!r}; fields: {', '.join(rows[0])}")
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
    groups: dict = {}
    for row in rows:
        groups.setdefault(row[series] if series else None, []).append(row)
    for key, group in groups.items():
        if along:
            group = sorted(group, key=lambda r: r[along])
        xs, ys = [r[latency] for r in group], [r[throughput] for r in group]
        ax.plot(xs, ys, marker="o", linestyle="-" if along else "none", label=None if series is None else f"{series}={key}")
        if along:
            for r, x, y in zip(group, xs, ys):
                ax.annotate(str(r[along]), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    if front:
        best = pareto_rows(rows, latency, throughput)
        ax.step([r[latency] for r in best], [r[throughput] for r in best], where="post", color="black",
                linewidth=2, alpha=0.35, label="Pareto front", zorder=0)
    if log_x:
        ax.set_xscale("log")
    ax.set(xlabel=_axis_label(latency), ylabel=_axis_label(throughput),
           title="throughput vs latency" + (f" (labels: {along})" if along else ""))
    if series or front:
        ax.legend(fontsize=8)
    return ax.figure


def sla_map(rows: Sequence[Mapping], x: str, y: str, x_limit: float | None, y_limit: float | None,
            colour: str = "goodput_req_s", ax=None) -> Figure:
    """Each row (a configuration's results) at two tail latencies, coloured by `colour`; the SLA's
    limits bound the shaded box at the bottom left, where the configurations that meet it lie."""
    if ax is None:
        _, ax = plt.subplots(figsize=(5.2, 4.2), layout="constrained")
    points = ax.scatter([r[x] for r in rows], [r[y] for r in rows], c=[r[colour] for r in rows], cmap="viridis",
                        s=28, edgecolors="black", linewidths=0.3)
    ax.figure.colorbar(points, ax=ax, label=_axis_label(colour))
    if x_limit is not None and y_limit is not None:
        ax.add_patch(plt.Rectangle((0, 0), x_limit, y_limit, color="tab:green", alpha=0.12, label="meets the SLA"))
    for limit, line in ((x_limit, ax.axvline), (y_limit, ax.axhline)):
        if limit is not None:
            line(limit, color="tab:green", linestyle="--", linewidth=1)
    ax.set(xlabel=_axis_label(x), ylabel=_axis_label(y), xscale="log", yscale="log", title="tail latencies vs the SLA")
    for axis in (ax.xaxis, ax.yaxis):          # log axes labelled 0.1, 0.2, 0.3, 0.5, 1, 2, ... in plain numbers
        axis.set_major_locator(LogLocator(subs=(1, 2, 3, 5)))
        axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axis.set_minor_formatter(NullFormatter())
    return ax.figure
