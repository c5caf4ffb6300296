"""The prefix-cache panel: chat requests that share a few system prompts, served with the cache off and on.

`shared_prompt_run` serves `shared_prompt_workload` (requests opening with one of
`num_system_prompts` system prompts of `system_len` tokens, arriving as a Poisson process) on the
simulated clock without the model, so a run takes a fraction of a second: the scheduler, the block
manager and the prefix cache are the engine's own, so the counts (tokens found in the cache, prefill
tokens computed, blocks shared) are exact; the times are the cost model's. `PrefixCachePanel` moves
the system prompt's length, the number of distinct system prompts and the number of KV blocks, and
shows both runs side by side and the cache-on run's KV-block map where most blocks were shared.
"""
from __future__ import annotations

import ipywidgets as widgets

from minibatch.config import EngineConfig
from minibatch.llm import LLM
from minibatch.viz.kv_map import kv_block_map, shared_blocks
from minibatch.widgets.panel_tools import figure_png, html_table
from minibatch.workloads import Fixed, Poisson
from minibatch.workloads.shared_prefix import shared_prompt_workload

BLOCK_SIZE = 16
STYLE = {"description_width": "initial"}
COLUMNS = {"cache": "prefix cache", "prefill_tokens": "prefill tokens computed",
           "cached_tokens": "tokens from the cache",
           "hit_rate": "hit rate", "mean_ttft_s": "mean TTFT (s)", "p99_ttft_s": "p99 TTFT (s)",
           "preemptions": "preemptions"}


def shared_prompt_run(system_len: int = 256, num_system_prompts: int = 1, enable_prefix_caching: bool = True,
                      num_kv_blocks: int | None = None, num_requests: int = 32, rate: float = 1.0,
                      model: str = "smollm2-135m", sim_profile: str | None = None, seed: int = 0, plugins=None):
    """Serve the shared-system-prompt workload on the simulated clock (with `plugins`' pieces, if given);
    returns (RunReport, numbers)."""
    llm = LLM(EngineConfig(model=model, clock="simulated", sim_skip_model=True, sim_profile=sim_profile or
                           EngineConfig.sim_profile, block_size=BLOCK_SIZE, num_kv_blocks=num_kv_blocks,
                           max_batch_size=8, enable_prefix_caching=enable_prefix_caching), plugins=plugins)
    workload = shared_prompt_workload(llm.tokenizer, num_requests, system_len, num_system_prompts, Poisson(rate),
                                      Fixed(16), seed)
    report = llm.run(workload, use_tqdm=False)
    s = report.summary()
    numbers = {"cache": "on" if enable_prefix_caching else "off",
               "prefill_tokens": sum(st.num_prefill_tokens for st in report.steps), "cached_tokens": s["cached_tokens"],
               "hit_rate": s["prefix_cache_hit_rate"], "mean_ttft_s": s["mean_ttft_s"], "p99_ttft_s": s["p99_ttft_s"],
               "preemptions": s["preemptions"]}
    return report, numbers


def most_shared_step(report) -> int:
    """Index of the step at which the most blocks were shared (the first such step)."""
    counts = [len(shared_blocks(step)) for step in report.steps]
    return counts.index(max(counts))


class PrefixCachePanel(widgets.VBox):
    """Sliders "system prompt (tokens)", "distinct system prompts" and "KV blocks"; `reports` and
    `numbers` hold the last cache-off and cache-on runs (keys "off" and "on")."""

    def __init__(self, model: str = "smollm2-135m", system_len: int = 256, num_system_prompts: int = 1,
                 num_kv_blocks: int = 256, sim_profile: str | None = None):
        self.model, self.sim_profile = model, sim_profile
        self.length = widgets.IntSlider(value=system_len, min=0, max=1024, step=64,
                                        description="system prompt (tokens)", continuous_update=False, style=STYLE)
        self.prompts = widgets.IntSlider(value=num_system_prompts, min=1, max=16, description="distinct system prompts",
                                         continuous_update=False, style=STYLE)
        self.blocks = widgets.SelectionSlider(options=(128, 192, 256, 384, 512, 1024), value=num_kv_blocks,
                                              description="KV blocks", continuous_update=False, style=STYLE)
        self.metrics = widgets.HTML()
        self.image = widgets.Image(format="png")
        for control in (self.length, self.prompts, self.blocks):
            control.observe(lambda _: self.update(), names="value")
        super().__init__([widgets.HBox([self.length, self.prompts, self.blocks]), self.metrics, self.image])
        self.update()

    def update(self) -> None:
        """Serve the workload with the cache off and on, at the current settings, and redraw."""
        self.reports, self.numbers = {}, {}
        for name, on in (("off", False), ("on", True)):
            self.reports[name], self.numbers[name] = shared_prompt_run(
                self.length.value, self.prompts.value, on, self.blocks.value, model=self.model,
                sim_profile=self.sim_profile)
        self.metrics.value = ("<b>simulated clock, 32 chat requests</b>"
                              + html_table(list(self.numbers.values()), COLUMNS))
        self.image.value = figure_png(self.figure())

    def figure(self):
        report = self.reports["on"]
        return kv_block_map(report, BLOCK_SIZE, step=most_shared_step(report))
