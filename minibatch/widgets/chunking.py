"""The chunked-prefill panel: a long prompt arrives while short requests are decoding; move the token
budget and the prompt's length and watch the decoders stall, or the long request wait.

`stall_workload` builds the scenario: `num_decoding` short requests arriving at once, and one long
prompt arriving `arrival_s` later, while they decode. With a budget larger than the prompt, the
whole prompt goes through the model in one step, and every decoding request waits for that step;
with a small budget the prompt is cut into chunks that share steps with the decodes, so no step
is long, but the long request needs many steps before its first token. Runs use the simulated
clock without the model, so a rerun takes a fraction of a second; the times are the cost model's.
"""
from __future__ import annotations

import ipywidgets as widgets

from minibatch.config import EngineConfig, SamplingParams
from minibatch.llm import LLM
from minibatch.viz.phases import decode_token_waits, step_durations
from minibatch.widgets.panel_tools import figure_png, html_table
from minibatch.workloads import WorkloadRequest

BUDGETS = (16, 32, 64, 128, 256, 512, 1024, 2048)
STYLE = {"description_width": "initial"}


def stall_workload(token_ids: list[int], long_prompt_tokens: int = 512, num_decoding: int = 3,
                   short_prompt_tokens: int = 8, decode_tokens: int = 32, arrival_s: float = 0.5) -> list[WorkloadRequest]:
    """`num_decoding` short requests at time 0, then one long prompt at `arrival_s` (always the last
    request); prompts are cut from `token_ids`."""
    if len(token_ids) < long_prompt_tokens:
        raise ValueError(f"token_ids has {len(token_ids)} tokens; long_prompt_tokens={long_prompt_tokens} needs as many")
    shorts = [WorkloadRequest(0.0, token_ids[i * short_prompt_tokens:(i + 1) * short_prompt_tokens],
                              SamplingParams(max_new_tokens=decode_tokens, ignore_eos=True)) for i in range(num_decoding)]
    return shorts + [WorkloadRequest(arrival_s, token_ids[:long_prompt_tokens],
                                     SamplingParams(max_new_tokens=8, ignore_eos=True))]


def stall_numbers(report) -> dict:
    """TTFT of the long request (the last one) and how long decoding requests waited for a token."""
    waits = decode_token_waits(report)
    return {"long_ttft_s": report.requests[-1].ttft, "max_decode_wait_s": float(waits.max()),
            "mean_decode_wait_s": float(waits.mean())}


class ChunkingPanel(widgets.VBox):
    """Sliders "token budget" and "long prompt (tokens)"; `report` and `numbers` hold the last run."""

    def __init__(self, model: str = "smollm2-135m", token_budget: int = 1024, long_prompt_tokens: int = 512,
                 sim_profile: str | None = None):
        self.model, self.sim_profile = model, sim_profile or EngineConfig.sim_profile
        self.budget_slider = widgets.SelectionSlider(options=BUDGETS, value=token_budget, description="token budget",
                                                     continuous_update=False, style=STYLE)
        self.prompt_slider = widgets.IntSlider(value=long_prompt_tokens, min=64, max=2048, step=64,
                                               description="long prompt (tokens)", continuous_update=False, style=STYLE)
        self.metrics = widgets.HTML()
        self.image = widgets.Image(format="png")
        for control in (self.budget_slider, self.prompt_slider):
            control.observe(lambda _: self.update(), names="value")
        super().__init__([widgets.HBox([self.budget_slider, self.prompt_slider]), self.metrics, self.image])
        self.update()

    def update(self) -> None:
        """Rerun the scenario with the current budget and prompt length, and redraw."""
        config = EngineConfig(model=self.model, max_tokens_per_step=self.budget_slider.value, clock="simulated",
                              sim_skip_model=True, sim_profile=self.sim_profile)
        llm = LLM(config)
        ids = [3 + i % 200 for i in range(self.prompt_slider.value)]   # placeholder ids (no model runs), valid in any vocabulary
        self.report = llm.run(stall_workload(ids, self.prompt_slider.value), use_tqdm=False)
        self.numbers = stall_numbers(self.report)
        self.metrics.value = (f"<b>simulated clock ({self.sim_profile})</b>" + html_table(
            [{"budget": self.budget_slider.value, "prompt": self.prompt_slider.value, **self.numbers}],
            {"budget": "token budget", "prompt": "long prompt (tokens)", "long_ttft_s": "long request's TTFT (s)",
             "max_decode_wait_s": "longest wait for a decode token (s)", "mean_decode_wait_s": "mean wait (s)"}))
        self.image.value = figure_png(self.figure())

    def figure(self):
        return step_durations({f"token budget {self.budget_slider.value}, long prompt of "
                               f"{self.prompt_slider.value} tokens (simulated)": self.report})
