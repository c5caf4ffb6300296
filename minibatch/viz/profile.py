"""Where a step's time goes, as stacked bars: one bar per profiled setting (a model size, a batch size).

- `step_profile`: the parts of one step, in ms or as shares of the step.
- `per_token_profile`: the same parts divided by the batch size, ms per token, for several batch
  sizes: the fixed costs of a step shrink per token as the batch grows.

Each bar stacks the parts of a step (`minibatch.analysis.profiler.PARTS`): the model's work in blues and
greens, overhead (scheduling, input preparation, the rest of the forward pass, sampling, the
update) in hatched warm colours, drafting in grey. The overhead share is written above each bar.
"""
from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from minibatch.analysis.profiler import OVERHEAD_PARTS, PARTS

PART_COLOURS = {
    "schedule": "#d95f02", "propose": "#999999", "prepare": "#e7298a", "embed": "#a6cee3", "norm": "#b2df8a",
    "attention": "#1f78b4", "mlp": "#33a02c", "lm_head": "#6a3d9a", "other": "#fdbf6f", "sample": "#e31a1c",
    "update": "#ff7f00",
}


def step_profile(profiles: Mapping[str, dict], share: bool = False, title: str | None = None) -> Figure:
    """Stacked bars of mean step parts; `profiles` maps a label to a profile (`RunReport.profile()` or
    `minibatch.analysis.profiler.profile_summary`). share=True draws each bar as 100% of its step."""
    if not isinstance(profiles, Mapping) or not profiles or not all("parts" in p for p in profiles.values()):
        raise ValueError("profiles is not allowed: pass {label: profile}, each from RunReport.profile() "
                         "of a run with EngineConfig(profile_steps=True)")
    labels = list(profiles)
    scale = np.array([profiles[k]["step_s"] if share else 1e-3 for k in labels])  # divide seconds by this
    fig, ax = plt.subplots(figsize=(max(4.5, 1.4 * len(labels) + 3), 3.8), layout="constrained")
    bottom = np.zeros(len(labels))
    for part in PARTS:
        heights = np.array([profiles[k]["parts"][part] for k in labels]) / scale
        if not heights.any():
            continue
        ax.bar(labels, heights, bottom=bottom, color=PART_COLOURS[part], label=part, edgecolor="white",
               hatch="//" if part in OVERHEAD_PARTS else None)
        bottom += heights
    for x, (label, top) in enumerate(zip(labels, bottom)):
        ax.annotate(f"overhead {profiles[label]['overhead_share']:.0%}", (x, top), ha="center", va="bottom",
                    fontsize=8, xytext=(0, 2), textcoords="offset points")
    ax.set_ylabel("share of the step" if share else "ms per step")
    ax.set_ylim(0, bottom.max() * 1.12)
    handles, names = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], names[::-1], loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8,
              title="hatched: overhead", title_fontsize=8)
    ax.set_title(title or "Where a decode step's time goes")
    return fig


def per_token_profile(profiles: Mapping[int, dict], title: str | None = None) -> Figure:
    """Stacked bars of ms per token (step parts / batch size), one bar per batch size in `profiles`
    ({batch size: profile}); the throughput a step of that size gives is written above each bar."""
    per_token = {f"batch {b}": {**p, "parts": {k: v / b for k, v in p["parts"].items()}, "step_s": p["step_s"] / b}
                 for b, p in profiles.items()}
    fig = step_profile(per_token, title=title or "Cost of one token: the step shared by its batch")
    ax = fig.axes[0]
    ax.set_ylabel("ms per token")
    for text, (b, p) in zip(ax.texts, profiles.items()):
        text.set_text(f"{b / p['step_s']:.0f} tok/s\noverhead {1e3 * p['overhead_share'] * p['step_s'] / b:.2f} ms")
    ax.set_ylim(0, max(1e3 * p["step_s"] / b for b, p in profiles.items()) * 1.25)
    return fig


def fixed_cost_figure(rows: list[dict], title: str | None = None) -> Figure:
    """Left: each model's decode step as measured, split into its fixed part and its layers and LM head (ms,
    log scale); right: the fixed part's share of the whole model's step against the weight bytes it reads.
    `rows` is `minibatch.analysis.overhead.table`; a model measured on its first layers only is drawn at
    full depth (fixed part + LM head + per-layer time x all its layers), with a hollow marker as run."""
    needed = {"label", "layers", "fixed", "forward", "share", "weight_mb", "full_weight_mb", "full_share"}
    if not rows or not all(needed <= set(r) for r in rows):
        raise ValueError("rows is not allowed: pass minibatch.analysis.overhead.table(engines, rounds)")
    x, colour = np.arange(len(rows)), PART_COLOURS["sample"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.9), layout="constrained")
    left.bar(x - 0.2, [r["fixed"] for r in rows], 0.4, color=colour, hatch="//", edgecolor="white",
             label="fixed part (outside the forward pass)")
    left.bar(x + 0.2, [r["forward"] for r in rows], 0.4, color=PART_COLOURS["attention"], label="layers and LM head")
    left.set(xticks=x, xticklabels=[f"{r['label']}\n{r['layers']} layers" for r in rows], yscale="log",
             ylabel="ms per decode step (median)", title=title or "One user's decode step, as measured")
    left.legend(fontsize=8)
    right.plot([r["full_weight_mb"] for r in rows], [r["full_share"] for r in rows], "o-", color=colour,
               label="whole model")
    cut = [r for r in rows if r["layers"].split("/")[0] != r["layers"].split("/")[1]]
    right.plot([r["weight_mb"] for r in cut], [r["share"] for r in cut], "o", mfc="none", color=colour,
               label="first layers only, as measured")
    for r in rows:
        right.annotate(r["label"], (r["full_weight_mb"], r["full_share"]), fontsize=8, xytext=(4, 4),
                       textcoords="offset points")
    right.set(xscale="log", yscale="log", xlabel="weights read per step (MB, log)",
              ylabel="fixed part's share of the step (log)", title="The fixed part's share falls as the model grows")
    right.legend(fontsize=8)
    return fig
