"""The SLA tuner panel: state a load and an SLA, press "tune", and see the best batching configuration
and the Pareto front of throughput against tail latency.

The search is `minibatch.tools.tune.tune` on the simulated clock (no model), over a small grid so it
finishes in seconds. The figure shows every configuration that served the whole workload twice:
at its two tail latencies against the SLA's box (inside it, the SLA is met), and at its
throughput against its tail latency, with the Pareto front as a staircase. The best configuration
(the highest goodput among those meeting the SLA) is a red star on both.
"""
from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt

from minibatch.config import EngineConfig
from minibatch.workloads.distributions import Poisson, Uniform
from minibatch.analysis.sla import SLA
from minibatch.tools.tune import tune
from minibatch.viz.latency import sla_map, throughput_latency
from minibatch.widgets.panel_tools import figure_png, fmt, html_table
from minibatch.workloads import make_workload

PANEL_SPACE = {   # a coarser grid than tune.DEFAULT_SPACE, so a search takes seconds
    "max_batch_size": (1, 2, 4, 8, 16, 32),
    "batch_timeout_s": (0.0, 0.1, 0.5),
    "max_tokens_per_step": (128, 512, 2048),
}
STYLE = {"description_width": "initial"}


class TunerPanel(widgets.VBox):
    """Sliders for the load and the SLA, a tune button; `result` holds the last `TuneResult`."""

    def __init__(self, model: str = "smollm2-135m", num_requests: int = 80, output_len=Uniform(16, 48),
                 rate: float = 0.5, ttft_s: float = 2.0, tpot_s: float = 0.3, percentile: float = 99.0,
                 space: dict | None = None, sim_profile: str | None = None, seed: int = 0, tune_now: bool = True):
        self.model, self.num_requests, self.output_len, self.seed = model, num_requests, output_len, seed
        self.percentile, self.space = percentile, space or PANEL_SPACE
        self.sim_profile = sim_profile or EngineConfig.sim_profile
        self.rate_slider = widgets.FloatSlider(value=rate, min=0.1, max=4.0, step=0.1,
                                               description="arrival rate (req/s)", continuous_update=False, style=STYLE)
        self.ttft_slider = widgets.FloatSlider(value=ttft_s, min=0.1, max=5.0, step=0.1,
                                               description=f"p{percentile:g} TTFT limit (s)", continuous_update=False,
                                               style=STYLE)
        self.tpot_slider = widgets.FloatSlider(value=tpot_s, min=0.02, max=1.0, step=0.01,
                                               description=f"p{percentile:g} TPOT limit (s)", continuous_update=False,
                                               style=STYLE)
        self.tune_button = widgets.Button(description="tune", button_style="primary")
        self.tune_button.on_click(lambda _: self.update())
        self.metrics = widgets.HTML("<i>press tune</i>")
        self.image = widgets.Image(format="png")
        super().__init__([self.rate_slider, widgets.HBox([self.ttft_slider, self.tpot_slider]), self.tune_button,
                          self.metrics, self.image])
        self.result = None
        if tune_now:
            self.update()

    def sla(self) -> SLA:
        return SLA(ttft_s=self.ttft_slider.value, tpot_s=self.tpot_slider.value, percentile=self.percentile)

    def workload(self):
        return make_workload(self.num_requests, arrival=Poisson(self.rate_slider.value), output_len=self.output_len,
                             seed=self.seed)

    def update(self) -> None:
        """Search the configurations for the current load and SLA, then redraw."""
        base = EngineConfig(model=self.model, sim_profile=self.sim_profile, seed=self.seed)
        self.result = tune(self.workload(), self.sla(), base=base, space=self.space, use_tqdm=False)
        best = self.result.best
        verdict = "meets the SLA" if best.result["sla_met"] else "<b>no configuration meets the SLA</b>; the closest"
        self.metrics.value = (
            f"<b>{self.sla().describe()}</b> at {self.rate_slider.value:g} req/s, {self.num_requests} requests "
            f"(simulated clock, {self.sim_profile}); {len(self.result.trials)} trials.<br>"
            f"best: {verdict}: " + ", ".join(f"{k}={v}" for k, v in best.knobs.items())
            + f"; goodput {fmt(best.result['goodput_req_s'])} req/s, "
            f"throughput {fmt(best.result['throughput_tok_s'])} tok/s<br>Pareto front:"
            + html_table([t.knobs | t.result for t in self.result.pareto],
                         {"max_batch_size": "max batch", "batch_timeout_s": "timeout (s)",
                          "max_tokens_per_step": "token budget", "throughput_tok_s": "throughput (tok/s)",
                          self.result.latency_key: self.result.latency_key, "goodput_req_s": "goodput (req/s)",
                          "sla_met": "SLA met"}))
        self.image.value = figure_png(self.figure())

    def figure(self):
        """Left: each configuration's tails against the SLA box. Right: throughput against tail latency,
        the Pareto front, and the chosen configuration (a star on both)."""
        result, sla = self.result, self.sla()
        rows = [{**t.knobs, **t.result} for t in result.trials if t.num_requests == result.num_requests]
        tail = f"sla_p{sla.percentile:g}_{{}}_s"
        best = result.best.result
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
        sla_map(rows, tail.format("ttft"), tail.format("tpot"), sla.ttft_s, sla.tpot_s, ax=left)
        left.plot(best[tail.format("ttft")], best[tail.format("tpot")], "*", markersize=16, color="tab:red")
        throughput_latency(rows, latency=result.latency_key, ax=right)
        right.lines[0].set(color="grey", alpha=0.6)
        right.plot(best[result.latency_key], best["throughput_tok_s"], "*", markersize=16, color="tab:red",
                   label="best for the SLA")
        right.legend(fontsize=8)
        return fig
