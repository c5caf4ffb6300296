"""Calibration: measure real steps on this machine and fit the simulated clock's cost model.

    python -m minibatch calibrate --out my-laptop.json      # then EngineConfig(sim_profile="my-laptop.json")

Over a grid of batch sizes and prompt lengths, the real model serves batches of random prompts
(`ignore_eos`, so every batch decodes the same number of steps). Every step is recorded with its
shape; its duration is the time from its start to the start of the next step, so scheduling and
bookkeeping between steps are charged too. Steps of the same shape are repeated and the median
kept (a shared machine is noisy). A least-squares fit, weighted so that every step counts by its
relative error, gives the coefficients of `LinearCostModel`; the profile keeps them, the fit's
errors and the measured points.

On a machine shared with other busy programs, wall-clock times measure the competition as much
as the model: `--threads 1 --cpu-time` measures the CPU time of one thread instead, which is
what the steps would take on one otherwise idle core.
"""
from __future__ import annotations

import datetime
import itertools
import os
import platform
import time
from collections import defaultdict
from dataclasses import astuple, fields

import numpy as np
import torch
from tqdm.auto import tqdm

from minibatch.engine.clock import RealClock
from minibatch.config import EngineConfig, SamplingParams
from minibatch.sim.costmodel import COEFFICIENTS, LinearCostModel, StepShape, save_profile


class RecordingClock(RealClock):
    """A real clock that remembers the shape and start of every step it is charged for; `timer`
    is time.perf_counter (wall clock) or time.process_time (CPU time of this process)."""

    def __init__(self, timer=time.perf_counter):
        self.timer = timer
        super().__init__()
        self._origin = timer()
        self.steps: list[tuple[StepShape, float]] = []

    def now(self) -> float:
        return self.timer() - self._origin

    def charge_step(self, plan, start: float) -> float:
        self.steps.append((StepShape.of(plan), start))
        return super().charge_step(plan, start)


def measure(model: str = "smollm2-135m", batch_sizes=(1, 2, 4, 8, 16), prompt_lens=(16, 64, 256),
            new_tokens: int = 8, repeats: int = 3, cpu_time: bool = False, use_tqdm: bool = True,
            **config) -> list[tuple[StepShape, float]]:
    """(shape, median seconds) of every step shape the grid produced, on the real model and clock."""
    from minibatch.llm import LLM   # here, so that importing this module stays light

    clock = RecordingClock(time.process_time if cpu_time else time.perf_counter)
    llm = LLM(EngineConfig(model=model, max_batch_size=max(batch_sizes), **config), clock=clock)
    rng = np.random.default_rng(0)
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    grid = list(itertools.product(batch_sizes, prompt_lens)) * repeats
    times = defaultdict(list)
    llm.generate([[1] * 8], params, use_tqdm=False)                   # warm-up, not measured
    for batch, length in tqdm(grid, desc="calibrate", unit="batch", disable=not use_tqdm):
        prompts = rng.integers(3, llm.engine.model.vocab_size, size=(batch, length)).tolist()
        clock.steps.clear()
        llm.generate(prompts, params, use_tqdm=False)
        for (shape, start), (_, next_start) in zip(clock.steps, clock.steps[1:]):
            times[shape].append(next_start - start)
    return [(shape, float(np.median(t))) for shape, t in times.items()]


def fit(points: list[tuple[StepShape, float]]) -> LinearCostModel:
    """Least squares on relative error, with every coefficient >= 0: the best fit over the subsets of
    coefficients left free (the others held at 0) whose solution has no negative coefficient."""
    X = np.array([s.features() for s, _ in points])                         # (N, 4)
    y = np.array([t for _, t in points])                                    # (N,)
    Xw, yw = X / y[:, None], np.ones_like(y)                                # rows scaled by 1 / y
    best, best_loss = None, np.inf
    for keep in itertools.product((True, False), repeat=X.shape[1]):
        cols = np.flatnonzero(keep)
        if len(cols) == 0:
            continue
        c, *_ = np.linalg.lstsq(Xw[:, cols], yw, rcond=None)
        if (c < 0).any():
            continue
        coef = np.zeros(X.shape[1])
        coef[cols] = c
        loss = float(np.sum((Xw @ coef - yw) ** 2))
        if loss < best_loss:
            best, best_loss = coef, loss
    return LinearCostModel(*map(float, best))


