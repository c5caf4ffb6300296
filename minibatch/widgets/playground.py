"""The playground: every serving knob in one panel, and the timeline, the KV map and the metrics together.

Scheduler, max batch size, batch timeout and arrival rate work as in `BatchingPanel` (this panel is
one, with a KV budget added); KV memory sets the cache's budget in MiB, turned into blocks with the
engine's own accounting (`minibatch.analysis.memory`: bytes per token x block size). Every change reruns the
same seeded workload on the simulated clock without the model, so it takes a second or two and the
times are those of a cost model calibrated on a CPU. The figure shows the slot timeline and, beneath
it, the KV-block map at the step that held the most blocks (marked on the timeline by a dashed line).
A budget too small for the longest request is refused by the engine; the panel says so instead of
drawing.
"""
from __future__ import annotations

import dataclasses

import ipywidgets as widgets
import matplotlib.pyplot as plt

from minibatch.config import ConfigError
from minibatch.analysis.memory import KVShape, capacity
from minibatch.viz.kv_map import grid_shape, kv_block_map, peak_step
from minibatch.viz.timeline import slot_timeline
from minibatch.widgets.batching import COLUMNS as BATCHING_COLUMNS
from minibatch.widgets.batching import STYLE, BatchingPanel
from minibatch.widgets.panel_tools import html_table

MIB = 1 << 20
KV_DTYPE = "float32"   # the cache's element type: float32, as on the CPU the cost model was calibrated on
COLUMNS = {**BATCHING_COLUMNS, "kv_mib": "KV (MiB)", "num_kv_blocks": "KV blocks", "preemptions": "preemptions",
           "peak_kv_blocks": "peak blocks", "peak_kv_usage": "peak KV use"}
NOTE = ("<i>Each change reruns {n} requests on the simulated clock without the model, in a second or two: "
        "the times come from a cost model calibrated on a CPU ({profile}), not from this machine.</i>")


class PlaygroundPanel(BatchingPanel):
    """The batching knobs plus a KV memory budget, over a simulated run.

    After every change: `num_kv_blocks` is the cache the budget gives, `report`/`summary` the run
    (None if the engine refused it), `history` the last runs' rows, `peak_step` the step drawn in
    the KV map, `message.value` the refusal (empty when the run went through).
    """

    def __init__(self, model: str = "smollm2-135m", kv_memory_mib: float = 32.0, kv_range=(1.0, 64.0, 1.0),
                 block_size: int = 16, **batching):
        self.block_size = block_size
        self.bytes_per_token = KVShape.of_model(model, KV_DTYPE).bytes_per_token
        low, high, step = kv_range
        self.kv_slider = widgets.FloatSlider(value=kv_memory_mib, min=low, max=high, step=step,
                                             description="KV memory (MiB)", continuous_update=False, style=STYLE)
        self.kv_blocks_label = widgets.HTML()
        self.message = widgets.HTML()
        self.num_kv_blocks, self.peak_step = None, None
        super().__init__(model=model, **batching)               # builds the batching knobs and runs once
        self.kv_slider.observe(lambda _: self.update(), names="value")
        note = widgets.HTML(NOTE.format(n=self.num_requests, profile=self.sim_profile))
        self.children = [note, self.scheduler_choice, widgets.HBox([self.batch_size_slider, self.timeout_slider]),
                         widgets.HBox([self.rate_slider, self.kv_slider, self.kv_blocks_label]),
                         self.message, self.metrics, self.image]

    def kv_blocks(self, mib: float) -> int:
        """Blocks a budget of `mib` MiB holds (at least one, as the engine allows no empty cache)."""
        return max(1, capacity(self.bytes_per_token, max(1, int(mib * MIB)), self.block_size)["blocks"])

    def config(self):
        return dataclasses.replace(super().config(), dtype=KV_DTYPE, block_size=self.block_size,
                                   num_kv_blocks=self.num_kv_blocks)

    def update(self) -> None:
        """Size the cache from the KV slider, rerun, and show the run or why the engine refused it."""
        self.num_kv_blocks = self.kv_blocks(self.kv_slider.value)
        self.kv_blocks_label.value = (f"= <b>{self.num_kv_blocks} blocks</b> of {self.block_size} tokens "
                                      f"({self.bytes_per_token:,} bytes a token)")
        with self.metrics.hold_sync():          # the browser gets the final table, not the batching panel's first
            try:
                super().update()                    # runs, keeps the row, redraws with self.figure()
            except ConfigError as error:
                self.refused(error)
                return
            self.message.value = ""
            self.image.layout.display = None
            peak = self.report.steps[self.peak_step]
            self.history[-1].update(kv_mib=self.kv_slider.value, num_kv_blocks=self.num_kv_blocks,
                                    peak_kv_blocks=peak.kv_blocks_used,
                                    peak_kv_usage=peak.kv_blocks_used / self.num_kv_blocks)
            self.metrics.value = ("<b>the last line is the current setting</b>"
                                  + html_table(self.history, COLUMNS, bold_last=True))

    def refused(self, error: ConfigError) -> None:
        """The engine would not run: say why instead of drawing, and keep the earlier runs' table."""
        self.report = self.summary = self.peak_step = None
        self.message.value = (f"<p style='color:#b00000'><b>Too little KV memory:</b> {self.kv_slider.value:g} MiB "
                              f"holds only {self.num_kv_blocks} block(s), too few for the longest request. "
                              f"The engine refused the run: {error}</p>")
        self.metrics.value = "earlier runs" + html_table(self.history, COLUMNS) if self.history else ""
        self.image.layout.display = "none"

    def figure(self):
        """The slot timeline over simulated time, and the KV-block map at the step of peak KV usage."""
        report, width = self.report, self.report.max_batch_size
        self.peak_step = peak_step(report)
        rows, _ = grid_shape(self.num_kv_blocks)
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 0.3 * width + 0.32 * rows + 3.4), layout="constrained",
                                          gridspec_kw={"height_ratios": [max(2, width / 3), max(1.2, rows / 3)]})
        slot_timeline(report, x="time", ax=top, label_requests=width <= 16)
        top.axvline(report.steps[self.peak_step].start - report.start_time, color="black", linestyle="--", linewidth=1)
        top.set_xlabel("time since start (s, simulated); dashed: the step of peak KV usage, drawn below")
        kv_block_map(report, self.block_size, step=self.peak_step, ax=bottom)
        return fig
