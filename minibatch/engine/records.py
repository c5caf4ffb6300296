"""What the engine records as it runs: a record per request, a record per step, and the block tables.

`RequestMetrics.of(request)` turns a finished request's time stamps into its latencies (names as in
vLLM: queue time, TTFT, TPOT, e2e); `StepRecord` is one step's shape, slots, KV use and phase times;
`BlockTableRecorder` snapshots which request held which KV blocks at each step, for the KV-block map;
`PhaseTimer` times a step's phases (schedule, propose, model, sample, update) for its record.
What they add up to over a run is `minibatch.analysis` (`RunReport`, `memory_report`).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:   # annotations only: importing the records stays light (no torch)
    from minibatch.engine.kv import BlockManager
    from minibatch.engine.request import Request


@dataclass
class RequestMetrics:
    request_id: int
    arrival_time: float
    queue_time: float | None     # seconds waiting before first scheduled
    ttft: float | None           # time to first token
    tpot: float | None           # mean time per output token after the first (None with one token)
    e2e: float | None            # arrival to finish
    num_prompt_tokens: int
    num_output_tokens: int
    num_preemptions: int
    finish_reason: str | None
    num_cached_tokens: int = 0   # prompt tokens found in the prefix cache, not computed (vLLM's name)
    max_itl: float | None = None  # the longest gap between two consecutive output tokens (inter-token latency)

    @classmethod
    def of(cls, r: Request) -> "RequestMetrics":
        since = lambda t: None if t is None else t - r.arrival_time
        n = len(r.output_token_ids)
        tpot = (r.token_times[-1] - r.token_times[0]) / (n - 1) if n > 1 else None
        max_itl = max(b - a for a, b in zip(r.token_times, r.token_times[1:])) if n > 1 else None
        return cls(r.request_id, r.arrival_time, since(r.first_scheduled_time), since(r.first_token_time), tpot,
                   since(r.finish_time), len(r.prompt_token_ids), n, r.num_preemptions, r.finish_reason,
                   r.num_cached_tokens, max_itl)


@dataclass
class StepRecord:
    step: int
    start: float
    end: float
    batch_size: int                  # sequences that computed in this step
    num_prefill_tokens: int
    num_decode_tokens: int
    queue_depth: int                 # requests waiting after scheduling
    kv_blocks_used: int
    kv_blocks_total: int
    idle_slots: int                  # slots of max_batch_size that computed nothing
    num_preempted: int
    kv_tokens_stored: int = 0        # tokens the running requests hold in the cache (the rest of the blocks is waste)
    slots: dict = field(default_factory=dict)  # slot -> (request id, "prefill" | "decode" | "held")
    phase_times: dict = field(default_factory=dict)  # seconds per phase: schedule, prepare+forward, sample, update
    spec_outcomes: list = field(default_factory=list)  # speculative decoding: (drafted, accepted) per drafting sequence
    block_tables: dict = field(default_factory=dict)   # request id -> KVHolding(tokens, block ids): the KV-block map
    cached_blocks: frozenset = frozenset()   # prefix caching: blocks nobody holds whose K/V are kept for reuse
    prefix_cache_queries: int = 0    # prefix caching: tokens looked up by the requests admitted this step
    prefix_cache_hits: int = 0       # ... and of those, tokens found in the cache (not computed)

    @property
    def duration(self) -> float:
        return self.end - self.start


class KVHolding(NamedTuple):
    """What one request holds in the cache at a step: tokens stored, and its block table."""

    tokens: int
    blocks: tuple


class BlockTableRecorder:
    """Snapshots of every request's block table, one per step, for the KV-block map.

    A table that did not change since the last step is the same object in both snapshots, so a
    long run costs one small dict per step plus a tuple each time a table grows.
    """

    def __init__(self):
        self._last: dict[int, KVHolding] = {}
        self._last_cached: frozenset = frozenset()

    def snapshot(self, blocks: BlockManager) -> dict[int, KVHolding]:
        now = {}
        for request_id, table in blocks.block_tables.items():
            held = KVHolding(blocks.tokens_stored.get(request_id, 0), tuple(table))
            previous = self._last.get(request_id)
            now[request_id] = previous if previous == held else held
        self._last = now
        return now

    def cached(self, blocks: BlockManager) -> frozenset:
        """The evictable cached blocks now (prefix caching), the same object while they do not change."""
        if blocks.prefix_cache is not None and self._last_cached != blocks.prefix_cache.evictable.keys():
            self._last_cached = frozenset(blocks.prefix_cache.evictable)
        return self._last_cached


class PhaseTimer:
    """Seconds per phase of one step: `with timer("model"): ...`. With a StepProfiler, the model
    phase's parts too; parts timed before that phase (a layer-skip draft's layers) count as propose."""

    def __init__(self, profiler=None):
        self.profiler = profiler
        self._times: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str, counted: bool = True):
        if self.profiler and phase == "model":
            self.profiler.collect()                 # start the parts' counters at the model phase
        start = time.perf_counter()
        yield
        if counted:
            self._times[phase] = time.perf_counter() - start

    def times(self) -> dict:
        """The step's phase times, and its model parts' when profiled (the model phase without the time the
        profiler took to time parts apart)."""
        if not self.profiler:
            return dict(self._times)
        parts, apart = self.profiler.collect()
        times = {**self._times, **parts}
        if "model" in times:
            times["model"] -= apart
        return times
