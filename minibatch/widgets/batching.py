"""The batching panel: move the scheduler, max batch size, batch timeout and arrival rate, and watch
throughput, latency and the batch-slot timeline respond.

Every change reruns the same seeded workload (Poisson arrivals at the chosen rate) on the
simulated clock without the model (`clock="simulated", sim_skip_model=True`), so a rerun takes
about a second; the times are the cost model's, not this machine's. The table keeps the last runs,
so two settings can be compared side by side; the figure shows the slots over time and the queue
of waiting requests beneath them.
"""
from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt

from minibatch.config import SCHEDULERS, EngineConfig
from minibatch.workloads.distributions import Poisson, Uniform
from minibatch.llm import LLM
from minibatch.viz.load import step_series
from minibatch.viz.timeline import slot_timeline
from minibatch.widgets.panel_tools import figure_png, html_table
from minibatch.workloads import make_workload

HISTORY = 6   # runs kept in the comparison table
COLUMNS = {"scheduler": "scheduler", "max_batch_size": "max batch", "batch_timeout_s": "timeout (s)",
           "rate": "rate (req/s)", "throughput_tok_s": "throughput (tok/s)", "mean_batch_size": "mean batch",
           "p50_ttft_s": "p50 TTFT (s)", "p99_ttft_s": "p99 TTFT (s)", "p50_tpot_s": "p50 TPOT (s)",
           "p99_e2e_s": "p99 e2e (s)"}
STYLE = {"description_width": "initial"}


class BatchingPanel(widgets.VBox):
    """Sliders for the batching knobs over a simulated run; `report`, `summary` and `history` hold the results."""

    def __init__(self, model: str = "smollm2-135m", num_requests: int = 48, output_len=Uniform(16, 48),
                 rate: float = 1.0, scheduler: str = "continuous", max_batch_size: int = 8,
                 batch_timeout_s: float = 0.0, sim_profile: str | None = None, seed: int = 0):
        self.model, self.num_requests, self.output_len, self.seed = model, num_requests, output_len, seed
        self.sim_profile = sim_profile or EngineConfig.sim_profile
        self.scheduler_choice = widgets.ToggleButtons(options=SCHEDULERS, value=scheduler, description="scheduler",
                                                      style=STYLE)
        self.batch_size_slider = widgets.IntSlider(value=max_batch_size, min=1, max=32, description="max batch size",
                                                   continuous_update=False, style=STYLE)
        self.timeout_slider = widgets.FloatSlider(value=batch_timeout_s, min=0.0, max=2.0, step=0.05,
                                                  description="batch timeout (s)", readout_format=".2f",
                                                  continuous_update=False, style=STYLE)
        self.rate_slider = widgets.FloatSlider(value=rate, min=0.1, max=8.0, step=0.1,
                                               description="arrival rate (req/s)", continuous_update=False, style=STYLE)
        self.metrics = widgets.HTML()
        self.image = widgets.Image(format="png")
        controls = (self.scheduler_choice, self.batch_size_slider, self.timeout_slider, self.rate_slider)
        for control in controls:
            control.observe(lambda _: self.update(), names="value")
        super().__init__([self.scheduler_choice, widgets.HBox(controls[1:3]), self.rate_slider,
                          self.metrics, self.image])
        self.history: list[dict] = []
        self.update()

    def config(self) -> EngineConfig:
        return EngineConfig(model=self.model, scheduler=self.scheduler_choice.value,
                            max_batch_size=self.batch_size_slider.value, batch_timeout_s=self.timeout_slider.value,
                            clock="simulated", sim_skip_model=True, sim_profile=self.sim_profile, seed=self.seed)

    def workload(self):
        return make_workload(self.num_requests, arrival=Poisson(self.rate_slider.value), output_len=self.output_len,
                             seed=self.seed)

    def update(self) -> None:
        """Rerun the workload with the current settings and redraw."""
        edge = self.scheduler_choice.value == "edge"           # edge mode is a batch of one, with no wait
        self.batch_size_slider.disabled = self.timeout_slider.disabled = edge
        config = self.config()
        self.report = LLM(config).run(self.workload(), use_tqdm=False)
        self.summary = self.report.summary()
        row = {"scheduler": config.scheduler, "max_batch_size": config.batch_slots,
               "batch_timeout_s": config.batch_timeout_s, "rate": self.rate_slider.value, **self.summary}
        self.history = (self.history + [row])[-HISTORY:]
        self.metrics.value = (f"<b>{self.num_requests} requests, simulated clock ({self.sim_profile})</b>; "
                              "the last line is the current setting"
                              + html_table(self.history, COLUMNS, bold_last=True))
        self.image.value = figure_png(self.figure())

    def figure(self):
        """The slot timeline over time, and the queue depth beneath it."""
        width = self.report.max_batch_size
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 0.3 * width + 2.8), sharex=True,
                                          gridspec_kw={"height_ratios": [max(2, width / 3), 1]}, layout="constrained")
        slot_timeline(self.report, x="time", ax=top, label_requests=width <= 16)
        top.set_xlabel("")
        series = step_series(self.report)
        bottom.step(series["time"], series["queue_depth"], where="post", color="tab:orange")
        bottom.set(ylabel="queue depth", xlabel="time since start (s, simulated)")
        return fig
