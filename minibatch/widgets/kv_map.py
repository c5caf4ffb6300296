"""Sliders over the KV cache: scrub a run's block map step by step, and follow one token through a block table.

`KVMapScrubber` recomputes nothing: it redraws `minibatch.viz.kv_block_map` at the chosen step of
recorded runs. `BlockTableExplorer` draws `minibatch.viz.block_table_figure` for a sequence whose
blocks are scattered over a small cache, and says where a chosen position lives.
"""
from __future__ import annotations

import ipywidgets as widgets
import numpy as np
from matplotlib.figure import Figure

from minibatch.viz.kv_map import block_table_figure, grid_shape, kv_block_map, peak_step, shared_blocks, step_usage
from minibatch.widgets.panel_tools import figure_png


def describe_kv_step(report, index: int, block_size: int) -> str:
    """One line on step `index`: sequences in the cache, blocks held, tokens stored, waste, preemptions."""
    step = report.steps[index]
    usage = step_usage(step, block_size)
    return (f"step {index}: {usage['seqs']} sequences hold {usage['blocks_used']} of {usage['blocks_total']} blocks "
            f"({usage['tokens_stored']} tokens in {usage['tokens_reserved']} slots: {usage['waste_fraction']:.0%} "
            f"empty); {step.batch_size} computing, {step.queue_depth} waiting, {step.num_preempted} preempted"
            + (f"; {len(shared_blocks(step))} blocks shared, {len(step.cached_blocks)} cached for reuse"
               if step.cached_blocks or shared_blocks(step) else ""))


class KVMapScrubber(widgets.VBox):
    """Pick a run (if several) and a step; the cache's block map at that step is drawn.

    reports: one `RunReport` or a dict {name: RunReport}, all with the same `block_size`. The
    slider starts at the step that held the most blocks. After any change, `.figure` is the
    figure just drawn (shown as PNG in `.image`) and `.caption.value` describes the step.
    """

    def __init__(self, reports, block_size: int, columns: int | None = None):
        self.reports = reports if isinstance(reports, dict) else {"run": reports}
        self.block_size, self.columns = block_size, columns
        names = list(self.reports)
        self.run = widgets.ToggleButtons(options=names, value=names[0], description="run")
        self.step = widgets.IntSlider(min=0, description="step", continuous_update=False,
                                      layout=widgets.Layout(width="60%"))
        self.caption = widgets.HTML()
        self.image = widgets.Image(format="png")
        self.figure = None
        super().__init__(([self.run] if len(names) > 1 else []) + [self.step, self.caption, self.image])
        self._set_range()
        self.run.observe(lambda _: self._set_range(), names="value")

    @property
    def report(self):
        return self.reports[self.run.value]

    def _redraw(self, _change) -> None:
        self.draw()

    def _set_range(self) -> None:
        """A run is chosen: the slider spans its steps and starts at its busiest step."""
        self.step.unobserve(self._redraw, names="value")
        self.step.max = len(self.report.steps) - 1
        self.step.value = peak_step(self.report)
        self.step.observe(self._redraw, names="value")
        self.draw()

    def draw(self) -> None:
        report, index = self.report, self.step.value
        rows, _ = grid_shape(report.steps[index].kv_blocks_total, self.columns)
        self.figure = Figure(figsize=(10, 0.32 * rows + 1.4), layout="constrained")
        kv_block_map(report, self.block_size, step=index, columns=self.columns, ax=self.figure.subplots())
        self.caption.value = describe_kv_step(report, index, self.block_size)
        self.image.value = figure_png(self.figure)


class BlockTableExplorer(widgets.VBox):
    """A sequence of `context_len` tokens whose blocks are scattered over a cache of `num_blocks`
    blocks; sliders choose the context length, the block size and one position to follow."""

    def __init__(self, context_len: int = 40, block_size: int = 8, num_blocks: int = 16, seed: int = 0):
        self.num_blocks = num_blocks
        self.order = np.random.default_rng(seed).permutation(num_blocks).tolist()   # the free list, shuffled
        self.context = widgets.IntSlider(value=context_len, min=1, max=num_blocks * block_size,
                                         description="context len")
        self.size = widgets.Dropdown(options=[2, 4, 8, 16], value=block_size, description="block size")
        self.position = widgets.IntSlider(value=context_len - 1, min=0, max=context_len - 1, description="position")
        self.caption = widgets.HTML()
        self.image = widgets.Image(format="png")
        self.figure = None
        super().__init__([self.context, self.size, self.position, self.caption, self.image])
        self._fit_and_draw()
        for control in self._controls:
            control.observe(self._changed, names="value")

    @property
    def _controls(self):
        return (self.context, self.size, self.position)

    @property
    def block_table(self) -> list[int]:
        """The sequence's physical blocks, taken from the shuffled free list as it grew."""
        return self.order[: -(-self.context.value // self.size.value)]

    def _changed(self, _change) -> None:
        for control in self._controls:                # the limits below move values: redraw once, not per move
            control.unobserve(self._changed, names="value")
        self._fit_and_draw()
        for control in self._controls:
            control.observe(self._changed, names="value")

    def _fit_and_draw(self) -> None:
        """Keep the context within the cache and the position within the context, then draw."""
        self.context.max = self.num_blocks * self.size.value
        self.position.max = self.context.value - 1
        self.draw()

    def draw(self) -> None:
        table, bs, pos = self.block_table, self.size.value, self.position.value
        block, offset = table[pos // bs], pos % bs
        self.figure = Figure(figsize=(10, 2.8), layout="constrained")
        block_table_figure(table, self.context.value, bs, self.num_blocks, pos, ax=self.figure.subplots())
        self.caption.value = (f"block table {table}; position {pos} -> table[{pos} // {bs}] = block {block}, "
                              f"offset {pos} % {bs} = {offset} -> slot {block} * {bs} + {offset} = {block * bs + offset}")
        self.image.value = figure_png(self.figure)
