"""The simulated clock: time that moves only when a step is charged or the engine sleeps.

A step lasts what a cost model (`minibatch.sim.costmodel`) says a step of that shape lasts, and
waiting for the next arrival takes no time at all. The scheduler, the KV accounting and the metrics
run for real either way; only the source of time differs (the engine's `Clock`, whose real
variant is `minibatch.engine.clock.RealClock`), so a simulated run is deterministic and can serve
thousands of requests in seconds.
"""
from __future__ import annotations

from minibatch.engine.clock import RealClock
from minibatch.sim.costmodel import CostModel, cost_model


class SimulatedClock:
    """Seconds on a virtual timeline that moves only when a step is charged or the engine sleeps."""

    def __init__(self, model: CostModel):
        self.cost_model = model
        self._now = 0.0

    def now(self) -> float:
        return self._now

    def sleep_until(self, t: float) -> None:
        """Jump ahead to t (an idle engine waits for nothing)."""
        self._now = max(self._now, t)

    def charge_step(self, plan, start: float) -> float:
        """The step began at `start` and lasts what the cost model says; time moves to its end."""
        self._now = start + self.cost_model.plan_time(plan)
        return self._now


def make_clock(config, model_config=None):
    """The clock an EngineConfig asks for; `model_config` (Hugging Face) is needed by roofline profiles."""
    if config.clock == "simulated":
        return SimulatedClock(cost_model(config.sim_profile, model_config))
    return RealClock()
