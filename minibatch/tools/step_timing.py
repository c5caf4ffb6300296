"""Timing real engine steps of chosen shapes: the measurements a simulated clock is fitted to.

A decode step of 64 sequences at a context of 1024 tokens needs 65,536 tokens in the KV cache;
prefilling them for real would take minutes on a laptop. What a decode step costs does not depend
on what its cache holds, only on how much of it there is, so while decode steps are measured the
engine's runner skips steps that only prefill (`SkipPrefill`: their logits are zeros and their
cache slots keep whatever was there) and every step that decodes runs for real, scheduling,
sampling and bookkeeping included. Prefill steps are measured for real, on prompts short enough.

A step lasts from its start to the start of the next one, so the work between steps is charged
too. A shared machine is noisy: every round goes over the whole grid once (rounds interleaved,
so a slow minute slows every shape a little rather than one shape a lot) and each shape keeps the
median of its rounds.
"""
from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
import torch
from tqdm.auto import tqdm

from minibatch.config import EngineConfig, SamplingParams
from minibatch.engine.clock import RealClock
from minibatch.llm import LLM
from minibatch.sim.costmodel import StepShape

DECODE_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)   # decode steps: sequences per step
CONTEXTS = (64, 1024)                                           # decode steps: tokens each sequence holds
PREFILL_LENS = (8, 16, 32, 48, 64, 128, 256, 512)             # prefill steps: one prompt of each length
TIMERS = ("auto", "wall", "cpu")


class RecordingClock(RealClock):
    """A real clock that remembers the shape and start of every step it is charged for. Its `timer` is
    time.perf_counter (wall clock) or time.process_time (the CPU time of this process); the wall-clock
    start of every step is kept as well."""

    def __init__(self, timer=time.perf_counter):
        self.timer = timer
        super().__init__()
        self._origin = timer()
        self.steps: list[tuple[StepShape, float, float]] = []     # (shape, start on the timer, wall start)

    def now(self) -> float:
        return self.timer() - self._origin

    def charge_step(self, plan, start: float) -> float:
        self.steps.append((StepShape.of(plan), start, time.perf_counter()))
        return super().charge_step(plan, start)


class SkipPrefill:
    """The engine's runner, except that while `skip` is on a step that only prefills computes nothing:
    its logits are zeros (S, V) and the prompt's cache slots are left as they were."""

    def __init__(self, runner, vocab_size: int):
        self.runner, self.vocab_size, self.skip = runner, vocab_size, False

    def execute(self, plan):
        if self.skip and all(seq.is_prefill for seq in plan.seqs):
            sampling = sum(1 for seq in plan.seqs if seq.samples)
            return torch.zeros(sampling, self.vocab_size)            # (S, V)
        return self.runner.execute(plan)

    def __getattr__(self, name):
        return getattr(self.runner, name)


