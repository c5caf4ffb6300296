"""Queueing: why latency explodes as the offered load nears what the server can do.

A load sweep serves the same kind of workload at rising offered loads, each a share of the
server's **capacity**, and records what every level did. The capacity is measured, not assumed:
the requests per second the same engine finishes when it is saturated (every request arrives at
once, so a slot is never idle for want of work).

Every level is a Poisson workload drawn with the same seed, so each is the same sequence of
arrivals compressed in time (common random numbers): the curves move with the load, not with the
draw. Time-averages are taken over the **arrival window**, from the first arrival to the last,
the time during which load was offered:

- mean number in system L and mean queue depth, from the requests' arrival, first-scheduled and
  finish times;
- slot utilisation, the share of the batch slots that computed, and the busy share, the share of
  the time a step was running, from the step records.

**Little's law** (L = lambda x W) holds for any system in a steady state. On a finite run measured
over the arrival window it holds up to an edge term: the time the requests still in the system at
the window's end spend there after it closes. `littles_law` returns both sides and that term.

**The Pollaczek-Khinchine formula** gives the mean wait in an M/G/1 queue (Poisson arrivals, one
server, service times with mean E[S] and squared coefficient of variation c2):
W_q = rho x E[S] x (1 + c2) / (2 (1 - rho)); c2 = 0 is M/D/1 (fixed service times), c2 = 1 is M/M/1.
A batching server is not a single-server queue (it serves up to max_batch_size requests at once,
each step slower the fuller it is), so treated as one server with E[S] = 1 / capacity the formula
gives the shape of the curve, not its values; `LoadSweep.agreement` finds the loads where the two agree.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from tqdm.auto import tqdm

from minibatch.analysis.metrics import RunReport, percentile
from minibatch.workloads.distributions import AllAtOnce, Poisson

LOAD_SHARES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.925, 0.95, 0.975,
               1.0, 1.05, 1.1, 1.15, 1.2)   # offered load / capacity: denser where the curve bends
LITTLE_TOLERANCE = 0.05   # gap allowed in a steady state: 4x the edge (1 + L/2) / n of 400 requests at 0.7x


def time_average(starts, ends, window_start: float, window_end: float) -> float:
    """How many of the intervals [starts[i], ends[i]) cover a moment, on average over the window."""
    starts, ends = np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)
    if not window_end > window_start:
        raise ValueError(f"window=({window_start}, {window_end}) is not allowed: the end must come after the start")
    overlap = np.clip(np.minimum(ends, window_end) - np.maximum(starts, window_start), 0.0, None)
    return float(overlap.sum() / (window_end - window_start))


def _finished(report: RunReport) -> list:
    done = [r for r in report.requests if r.e2e is not None]
    if len(done) < 2:
        raise ValueError(f"a report with {len(done)} finished requests has no arrival window: at least 2 are needed")
    return done


def arrival_window(report: RunReport) -> tuple[float, float]:
    """From the first arrival to the last: the time during which load was offered."""
    arrivals = [r.arrival_time for r in _finished(report)]
    return min(arrivals), max(arrivals)


def littles_law(report: RunReport) -> dict:
    """Both sides of L = lambda x W over the arrival window, from the requests' own time stamps.

    L is the time-average number of requests in the system (arrived, not yet finished); lambda the
    arrivals per second in the window; W the mean e2e latency; `gap` is |L - lambda W| / lambda W.
    The system starts empty, so the gap is the time in the system spent after the window closes,
    as a share of all of it. In a steady state the last arrival has all of W still to go and about
    L others about W / 2 each: `steady_edge` = (1 + L / 2) / n, the gap to expect."""
    done = _finished(report)
    start, end = arrival_window(report)
    arrivals = np.array([r.arrival_time for r in done])
    finishes = arrivals + np.array([r.e2e for r in done])
    in_system = time_average(arrivals, finishes, start, end)
    rate, mean_e2e = len(done) / (end - start), float(np.mean(finishes - arrivals))
    return {"L": in_system, "arrival_rate": rate, "W": mean_e2e, "lambda_W": rate * mean_e2e,
            "gap": abs(in_system - rate * mean_e2e) / (rate * mean_e2e), "steady_edge": (1 + in_system / 2) / len(done)}


def load_figures(report: RunReport) -> dict:
    """What one level did: latency percentiles, time-averages over the arrival window, Little's law."""
    done = _finished(report)
    start, end = arrival_window(report)
    arrivals = np.array([r.arrival_time for r in done])
    scheduled = arrivals + np.array([r.queue_time for r in done])
    steps = [(max(s.start, start), min(s.end, end), s.batch_size)                # clipped to the window
             for s in report.steps if s.end > start and s.start < end]
    busy = sum(e - s for s, e, _ in steps)
    figures = {f"p{q}_{m}_s": percentile([getattr(r, m) for r in done], q) for m in ("ttft", "e2e") for q in (50, 99)}
    figures.update({
        "mean_queue_time_s": float(np.mean(scheduled - arrivals)),
        "mean_queue_depth": time_average(arrivals, scheduled, start, end),
        "utilisation": sum((e - s) * b for s, e, b in steps) / (report.max_batch_size * (end - start)),
        "busy": busy / (end - start),
        "throughput_req_s": report.summary()["requests_per_s"],
    })
    little = littles_law(report)
    figures.update({"mean_in_system": little["L"], "lambda_W": little["lambda_W"], "little_gap": little["gap"],
                    "little_steady_edge": little["steady_edge"]})
    return figures


