"""Where the engine's time comes from.

`RealClock` reads the wall clock: timings are what this machine really did.
"""
from __future__ import annotations

import time


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
        """The time at which a step that began at `start` ended: on a real clock, now."""
        return self.now()
