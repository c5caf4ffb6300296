"""The batch-slot timeline: which request occupied which slot at every step of a run.

Rows are the `max_batch_size` slots, columns are steps (or seconds). Each request has its own
colour; a hatched bar is a prefill (the prompt going through the model), a solid bar is decode
(one new token per step), a pale cross-hatched bar is a *held* slot (static batching: the request
has finished but keeps its slot until the longest member of its batch is done), and the grey
background showing through is an idle slot. Everything is read from `RunReport.steps[*].slots`,
which maps slot -> (request id, "prefill" | "decode" | "held").
"""
from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

PHASES = ("prefill", "decode", "held")
IDLE_COLOUR = "#eeeeee"          # the axes background: what an idle slot looks like
HATCH = {"prefill": "////", "decode": None, "held": "xx"}
ALPHA = {"prefill": 1.0, "decode": 1.0, "held": 0.3}  # held slots are pale: no work is done in them
EDGE = {"prefill": "white", "decode": "white", "held": "#666666"}  # bar edges, and the colour of the hatch


@dataclass(frozen=True)
class SlotRun:
    """One bar of the timeline: `request_id` sat in `slot` in `phase` from x0 to x1 (steps or seconds)."""

    slot: int
    request_id: int
    phase: str
    x0: float
    x1: float


def slot_runs(report, x: str = "step", upto: int | None = None) -> list[SlotRun]:
    """The bars of a run: consecutive steps with the same (slot, request, phase) merged into one.

    report: a `RunReport`; x: "step" (one column per step) or "time" (seconds since the run
    started); upto: only the steps before this index.
    """
    if x not in ("step", "time"):
        raise ValueError(f"x={x!r} is not allowed: choose 'step' or 'time'")
    runs: list[SlotRun] = []
    open_runs: dict[int, tuple] = {}  # slot -> (request id, phase, x0, x1, index of its last step)
    for index, step in enumerate(report.steps[:upto]):
        x0, x1 = _columns(report, index, x)
        for slot, (rid, phase) in step.slots.items():
            current = open_runs.get(slot)
            if current and current[:2] == (rid, phase) and current[4] == index - 1:
                open_runs[slot] = (rid, phase, current[2], x1, index)
                continue
            if current:
                runs.append(SlotRun(slot, *current[:4]))
            open_runs[slot] = (rid, phase, x0, x1, index)
    runs += [SlotRun(slot, *current[:4]) for slot, current in open_runs.items()]
    return sorted(runs, key=lambda r: (r.slot, r.x0))


def _columns(report, index: int, x: str) -> tuple[float, float]:
    """Where step `index` starts and ends on the x axis."""
    if x == "step":
        return index, index + 1
    step = report.steps[index]
    return step.start - report.start_time, step.end - report.start_time


def slot_occupancy(report) -> dict[str, int]:
    """Slot-steps spent computing a prefill, a decode, held by a finished request, or idle."""
    counts = {phase: 0 for phase in PHASES}
    for step in report.steps:
        for _, phase in step.slots.values():
            counts[phase] += 1
    counts["idle"] = report.max_batch_size * len(report.steps) - sum(counts.values())
    return counts


@dataclass(frozen=True)
class SlotChange:
    """At `step`, `slot` changed hands: `left` gave it up and `joined` took it (None: nobody)."""

    step: int
    slot: int
    left: int | None
    joined: int | None


def slot_changes(report) -> list[SlotChange]:
    """Every step at which a slot's occupant changed: the joins and leaves of a run, in order."""
    changes, before = [], {}
    for index, step in enumerate(report.steps):
        now = {slot: rid for slot, (rid, _) in step.slots.items()}
        for slot in sorted(set(before) | set(now)):
            if before.get(slot) != now.get(slot):
                changes.append(SlotChange(index, slot, before.get(slot), now.get(slot)))
        before = now
    return changes


def request_colour(request_id: int):
    """A fixed colour per request id: the 20 colours of tab20, dark shades first so neighbours differ."""
    index = request_id % 20
    return plt.get_cmap("tab20")(2 * index if index < 10 else 2 * (index - 10) + 1)


def slot_timeline(report, x: str = "step", upto: int | None = None, ax=None, title: str | None = None,
                  label_requests: bool = True):
    """Draw a run's batch slots over steps (x="step") or seconds (x="time"); returns the Figure.

    report: a `RunReport` (its `.steps` and `.max_batch_size` are read). upto: draw only the first
    `upto` steps, keeping the full x range (for a step scrubber). ax: draw into this Axes instead
    of a new figure. label_requests: write the request id on bars wide enough to hold it.
    """
    steps, width = report.steps, report.max_batch_size
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.35 * width + 1.6), layout="constrained")
    runs = slot_runs(report, x, upto)
    x_max = _columns(report, len(steps) - 1, x)[1] if steps else 1.0
    for run in runs:
        ax.barh(run.slot, run.x1 - run.x0, left=run.x0, height=0.8, color=request_colour(run.request_id),
                alpha=ALPHA[run.phase], hatch=HATCH[run.phase], edgecolor=EDGE[run.phase], linewidth=0.5)
        if label_requests and run.phase != "held" and run.x1 - run.x0 >= 0.04 * x_max:
            ax.text((run.x0 + run.x1) / 2, run.slot, str(run.request_id), ha="center", va="center", fontsize=7,
                    clip_on=True)
    if upto is not None and upto < len(steps):
        ax.axvline(_columns(report, upto, x)[0], color="black", linewidth=1)
    ax.set_facecolor(IDLE_COLOUR)
    ax.set_xlim(0, x_max)
    ax.set_ylim(width - 0.5, -0.5)                       # slot 0 on top
    ax.set_yticks(range(width))
    ax.set_ylabel("batch slot")
    ax.set_xlabel("step" if x == "step" else "time since start (s)")
    counts = slot_occupancy(report)
    busy = counts["prefill"] + counts["decode"]
    total = sum(counts.values()) or 1
    ax.set_title(title or f"{len(steps)} steps; slots computing {busy / total:.0%}, "
                          f"held {counts['held'] / total:.0%}, idle {counts['idle'] / total:.0%}")
    legend = [Patch(facecolor="grey", hatch="////", edgecolor="white", label="prefill"),
              Patch(facecolor="grey", label="decode"),
              Patch(facecolor="grey", alpha=ALPHA["held"], hatch="xx", edgecolor=EDGE["held"], label="held (finished)"),
              Patch(facecolor=IDLE_COLOUR, edgecolor="#bbbbbb", label="idle")]
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return ax.figure