def pollaczek_khinchine_wait(rho, mean_service_s: float, scv: float = 0.0):
    """Mean wait in queue of an M/G/1 queue at utilisation rho (a number or an array): inf where rho >= 1.

    scv is the squared coefficient of variation of the service time: 0 for M/D/1, 1 for M/M/1."""
    if not mean_service_s > 0:
        raise ValueError(f"mean_service_s={mean_service_s!r} is not allowed: a number of seconds > 0")
    if not scv >= 0:
        raise ValueError(f"scv={scv!r} is not allowed: a number >= 0 (0 for M/D/1, 1 for M/M/1)")
    rho = np.asarray(rho, dtype=float)
    if np.any(rho < 0):
        raise ValueError(f"rho={rho!r} is not allowed: utilisations >= 0")
    with np.errstate(divide="ignore", invalid="ignore"):
        wait = np.where(rho < 1, rho * mean_service_s * (1 + scv) / (2 * (1 - rho)), np.inf)
    return float(wait) if wait.ndim == 0 else wait


@dataclass
class LoadPoint:
    share: float           # offered load / capacity
    rate: float            # offered requests per second
    figures: dict          # load_figures() of the run
    report: RunReport = field(repr=False)


@dataclass
class LoadSweep:
    """The levels of a sweep, lowest load first, and the capacity they are shares of."""

    capacity: float            # requests/s the engine finishes when saturated (measured)
    points: list[LoadPoint]
    num_requests: int          # requests served at each level

    @property
    def shares(self) -> np.ndarray:
        return np.array([p.share for p in self.points])

    def column(self, name: str) -> np.ndarray:
        """One figure across the levels, e.g. sweep.column("p99_ttft_s")."""
        if name not in self.points[0].figures:
            raise KeyError(f"{name!r} is not a figure of the sweep: choose one of {', '.join(self.points[0].figures)}")
        return np.array([p.figures[name] for p in self.points], dtype=float)

    def nearest(self, share: float) -> LoadPoint:
        """The level whose offered load is closest to `share` of the capacity."""
        return self.points[int(np.argmin(np.abs(self.shares - share)))]

    def crossing(self, name: str, limit: float) -> float | None:
        """The load (share of capacity) at which a figure first passes `limit`, interpolated linearly
        between the last level within it and the first past it; None if no level passes it."""
        values, shares = self.column(name), self.shares
        past = np.flatnonzero(values > limit)
        if len(past) == 0:
            return None
        i = past[0]
        if i == 0:
            return float(shares[0])
        along = (limit - values[i - 1]) / (values[i] - values[i - 1])
        return float(shares[i - 1] + along * (shares[i] - shares[i - 1]))

    def approximation(self, scv: float = 0.0) -> np.ndarray:
        """The Pollaczek-Khinchine mean wait at each level, the server taken as one queue with E[S] = 1 / capacity."""
        return pollaczek_khinchine_wait(self.shares, 1.0 / self.capacity, scv)

    def agreement(self, scv: float = 0.0, factor: float = 2.0) -> tuple[float, float] | None:
        """The longest run of consecutive levels (lowest and highest share) at which the measured mean
        queue time and the approximation are within `factor` of each other; None if no level is.
        The approximation departs at the levels just outside it (past capacity it is infinite)."""
        measured, approx = self.column("mean_queue_time_s"), self.approximation(scv)
        close = (measured <= factor * approx) & (approx <= factor * measured)
        runs, start = [], None
        for i, ok in enumerate([*close, False]):
            if ok and start is None:
                start = i
            elif not ok and start is not None:
                runs.append((start, i - 1))
                start = None
        if not runs:
            return None
        low, high = max(runs, key=lambda run: run[1] - run[0])
        return float(self.shares[low]), float(self.shares[high])


WorkloadMaker = Callable[[int, object, int], list]   # (num_requests, arrival process, seed) -> workload


def measure_capacity(llm, workload: WorkloadMaker, num_requests: int = 64, seed: int = 0) -> float:
    """Requests per second the engine finishes when saturated: `num_requests` arriving at once."""
    return llm.run(workload(num_requests, AllAtOnce(), seed), use_tqdm=False).summary()["requests_per_s"]


def load_sweep(llm, workload: WorkloadMaker, shares=LOAD_SHARES, num_requests: int = 400,
               capacity: float | None = None, seed: int = 0, use_tqdm: bool = True) -> LoadSweep:
    """Serve `workload(num_requests, Poisson(share x capacity), seed)` at every share with `llm`
    (on the simulated clock, for hundreds of requests) and collect each level's figures. The
    capacity is measured with `measure_capacity` unless given."""
    shares = sorted(float(s) for s in shares)
    if not shares or shares[0] <= 0:
        raise ValueError(f"shares={shares!r} is not allowed: give at least one share of capacity, each > 0")
    if isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests < 2:
        raise ValueError(f"num_requests={num_requests!r} is not allowed: an integer >= 2")
    capacity = measure_capacity(llm, workload, seed=seed) if capacity is None else capacity
    if not capacity > 0:
        raise ValueError(f"capacity={capacity!r} is not allowed: requests per second > 0")
    points = []
    for share in tqdm(shares, desc="load sweep", unit="level", disable=not use_tqdm):
        report = llm.run(workload(num_requests, Poisson(rate=share * capacity), seed), use_tqdm=False)
        points.append(LoadPoint(share, share * capacity, load_figures(report), report))
    return LoadSweep(capacity, points, num_requests)
