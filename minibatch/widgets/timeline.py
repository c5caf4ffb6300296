"""A step scrubber over recorded batch-slot timelines: drag through a run step by step.

Nothing is recomputed: the panel redraws `minibatch.viz.slot_timeline` up to the chosen step and
says what the scheduler did in it, so it works on any `RunReport` (measured or simulated).
"""
from __future__ import annotations

import ipywidgets as widgets
from matplotlib.figure import Figure

from minibatch.viz.timeline import slot_timeline
from minibatch.widgets.panel_tools import figure_png


def describe_step(report, index: int) -> str:
    """One line on step `index`: who computed what, who held a slot, who waited."""
    step = report.steps[index]
    phases = [phase for _, phase in step.slots.values()]
    held, computing = phases.count("held"), step.batch_size
    idle = report.max_batch_size - computing - held
    tokens = step.num_prefill_tokens + step.num_decode_tokens
    return (f"step {index}: {_count(computing, 'sequence')} computing ({phases.count('prefill')} prefill, "
            f"{phases.count('decode')} decode; {_count(tokens, 'token')}), {_count(held, 'slot')} held, "
            f"{idle} idle, {_count(step.queue_depth, 'request')} waiting; {1000 * step.duration:.0f} ms")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class TimelineScrubber(widgets.VBox):
    """Pick a run (if several), an x axis and a step; the timeline is drawn up to that step.

    reports: one `RunReport` or a dict {name: RunReport}. After any change, `.figure` is the
    figure just drawn (shown as PNG in `.image`) and `.caption.value` describes the chosen step.
    """

    def __init__(self, reports, x: str = "step"):
        self.reports = reports if isinstance(reports, dict) else {"run": reports}
        names = list(self.reports)
        self.run = widgets.ToggleButtons(options=names, value=names[0], description="run")
        self.axis = widgets.ToggleButtons(options=["step", "time"], value=x, description="x axis")
        self.step = widgets.IntSlider(min=1, description="steps shown", continuous_update=False,
                                      layout=widgets.Layout(width="60%"))
        self.caption = widgets.HTML()
        self.image = widgets.Image(format="png")
        self.figure = None
        controls = [self.run] if len(names) > 1 else []
        super().__init__(controls + [self.axis, self.step, self.caption, self.image])
        self.step.max = self.step.value = max(1, len(self.report.steps))
        self.draw()
        self.run.observe(lambda _: self._set_range(), names="value")
        for control in (self.axis, self.step):
            control.observe(lambda _: self.draw(), names="value")

    @property
    def report(self):
        return self.reports[self.run.value]

    def _set_range(self) -> None:
        """A new run: the slider spans its steps and starts at the end (the whole run)."""
        last = max(1, len(self.report.steps))
        unchanged = self.step.value == last
        self.step.max = last
        self.step.value = last                    # a changed value redraws through its observer
        if unchanged:
            self.draw()

    def draw(self) -> None:
        report, shown = self.report, self.step.value
        self.figure = Figure(figsize=(10, 0.35 * report.max_batch_size + 1.6), layout="constrained")
        slot_timeline(report, x=self.axis.value, upto=shown, ax=self.figure.subplots())
        self.caption.value = describe_step(report, shown - 1) if report.steps else "no steps"
        self.image.value = figure_png(self.figure)
