"""A live dashboard: the numbers an operator watches, redrawn while `llm.run(...)` serves.

    dash = Dashboard(llm)      # display it (last line of a cell), then serve in the next cell:
    report = llm.run(workload)

It subscribes to the engine's step observers, so it sees every step as it ends: throughput over
the last few seconds, latency percentiles of the requests finished so far, the batch size, the
queue depth, the KV-cache usage and the preemptions, plus the same quantities as curves over
time. It redraws at most every `refresh_s` wall-clock seconds (drawing costs more than a step on
the simulated clock) and once more whenever the engine runs out of work. `close()` unsubscribes.
"""
from __future__ import annotations

import time

import ipywidgets as widgets

from minibatch.analysis.metrics import RunReport, percentile
from minibatch.engine.records import RequestMetrics, StepRecord
from minibatch.serving.monitoring import tokens_of_step
from minibatch.engine.request import Request
from minibatch.viz.load import load_over_time
from minibatch.widgets.panel_tools import figure_png, fmt

MAX_STEPS_DRAWN = 600   # the curves show the latest steps only, so a long run redraws as fast as a short one
LABELS = {"time_s": "engine time (s)", "steps": "steps", "finished": "requests finished",
          "throughput_tok_s": "throughput, last window (tok/s)", "mean_throughput_tok_s": "throughput, whole run (tok/s)",
          "batch_size": "batch size (last step)", "queue_depth": "queue depth (waiting)",
          "kv_usage": "KV blocks used", "preemptions": "preemptions", "p50_ttft_s": "p50 TTFT (s)",
          "p99_ttft_s": "p99 TTFT (s)", "p50_tpot_s": "p50 TPOT (s)", "p99_tpot_s": "p99 TPOT (s)",
          "p99_e2e_s": "p99 e2e (s)"}


class Dashboard(widgets.VBox):
    """Live numbers and curves of an engine (an `LLM` or an `LLMEngine`) while it serves."""

    def __init__(self, llm, refresh_s: float = 1.0, window_s: float = 5.0):
        self.engine = getattr(llm, "engine", llm)
        self.refresh_s, self.window_s = refresh_s, window_s     # wall-clock s between redraws; engine s of throughput
        self.steps: list[StepRecord] = []
        self.tokens: list[int] = []                     # output tokens produced in each observed step
        self.finished: list[RequestMetrics] = []
        self.snapshot: dict = {}
        self.updates = 0                                # redraws so far
        self._last_draw = -float("inf")
        self.numbers = widgets.HTML("<i>waiting for the engine's first step</i>")
        self.image = widgets.Image(format="png")
        super().__init__([self.numbers, self.image])
        self.engine.step_observers.append(self.observe_step)

    def observe_step(self, record: StepRecord, finished: list[Request] | None) -> None:
        """Called by the engine after every step."""
        in_step = [self.engine.requests[rid] for rid, phase in record.slots.values() if phase != "held"]
        self.steps.append(record)
        self.tokens.append(sum(len(tokens_of_step(r, record.end)) for r in in_step))
        self.finished += [RequestMetrics.of(r) for r in finished or ()]
        if not self.engine.has_unfinished() or time.monotonic() - self._last_draw >= self.refresh_s:
            self.refresh()

    def compute(self) -> dict:
        """The dashboard's numbers from the steps and requests observed so far."""
        last, first = self.steps[-1], self.steps[0]
        window_start = max(first.start, last.end - self.window_s)
        recent = sum(n for st, n in zip(self.steps, self.tokens) if st.end > window_start)
        snap = {"time_s": last.end - first.start, "steps": len(self.steps), "finished": len(self.finished),
                "throughput_tok_s": recent / max(last.end - window_start, 1e-9),
                "mean_throughput_tok_s": sum(self.tokens) / max(last.end - first.start, 1e-9),
                "batch_size": last.batch_size, "queue_depth": last.queue_depth,
                "kv_usage": last.kv_blocks_used / last.kv_blocks_total,
                "preemptions": sum(st.num_preempted for st in self.steps)}
        for name in ("ttft", "tpot", "e2e"):
            for q in (50, 99):
                snap[f"p{q}_{name}_s"] = percentile([getattr(r, name) for r in self.finished], q)
        return snap

    def refresh(self) -> None:
        """Recompute the numbers and redraw now."""
        self.snapshot = self.compute()
        cells = "".join(f"<tr><td style='padding:1px 8px'>{LABELS[k]}</td><td style='padding:1px 8px;text-align:right'>"
                        f"{f'{v:.0%}' if k == 'kv_usage' else fmt(v)}</td></tr>" for k, v in self.snapshot.items()
                        if k in LABELS)
        self.numbers.value = f"<table>{cells}</table>"
        recent = self.steps[-MAX_STEPS_DRAWN:]
        view = RunReport([], recent, self.engine.config.batch_slots, start_time=self.steps[0].start)
        self.image.value = figure_png(load_over_time(view, title=f"live: {self.engine.config.model}, "
                                                                 f"{self.engine.config.scheduler} batching"))
        self.updates += 1
        self._last_draw = time.monotonic()

    def close(self) -> None:
        """Stop following the engine (and close the widget)."""
        if self.observe_step in self.engine.step_observers:
            self.engine.step_observers.remove(self.observe_step)
        super().close()