def fit_errors(model: LinearCostModel, points: list[tuple[StepShape, float]]) -> dict:
    """Relative errors |predicted - measured| / measured of a model on measured points."""
    rel = np.array([abs(model.step_time(s) - t) / t for s, t in points])
    return {"points": len(points), "median_rel_error": float(np.median(rel)),
            "p90_rel_error": float(np.percentile(rel, 90)), "max_rel_error": float(rel.max())}


def calibrate(model: str = "smollm2-135m", name: str | None = None, threads: int | None = None, **grid) -> dict:
    """Measure, fit and describe: a profile dict ready for `save_profile` and `EngineConfig(sim_profile=...)`.
    `threads` sets torch's thread count for the measurement (None keeps torch's default)."""
    if threads is not None:
        torch.set_num_threads(threads)
    points = measure(model, **grid)
    fitted = fit(points)
    name = name or f"{model}-{platform.node() or 'this-machine'}"
    timer = "CPU time of the process" if grid.get("cpu_time") else "wall-clock time"
    return {
        "name": name, "kind": "measured",
        "description": f"MEASURED: {model}, float32, attention 'torch', on {platform.machine()} CPU "
                       f"({torch.get_num_threads()} threads, {timer}), fitted by `python -m minibatch calibrate`",
        "model": model, "device": "cpu", "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "timer": timer,
        "processor": platform.processor() or platform.machine(), "date": datetime.date.today().isoformat(),
        "coefficients": dict(zip(COEFFICIENTS, fitted.coefficients())),
        "fit": fit_errors(fitted, points),
        "measured_steps": {"fields": [*(f.name for f in fields(StepShape)), "seconds"],
                           "rows": [[*astuple(s), t] for s, t in points]},
    }


def add_arguments(parser) -> None:
    parser.add_argument("--model", default="smollm2-135m", help="model to measure (default: smollm2-135m)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="batch sizes to measure")
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[16, 64, 256], help="prompt lengths in tokens")
    parser.add_argument("--new-tokens", type=int, default=8, help="tokens each request decodes")
    parser.add_argument("--repeats", type=int, default=3, help="times each batch runs (the median is kept)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads while measuring (default: torch's)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time steps by CPU time, not wall clock (shared machines)")
    parser.add_argument("--name", default=None, help="profile name (default: model and host name)")
    parser.add_argument("--out", default="profile.json", help="where to write the profile JSON")


def main(args) -> int:
    profile = calibrate(args.model, args.name, args.threads, batch_sizes=tuple(args.batch_sizes),
                        prompt_lens=tuple(args.prompt_lens), new_tokens=args.new_tokens, repeats=args.repeats,
                        cpu_time=args.cpu_time)
    save_profile(profile, args.out)
    c, f = profile["coefficients"], profile["fit"]
    print(f"step time = {c['overhead_s'] * 1e3:.2f} ms + {c['per_prefill_token_s'] * 1e3:.3f} ms/prefill token"
          f" + {c['per_decode_seq_s'] * 1e3:.3f} ms/decode sequence + {c['per_kv_token_s'] * 1e6:.4f} us/KV token read")
    print(f"fit over {f['points']} step shapes: median error {f['median_rel_error']:.1%}, "
          f"90th percentile {f['p90_rel_error']:.1%}, worst {f['max_rel_error']:.1%}")
    print(f"saved {args.out}; use it with EngineConfig(clock='simulated', sim_profile={args.out!r})")
    return 0
