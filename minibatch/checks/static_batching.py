"""Chapter 02 (static batching): the static batcher's admission rule and the slot-steps that finished requests hold."""

from dataclasses import dataclass

import numpy as np

from minibatch.checks.core import Case, check_cases, checker


@dataclass(frozen=True)
class Queued:
    """A waiting request, as the static batcher sees it."""

    request_id: int
    arrival_time: float      # seconds
    max_total_tokens: int    # prompt + max_new_tokens: the most KV room it can ever need


def _static_engine_admits(waiting, batch_running, now, max_batch_size, batch_timeout_s, free_blocks, block_size):
    """Who the engine's own StaticScheduler admits in this situation (request ids, in order)."""
    from minibatch.config import EngineConfig, SamplingParams
    from minibatch.engine.kv import BlockManager, blocks_for
    from minibatch.engine.request import Request
    from minibatch.engine.schedulers import StaticScheduler

    config = EngineConfig(model="tiny", scheduler="static", max_batch_size=max_batch_size,
                          batch_timeout_s=batch_timeout_s, block_size=block_size)
    member = Request(-1, [1], SamplingParams(max_new_tokens=1), 0.0)  # a batch member still decoding
    extra = blocks_for(member.max_total_tokens, block_size) if batch_running else 0
    scheduler = StaticScheduler(config, BlockManager(free_blocks + extra, block_size))
    if batch_running:
        scheduler.add(member)
        scheduler.schedule(member.arrival_time + batch_timeout_s)  # it forms a batch of its own
    for q in waiting:
        prompt = max(1, q.max_total_tokens - 1)
        scheduler.add(Request(q.request_id, [1] * prompt, SamplingParams(max_new_tokens=q.max_total_tokens - prompt),
                              q.arrival_time))
    before = {r.request_id for r in scheduler.running}
    scheduler.schedule(now)
    return [r.request_id for r in scheduler.running if r.request_id not in before]


def _static_cases() -> list[Case]:
    """Hand-picked situations (one per rule), then random ones; answers from the engine."""
    def queue(*specs):  # (arrival_time, max_total_tokens) per waiting request
        return [Queued(i, t, n) for i, (t, n) in enumerate(specs)]
    situations = [  # waiting, batch_running, now, max_batch_size, batch_timeout_s, free_blocks, block_size
        (queue((0.0, 20), (0.1, 30), (0.2, 40)), False, 0.3, 3, 1.0, 100, 16),   # a full batch waits: start now
        (queue((0.0, 20), (0.1, 30), (0.2, 40), (0.3, 10)), False, 0.3, 3, 1.0, 100, 16),  # more than fit: first 3
        (queue((0.0, 20), (0.5, 30)), False, 0.7, 4, 1.0, 100, 16),             # not full, timeout not reached
        (queue((0.0, 20), (0.5, 30)), False, 1.0, 4, 1.0, 100, 16),             # the oldest waited the timeout
        (queue((0.0, 20), (0.1, 30)), False, 0.2, 4, 0.0, 100, 16),             # timeout 0: start at once
        (queue((0.0, 20), (0.1, 30), (0.2, 40)), True, 5.0, 3, 0.0, 100, 16),   # a batch is running: nobody joins
        (queue((0.0, 40), (0.1, 40), (0.2, 40)), False, 0.3, 3, 0.0, 6, 16),    # KV room for two (3 blocks each)
        (queue((0.0, 100), (0.1, 10)), False, 0.3, 2, 0.0, 5, 16),              # the head does not fit: nobody
        (queue(), False, 1.0, 4, 0.0, 100, 16),                                  # nobody waiting
    ]
    rng = np.random.default_rng(2)
    for _ in range(25):
        arrivals = np.sort(rng.uniform(0, 2, int(rng.integers(1, 9)))).round(2)
        waiting = queue(*[(float(t), int(rng.integers(2, 200))) for t in arrivals])
        now = round(float(arrivals[-1] + rng.uniform(0, 1.5)), 2)  # every waiting request has arrived
        situations.append((waiting, bool(rng.random() < 0.2), now, int(rng.integers(1, 7)),
                           float(rng.choice([0.0, 0.5, 1.0])), int(rng.integers(1, 40)), int(rng.choice([4, 8, 16]))))
    return [Case(s, _static_engine_admits(*s)) for s in situations]


@checker("admit_static(waiting, batch_running, now, max_batch_size, batch_timeout_s, free_blocks, block_size)")
def check_admit_static(admit_static):
    return check_cases(admit_static, _static_cases())


def _engine_held_slot_steps(output_lengths, max_batch_size):
    """Held slot-steps of a static run of `tiny` with these output lengths, all arriving at once."""
    from minibatch import LLM, EngineConfig, SamplingParams, WorkloadRequest
    from minibatch.viz.timeline import slot_occupancy

    llm = LLM(EngineConfig(model="tiny", scheduler="static", max_batch_size=max_batch_size))
    workload = [WorkloadRequest(0.0, [3 + i, 4], SamplingParams(max_new_tokens=n, ignore_eos=True))
                for i, n in enumerate(output_lengths)]
    return slot_occupancy(llm.run(workload, use_tqdm=False))["held"]


@checker("held_slot_steps(output_lengths, max_batch_size)")
def check_held_slot_steps(held_slot_steps):
    situations = [([5, 2, 9], 3), ([5, 2, 9, 1], 2), ([4, 4, 4], 4), ([1, 7, 3, 7, 2], 3), ([10], 1),
                  ([3, 8, 2, 6, 6, 1, 9], 4)]
    return check_cases(held_slot_steps, [Case((lengths, b), _engine_held_slot_steps(lengths, b))
                                         for lengths, b in situations])
