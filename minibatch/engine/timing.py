"""Timers for a step: its phases (`PhaseTimer`), and its model work's parts when `EngineConfig(profile_steps=True)`.

`PhaseTimer` times the phases of every step (schedule, propose, model, sample, update).
`StepProfiler.instrument` wraps the runner's input preparation and the model's part methods on
those instances; every call adds its seconds to its part, and `collect()` hands over a step's sums.
On CUDA a timer synchronises the device before and after, so a part is charged for its kernels.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch

MODEL_PARTS = ("embed", "norm", "attention", "mlp", "lm_head")
_MODEL_METHODS = {"embed_inputs": "embed", "norm": "norm", "attention": "attention", "mlp": "mlp",
                  "lm_head_logits": "lm_head"}


class StepProfiler:
    """Timers around the runner's input preparation and the model's parts, summed per step."""

    def __init__(self, device: torch.device):
        self.times = dict.fromkeys(("prepare",) + MODEL_PARTS, 0.0)
        self.sync = torch.cuda.synchronize if device.type == "cuda" else None

    def timed(self, part: str, fn):
        """fn, wrapped so that its time (its kernels' time, on CUDA) is added to `part`."""
        def run(*args, **kwargs):
            if self.sync:
                self.sync()
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            if self.sync:
                self.sync()
            self.times[part] += time.perf_counter() - start
            return out
        return run

    def instrument(self, model, runner) -> None:
        """Wrap runner.prepare and the model's part methods on these instances (the class is untouched)."""
        runner.prepare = self.timed("prepare", runner.prepare)
        model.whole_layers = False                  # a layer in one compiled call has no parts to time
        for method, part in _MODEL_METHODS.items():
            setattr(model, method, self.timed(part, getattr(model, method)))

    def collect(self) -> dict:
        """The seconds gathered since the last call, per part; the counters restart from zero."""
        times = dict(self.times)
        self.times = dict.fromkeys(self.times, 0.0)
        return times


class PhaseTimer:
    """Seconds per phase of one step: `with timer("model"): ...`. With a StepProfiler, the model
    phase's parts too; parts timed before that phase (a layer-skip draft's layers) count as propose."""

    def __init__(self, profiler: StepProfiler | None = None):
        self.profiler = profiler
        self._times: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str, counted: bool = True):
        if self.profiler and phase == "model":
            self.profiler.collect()                 # start the parts' counters at the model phase
        start = time.perf_counter()
        yield
        if counted:
            self._times[phase] = time.perf_counter() - start

    def times(self) -> dict:
        """The step's phase times, and its model parts' when profiled."""
        return {**self._times, **(self.profiler.collect() if self.profiler else {})}
