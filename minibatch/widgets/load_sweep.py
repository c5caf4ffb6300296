"""The load slider: move along a load sweep and watch the latency curve and the queue at that load.

The sweep (`minibatch.analysis.queueing.load_sweep`) is run once, before the panel is built, so
moving the slider only redraws: a marker moves along every curve of `load_sweep_figure`, the table
gives that level's figures, and beneath them the batch and the queue of that level's run over time
show what the averages are made of (below capacity the queue empties again; past it, it only grows).
"""
from __future__ import annotations

import ipywidgets as widgets

from minibatch.analysis.queueing import LoadSweep
from minibatch.viz.load import load_over_time
from minibatch.viz.queueing import load_sweep_figure
from minibatch.widgets.panel_tools import figure_png, html_table

COLUMNS = {"share": "load / capacity", "rate": "offered (req/s)", "p50_ttft_s": "p50 TTFT (s)",
           "p99_ttft_s": "p99 TTFT (s)", "p99_e2e_s": "p99 e2e (s)", "mean_queue_depth": "mean queue",
           "mean_in_system": "mean in system L", "lambda_W": "lambda x W", "utilisation": "slots used"}


class LoadSweepPanel(widgets.VBox):
    """A slider "offered load / capacity" over a sweep's levels; `point` is the level shown."""

    def __init__(self, sweep: LoadSweep, sla=None, share: float = 1.0, scv: float = 0.0):
        self.sweep, self.sla, self.scv = sweep, sla, scv
        self.load_slider = widgets.SelectionSlider(
            options=[(f"{p.share:.3g}", p.share) for p in sweep.points], value=sweep.nearest(share).share,
            description="offered load / capacity", continuous_update=False, style={"description_width": "initial"})
        self.metrics = widgets.HTML()
        self.curves = widgets.Image(format="png")
        self.queue = widgets.Image(format="png")
        self.load_slider.observe(lambda _: self.update(), names="value")
        super().__init__([self.load_slider, self.metrics, self.curves, self.queue])
        self.update()

    def update(self) -> None:
        """Redraw for the level the slider is on."""
        self.point = self.sweep.nearest(self.load_slider.value)
        row = {"share": self.point.share, "rate": self.point.rate, **self.point.figures}
        verdict = ""
        if self.sla is not None:
            met = self.sla.met_by(self.point.report)
            verdict = f"; {self.sla.describe()}: {'met' if met else 'missed'}"
        self.metrics.value = f"<b>simulated clock{verdict}</b>" + html_table([row], COLUMNS)
        self.curves.value = figure_png(load_sweep_figure(self.sweep, at=self.point.share, sla=self.sla, scv=self.scv))
        self.queue.value = figure_png(load_over_time(
            self.point.report, panels=("batch_size", "queue_depth"),
            title=f"the run at {self.point.share:.3g}x capacity ({self.point.rate:.3g} requests/s offered)"))
