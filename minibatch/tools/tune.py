"""The SLA tuner: which `max_batch_size`, `batch_timeout_s` and `max_tokens_per_step` serve a workload best?

Every candidate configuration serves the workload on the simulated clock without the model
(`clock="simulated", sim_skip_model=True`), so a trial takes a fraction of a second. A trial is
ranked by, in order: whether it meets the SLA, its goodput (to 3 significant digits), its
headroom (the largest tail-to-limit ratio, lower is better), and then the smaller knobs (the
same service from fewer slots, less waiting and a smaller budget).

The search is coarse to fine, not a full grid:
1. successive halving over a coarse grid (the smallest, middle and largest value of each knob):
   all candidates serve the first quarter of the workload, the best third serve half of it, the
   best third of those serve all of it;
2. coordinate search from the best: try the neighbouring values of one knob at a time on the
   full grid and move while that improves the rank.

`TuneResult` holds every trial, the best configuration and the Pareto front of throughput
versus tail latency among the trials that served the whole workload.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from tqdm.auto import tqdm

from minibatch.config import ConfigError, EngineConfig
from minibatch.analysis.sla import SLA, evaluate
from minibatch.workloads import WorkloadRequest

KNOBS = ("max_batch_size", "batch_timeout_s", "max_tokens_per_step")
DEFAULT_SPACE = {
    "max_batch_size": (1, 2, 4, 8, 16, 32, 64),                # sequences per step
    "batch_timeout_s": (0.0, 0.05, 0.1, 0.2, 0.5, 1.0),        # seconds an idle engine waits to fill a batch
    "max_tokens_per_step": (64, 128, 256, 512, 1024, 2048),    # token budget per step (chunked prefill)
}
RUNGS = (0.25, 0.5, 1.0)   # successive halving: share of the workload served at each rung
KEEP = 1 / 3               # share of candidates promoted to the next rung


@dataclass
class Trial:
    knobs: dict            # {"max_batch_size": ..., "batch_timeout_s": ..., "max_tokens_per_step": ...}
    num_requests: int      # requests served (a prefix of the workload in early rungs)
    result: dict           # sla.evaluate(): the summary plus goodput, attainment, tails and sla_met
    rank: tuple            # larger is better: (sla met, goodput to 3 digits, -headroom, -knobs...)


@dataclass
class TuneResult:
    sla: SLA
    base: EngineConfig
    trials: list[Trial]     # every evaluation, in the order made
    best: Trial
    pareto: list[Trial]     # full-workload trials no other beats on both throughput and tail latency
    latency_key: str        # the summary key used as tail latency on the Pareto front
    num_requests: int       # requests in the whole workload

    @property
    def best_config(self) -> EngineConfig:
        """The base configuration with the best knobs, on the real clock."""
        return replace(self.base, clock="real", sim_skip_model=False, **self.best.knobs)

    def table(self, full_only: bool = True) -> list[dict]:
        """One row per trial: knobs, requests served, throughput, goodput, tails, SLA met."""
        keys = ("throughput_tok_s", "goodput_req_s", "sla_attainment", self.latency_key, "sla_met")
        return [{**t.knobs, "requests": t.num_requests, **{k: t.result[k] for k in keys}}
                for t in self.trials if not full_only or t.num_requests == self.num_requests]


def _rank(result: dict, sla: SLA, knobs: dict) -> tuple:
    ratios = [result[f"sla_p{sla.percentile:g}_{m}_s"] / limit for m, limit in sla.limits().items()
              if result[f"sla_p{sla.percentile:g}_{m}_s"] is not None]
    return (result["sla_met"], float(f"{result['goodput_req_s']:.3g}"), -max(ratios, default=math.inf),
            *(-knobs[k] for k in KNOBS))


def pareto_front(trials: list[Trial], latency_key: str) -> list[Trial]:
    """Trials not dominated in (higher throughput, lower latency), sorted by latency; of trials
    with the same point, the best ranked."""
    point = lambda t: (t.result["throughput_tok_s"], t.result[latency_key])
    best_at = {}
    for t in trials:
        if point(t) not in best_at or t.rank > best_at[point(t)].rank:
            best_at[point(t)] = t
    front = [t for p, t in best_at.items() if not any(o[0] >= p[0] and o[1] <= p[1] and o != p for o in best_at)]
    return sorted(front, key=lambda t: t.result[latency_key])


def tune(workload: list[WorkloadRequest], sla: SLA, base: EngineConfig | None = None, space: dict | None = None,
         closed_loop=None, latency_key: str = "p99_e2e_s", use_tqdm: bool = True) -> TuneResult:
    """Search the batching knobs for `workload` under `sla`; `base` gives the model and everything else.
    With `closed_loop` (a `minibatch.workloads.ClosedLoop`) the workload is served by that many users instead."""
    from minibatch.llm import LLM

    base = base or EngineConfig()
    space = {k: tuple(sorted(v)) for k, v in (space or DEFAULT_SPACE).items()}
    if set(space) != set(KNOBS) or not all(space.values()):
        raise ConfigError(f"space={space!r} is not allowed: give a non-empty list of values for each of "
                          f"{', '.join(KNOBS)}")
    sim = replace(base, clock="simulated", sim_skip_model=True)
    encoder = LLM(sim).engine.prompts                                   # encode once, not in every trial
    ordered = sorted(workload, key=lambda w: w.arrival_s)
    encoded = [replace(w, prompt=encoder.encode(w.prompt, field="workload")) for w in ordered]
    trials, seen = [], {}
    bar = tqdm(desc="tune", unit="trial", disable=not use_tqdm)

    def run(knobs: dict, n: int) -> Trial:
        key = (tuple(knobs[k] for k in KNOBS), n)
        if key not in seen:
            llm = LLM(replace(sim, **knobs))
            part = encoded[:n]
            report = llm.run(part, use_tqdm=False, arrival=closed_loop)
            result = evaluate(report, sla)
            seen[key] = Trial(dict(knobs), n, result, _rank(result, sla, knobs))
            trials.append(seen[key])
            bar.update(1)
            bar.set_postfix(best=max(trials, key=lambda t: (t.num_requests, t.rank)).knobs, refresh=False)
        return seen[key]

    coarse = {k: tuple(dict.fromkeys((v[0], v[len(v) // 2], v[-1]))) for k, v in space.items()}
    candidates = [dict(zip(KNOBS, c)) for c in itertools.product(*(coarse[k] for k in KNOBS))]
    bar.total = len(candidates) + sum(math.ceil(len(candidates) * KEEP ** (i + 1)) for i in range(len(RUNGS) - 1))
    for i, share in enumerate(RUNGS):                                   # 1. successive halving
        n = len(encoded) if share == 1.0 else max(1, math.ceil(share * len(encoded)))
        ranked = sorted(candidates, key=lambda c: run(c, n).rank, reverse=True)
        candidates = ranked if share == 1.0 else ranked[:max(1, math.ceil(len(ranked) * KEEP))]
    best = run(candidates[0], len(encoded))
    moved = True
    while moved:                                                        # 2. coordinate search on the fine grid
        moved, bar.total = False, bar.n + 2 * len(KNOBS)
        for knob in KNOBS:
            values = space[knob]
            at = min(range(len(values)), key=lambda j: abs(values[j] - best.knobs[knob]))
            for j in (at - 1, at + 1):
                if 0 <= j < len(values):
                    trial = run({**best.knobs, knob: values[j]}, len(encoded))
                    if trial.rank > best.rank:
                        best, moved = trial, True
    bar.total = bar.n
    bar.close()
    full = [t for t in trials if t.num_requests == len(encoded)]
    return TuneResult(sla, base, trials, best, pareto_front(full, latency_key), latency_key, len(encoded))
