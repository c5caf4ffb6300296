"""Scheduling policies: the order in which waiting requests are admitted, and who gives way.

A policy ranks requests; a smaller rank is served first. The continuous scheduler asks it three
questions: which waiting request goes next, in what order the running ones get the step's token
budget, and which running request to preempt when memory or slots run out.

- "fcfs": first come, first served, the engine's default and vLLM's. The queue keeps its arrival
  order (a preempted request goes back to its head); the newest running request gives way.
- "priority": vLLM's priority scheduling. The rank is (SamplingParams.priority, arrival time):
  a lower priority value is served first, ties in arrival order. The victim of a preemption is the
  worst-ranked running request (the lowest priority, the latest arrival), and a waiting request
  that cannot fit may preempt running requests that rank below it (vLLM's forced preemption).
- "shortest_prompt": shortest prompt first, with aging. The rank is the number of tokens the
  request still has to prefill, minus `aging_tokens_per_s` for every second it has waited since it
  arrived. Short chats overtake long documents, the known way to cut the mean TTFT; without aging
  a steady stream of short requests can hold a long one back forever (starvation). With aging, a
  prompt of L tokens ranks ahead of any prompt of s tokens that arrived more than
  (L - s) / aging_tokens_per_s seconds after it, so its wait is bounded.
The prompt length is known the moment a request arrives (its output length is not), which is why
this latency-aware policy ranks by prompt rather than by total work.
"""
from __future__ import annotations

from minibatch.config import EngineConfig
from minibatch.engine.request import Request


class FCFS:
    """Arrival order; the preempted wait at the head of the queue; the newest running request gives way.
    The queue's own order is the policy, so it ranks nothing."""

    forces_preemption = False  # a waiting request never takes a running one's place

    def next_waiting(self, waiting, now: float) -> Request:
        return waiting[0]

    def by_rank(self, requests: list[Request], now: float) -> list[Request]:
        return list(requests)

    def victim(self, running: list[Request], now: float) -> Request:
        return running[-1]


class Priority(FCFS):
    """(priority, arrival): lower values first; the worst-ranked running request is preempted."""

    forces_preemption = True

    def rank(self, request: Request, now: float) -> tuple:
        return (request.params.priority, request.arrival_time, request.request_id)

    def next_waiting(self, waiting, now: float) -> Request:
        return min(waiting, key=lambda r: self.rank(r, now))

    def by_rank(self, requests: list[Request], now: float) -> list[Request]:
        return sorted(requests, key=lambda r: self.rank(r, now))

    def victim(self, running: list[Request], now: float) -> Request:
        return max(running, key=lambda r: self.rank(r, now))


class ShortestPrompt(Priority):
    """Fewest tokens left to prefill first, each second waited counting as `aging_tokens_per_s` tokens fewer."""

    forces_preemption = False  # it reorders the queue; it does not evict running work for it

    def __init__(self, aging_tokens_per_s: float):
        self.aging_tokens_per_s = aging_tokens_per_s

    def rank(self, request: Request, now: float) -> tuple:
        to_prefill = request.num_tokens - request.num_computed_tokens   # a preempted request recomputes all
        waited_s = max(0.0, now - request.arrival_time)
        return (to_prefill - self.aging_tokens_per_s * waited_s, request.arrival_time, request.request_id)


def make_policy(config: EngineConfig):
    """The policy object named by `config.scheduling_policy`."""
    if config.scheduling_policy == "priority":
        return Priority()
    if config.scheduling_policy == "shortest_prompt":
        return ShortestPrompt(config.aging_tokens_per_s)
    return FCFS()