class StepTimer:
    """An engine as EngineConfig() configures it by default, with room for the largest grid shape."""

    def __init__(self, model: str = "smollm2-135m", max_batch: int = max(DECODE_BATCHES),
                 max_context: int = max(CONTEXTS), decode_steps: int = 3, timer: str = "auto"):
        """`timer`: "wall", "cpu" (CPU time of the process: what a step would take on an idle core, exact for
        an engine on one thread) or "auto" (CPU time when the engine runs on one thread, else wall clock)."""
        if timer not in TIMERS:
            raise ValueError(f"timer={timer!r} is not allowed: one of {', '.join(map(repr, TIMERS))}")
        self.clock, self.decode_steps = RecordingClock(), decode_steps
        self.outside_model: list[tuple[int, float]] = []                      # (decode rows, seconds)
        need = max_batch * (max_context + decode_steps + 2)                   # tokens in the cache at once
        block = EngineConfig.block_size
        self.llm = LLM(EngineConfig(model=model, max_batch_size=max_batch, max_tokens_per_step=need,
                                    num_kv_blocks=need // block + 2 * max_batch), clock=self.clock)
        engine = self.llm.engine
        self.runner = engine.runner = SkipPrefill(engine.runner, engine.model.vocab_size)
        self.timer = "cpu" if timer == "cpu" or (timer == "auto" and engine.cpu_threads == 1) else "wall"
        if self.timer == "cpu":
            engine.clock = self.clock = RecordingClock(time.process_time)
        self.rng = np.random.default_rng(0)
        self._run([[1] * 8], 2)                                             # warm-up, not measured

    def _run(self, prompts: list[list[int]], new_tokens: int) -> list[tuple[StepShape, float]]:
        """(shape, seconds) of every step but the last (a step ends when the next one starts); the
        seconds each decode step spent outside the model go to `outside_model`."""
        self.clock.steps.clear()
        self.llm.generate(prompts, SamplingParams(max_new_tokens=new_tokens, ignore_eos=True), use_tqdm=False)
        steps, records = self.clock.steps, self.llm.engine.step_records[-len(self.clock.steps):]
        timed = [(shape, nxt - start) for (shape, start, _), (_, nxt, _) in zip(steps, steps[1:])]
        walls = [nxt - start for (*_, start), (*_, nxt) in zip(steps, steps[1:])]
        for (shape, seconds), wall, record in zip(timed, walls, records):
            if shape.prefill_tokens == 0:                  # the share of the step outside the model, on this timer
                outside = 1.0 - record.phase_times.get("model", 0.0) / wall
                self.outside_model.append((shape.decode_seqs, max(outside, 0.0) * seconds))
        self.llm.engine.forget_old_steps(keep=64)
        return timed

    def prompts(self, batch: int, length: int) -> list[list[int]]:
        return self.rng.integers(3, self.llm.engine.model.vocab_size, size=(batch, length)).tolist()

    def decode(self, batch: int, context: int) -> list[tuple[StepShape, float]]:
        """Decode steps of `batch` sequences holding about `context` tokens each (their prefill skipped)."""
        self.runner.skip = True
        try:
            steps = self._run(self.prompts(batch, context), self.decode_steps + 2)
        finally:
            self.runner.skip = False
        return [(shape, s) for shape, s in steps if shape.prefill_tokens == 0]

    def prefill(self, length: int, batch: int = 1) -> list[tuple[StepShape, float]]:
        """The prefill step of `batch` prompts of `length` tokens, computed for real."""
        return [(shape, s) for shape, s in self._run(self.prompts(batch, length), 2) if shape.prefill_tokens]

    @property
    def threads(self) -> int:
        return self.llm.engine.cpu_threads


def measure_grid(timer: StepTimer, batches=DECODE_BATCHES, contexts=CONTEXTS, prefill_lens=PREFILL_LENS,
                 rounds: int = 5, use_tqdm: bool = True) -> list[tuple[StepShape, float]]:
    """(shape, median seconds over the rounds) of every step shape the grid produces."""
    times: dict[StepShape, list[float]] = defaultdict(list)
    jobs = [("decode", b, c) for c in contexts for b in batches] + [("prefill", n, 1) for n in prefill_lens]
    for _ in tqdm(range(rounds), desc="calibrate", unit="round", disable=not use_tqdm):
        for kind, a, b in jobs:
            steps = timer.decode(a, b) if kind == "decode" else timer.prefill(a, b)
            for shape, seconds in steps:
                times[shape].append(seconds)
    return [(shape, float(np.median(t))) for shape, t in times.items()]


def fixed_seconds(timer: StepTimer) -> float:
    """The median time a one-sequence decode step spent outside the model (scheduling, sampling, bookkeeping)."""
    outside = [s for rows, s in timer.outside_model if rows == 1]
    return float(np.median(outside)) if outside else 0.0


def step_ratios(timer: StepTimer, batches=(1, 2, 4, 8, 16), context: int = 64,
                rounds: int = 3) -> tuple[dict[int, float], float]:
    """step(b) / step(1) of decode steps on the real engine (medians over `rounds` interleaved rounds),
    and the median step of the smallest batch in seconds: a quick look, not a calibration."""
    times: dict[int, list[float]] = defaultdict(list)
    for _ in range(rounds):
        for b in batches:
            times[b] += [s for _, s in timer.decode(b, context)]
    medians = {b: float(np.median(t)) for b, t in times.items()}
    first = medians[min(batches)]
    return {b: medians[b] / first for b in batches}, first
