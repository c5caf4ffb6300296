"""Requests that arrive over time, and the one loop that serves them (`LLMEngine.serve`).

The loop: add every request that has arrived, run a step, and when nothing can run, wait until the
next arrival or batching deadline; until nothing more will arrive and every request has ended.
Where requests come from differs: `LLM.run` knows every arrival time in advance (`TimedArrivals`),
a `ClosedLoop` has users who ask again once answered, and the HTTP server's engine thread takes
them from the network. Each is an `Arrivals`; the loop is the same.
"""
from __future__ import annotations

from collections import deque


class Arrivals:
    """A source of requests, as `LLMEngine.serve` sees it."""

    def admit(self, engine) -> bool:
        """Add every request that has arrived by `engine.clock.now()`; return whether more may still arrive."""
        raise NotImplementedError

    def next_event(self) -> float | None:
        """When this source next has something due (an arrival), if known."""
        return None

    def after_step(self, finished: list) -> None:
        """Called after every step that ran, with the requests that finished in it."""

    def wait_until(self, engine, t: float | None) -> None:
        """Nothing can run before t (None: no known time): sleep until then on the engine's clock."""
        if t is not None:
            engine.clock.sleep_until(t)


class TimedArrivals(Arrivals):
    """Requests whose arrival times are known: `items` are (seconds after `start`, prompt ids, params)."""

    def __init__(self, items: list[tuple], start: float, on_step=None):
        order = sorted(range(len(items)), key=lambda i: items[i][0])
        self.pending = deque((start + items[i][0], i, items[i][1], items[i][2]) for i in order)
        self.requests: dict[int, object] = {}         # index in items -> its Request
        self.on_step = on_step or (lambda finished: None)

    def admit(self, engine) -> bool:
        while self.pending and self.pending[0][0] <= engine.clock.now():
            arrival, index, prompt_ids, params = self.pending.popleft()
            self.requests[index] = engine.add_request(prompt_ids, params, arrival_time=arrival)
        return bool(self.pending)

    def next_event(self) -> float | None:
        return self.pending[0][0] if self.pending else None

    def after_step(self, finished: list) -> None:
        self.on_step(finished)
