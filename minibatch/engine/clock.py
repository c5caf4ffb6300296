"""Where the engine's time comes from: any object with `now()`, `sleep_until(t)` and `charge_step(plan, start)`.

`RealClock` reads the wall clock: timings are what this machine really did. The simulator's
`SimulatedClock` (`minibatch.sim.clock`) keeps its own time instead: a step lasts what a cost model
says a step of that shape lasts, and waiting for the next arrival takes no time at all. The
engine runs the same either way; only the source of time differs.
"""
from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the clock's origin."""

    def sleep_until(self, t: float) -> None:
        """Wait (or, on a simulated clock, jump) until time t."""

    def charge_step(self, plan, start: float) -> float:
        """The time at which a step that began at `start` ended."""


class RealClock:
    """Seconds since the clock was made, from time.perf_counter."""

    def __init__(self):
        self._origin = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._origin

    def sleep_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)

    def charge_step(self, plan, start: float) -> float:
        """On a real clock a step ends now."""
        return self.now()
