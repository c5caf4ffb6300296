"""The edge-mode panel: one switch between a server (continuous batching) and an edge device (a batch
of one, no batching wait), the same arrivals served both ways, latency and throughput side by side.

Both modes run when the panel is made, so flipping the switch is instant: it changes which mode's
requests are drawn lane by lane (the table's caption names it), while the table and the bars always
compare both. By default the runs use the simulated clock without the model (`clock="simulated",
sim_skip_model=True`): the times are the cost model's, not this machine's. `simulated=False` serves
the arrivals with the real model.
"""
from __future__ import annotations

from dataclasses import replace

import ipywidgets as widgets

from minibatch.config import EngineConfig
from minibatch.workloads.distributions import Fixed, Poisson
from minibatch.llm import LLM
from minibatch.viz.edge import edge_vs_server
from minibatch.widgets.panel_tools import figure_png, html_table
from minibatch.workloads import make_workload

MODES = {False: "continuous", True: "edge"}   # switch value -> scheduler
LABELS = {"continuous": "server", "edge": "edge"}
COLUMNS = {"mode": "mode", "throughput_tok_s": "throughput (tok/s)", "mean_batch_size": "mean batch",
           "p50_queue_time_s": "p50 queue (s)", "p50_ttft_s": "p50 TTFT (s)", "p99_ttft_s": "p99 TTFT (s)",
           "p50_tpot_s": "p50 TPOT (s)", "p99_e2e_s": "p99 e2e (s)"}


class EdgeModePanel(widgets.VBox):
    """A switch described "edge mode"; `reports` holds the run of each mode, `summary` the current one's summary."""

    def __init__(self, workload=None, model: str = "smollm2-135m", max_batch_size: int = 8, simulated: bool = True,
                 sim_profile: str | None = None, edge: bool = False, seed: int = 0):
        self.workload = workload or make_workload(16, arrival=Poisson(2.0), output_len=Fixed(32), seed=seed)
        self.base = EngineConfig(model=model, max_batch_size=max_batch_size, seed=seed,
                                 clock="simulated" if simulated else "real", sim_skip_model=simulated,
                                 sim_profile=sim_profile or EngineConfig.sim_profile)
        self.switch = widgets.Checkbox(value=edge, description="edge mode", indent=False)
        self.metrics = widgets.HTML()
        self.image = widgets.Image(format="png")
        self.reports = {s: self.run(s) for s in MODES.values()}   # scheduler -> RunReport
        self.switch.observe(lambda _: self.update(), names="value")
        super().__init__([self.switch, self.metrics, self.image])
        self.update()

    @property
    def mode(self) -> str:
        return MODES[self.switch.value]

    def run(self, scheduler: str):
        """Serve the workload under `scheduler`; returns the RunReport."""
        return LLM(replace(self.base, scheduler=scheduler)).run(self.workload, use_tqdm=False)

    def update(self) -> None:
        """Show the current mode: its lanes, and the comparison of both."""
        self.summary = self.reports[self.mode].summary()
        labels = {name: "edge (batch of one)" if name == "edge" else f"server (batch {self.base.max_batch_size})"
                  for name in self.reports}
        rows = [{"mode": labels[name], **report.summary()} for name, report in self.reports.items()]
        clock = "simulated clock" if self.base.clock == "simulated" else "measured on this machine"
        self.metrics.value = (f"<b>{len(self.workload)} requests, the same arrivals in both modes ({clock}); "
                              f"the lanes show {labels[self.mode]}</b>" + html_table(rows, COLUMNS))
        named = {LABELS[k]: v for k, v in self.reports.items()}
        self.image.value = figure_png(edge_vs_server(named, LABELS[self.mode]))
