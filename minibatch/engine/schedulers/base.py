"""What every scheduler shares: the queue, the running set, slots, and the step plan it returns.

A scheduler turns the waiting queue and the running requests into a `StepPlan`: which requests
compute how many tokens this step. It asks the block manager for KV blocks but never touches a
tensor; the model runner never decides who runs. Static and continuous batching differ only
here, so comparing them measures scheduling alone.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from minibatch.config import EngineConfig
from minibatch.engine.kv import BlockManager
from minibatch.engine.request import Request, RequestStatus
from minibatch.engine.schedulers.policies import make_policy


@dataclass
class ScheduledSeq:
    """One request in a step: it computes num_new_tokens tokens starting at its num_computed_tokens."""

    request: Request
    num_new_tokens: int
    num_lookahead: int = 0      # extra KV slots reserved for draft tokens (speculative decoding)
    draft_token_ids: list[int] = field(default_factory=list)  # draft tokens to verify, set by the proposer

    @property
    def start(self) -> int:
        return self.request.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        """True while the request is still (re)computing its prompt, False for a decode step."""
        return self.num_new_tokens > 1 or self.start < len(self.request.prompt_token_ids)

    @property
    def samples(self) -> bool:
        """Whether this step reaches the end of the known tokens, so it produces the next one."""
        return self.start + self.num_new_tokens == self.request.num_tokens


@dataclass
class StepPlan:
    seqs: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    held_slots: dict[int, int] = field(default_factory=dict)  # slot -> request id holding it without computing

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens + len(s.draft_token_ids) for s in self.seqs)


class Scheduler:
    """The queue, the running set and the slots they occupy; subclasses decide who runs."""

    def __init__(self, config: EngineConfig, block_manager: BlockManager):
        self.max_batch_size = config.batch_slots
        self.batch_timeout_s = config.batch_timeout_s
        self.max_tokens_per_step = config.max_tokens_per_step
        self.num_speculative_tokens = config.num_speculative_tokens if config.speculative_method else 0
        self.prefill_cap = config.long_prefill_token_threshold   # most tokens one request computes per step; 0: no cap
        self.policy = make_policy(config)                        # who is admitted first and who gives way
        self.blocks = block_manager
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.slot_of: dict[int, int] = {}            # request id -> slot index in [0, max_batch_size)
        self._free_slots = list(range(config.batch_slots))

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting) or any(not r.is_finished for r in self.running)

    def batch_ready(self, now: float) -> bool:
        """The batching-timeout rule: start when a full batch waits or the oldest has waited long enough."""
        # the deadline is computed exactly as wake_time() computes it: (a + t) - a can round below t,
        # and a simulated clock that jumps to the deadline must then find the batch ready
        return len(self.waiting) >= self.max_batch_size or now >= self.waiting[0].arrival_time + self.batch_timeout_s

    def wake_time(self) -> float | None:
        """When an idle scheduler with waiting requests will start a batch, if nothing else arrives."""
        return self.waiting[0].arrival_time + self.batch_timeout_s if self.waiting else None

    def tokens_to_compute(self, request: Request, budget: int) -> int:
        """This step's share of the tokens a request still has to compute: within the step's budget and,
        when `long_prefill_token_threshold` is set, within that cap (vLLM's rule: one long prompt
        cannot take the whole budget)."""
        todo = min(request.num_tokens - request.num_computed_tokens, budget)
        return min(todo, self.prefill_cap) if self.prefill_cap else todo

    def _take_slot(self, request: Request) -> None:
        self._free_slots.sort()
        self.slot_of[request.request_id] = self._free_slots.pop(0)

    def _release_slot(self, request: Request) -> None:
        self._free_slots.append(self.slot_of.pop(request.request_id))

    def _admit(self, request: Request) -> None:
        self.running.append(request)
        request.status = RequestStatus.RUNNING
        self._take_slot(request)

    def admit(self, request: Request) -> None:
        """A waiting request joins: it leaves the queue, takes a free slot and runs (for a scheduler you write)."""
        self.waiting.remove(request)
        self._admit(request)

    def leave(self, request: Request) -> None:
        """A running request gives its slot back (continuous batching: the moment it finishes)."""
        self.running.remove(request)
        self._release_slot(request)

    def cached_prefix(self, request: Request) -> list[int]:
        """The cached blocks a waiting request may start from (`BlockManager.cached_prefix`; [] without prefix
        caching). A request that asks for `prompt_logprobs` reuses none, as in vLLM: a cached block skips the
        forward pass its prompt tokens' log-probabilities come from. Its own blocks are still cached for others."""
        if request.params.prompt_logprobs is not None:
            return []
        return self.blocks.cached_prefix(request.all_token_ids)

    def _start_after_prefix(self, request: Request, prefix: list[int]) -> None:
        """Admission with prefix caching: the request's first len(prefix) blocks were found in the cache
        (`BlockManager.cached_prefix`), so it computes from the first token after them."""
        cached = len(prefix) * self.blocks.block_size
        request.num_computed_tokens = cached
        if request.num_preemptions == 0:
            request.num_cached_tokens = cached
        self.blocks.record_lookup(request.num_tokens, cached)

    def finish(self, request: Request) -> None:
        """A request ended: free its KV blocks (its slot is released by the subclass rule)."""
        self.blocks.free(request.request_id)

    def abort(self, request: Request) -> None:
        """Take a request out of the queue before it ends early; `finish` then frees the rest."""
        if request in self.waiting:
            self.waiting.remove(request)

    def lookahead(self, request: Request, budget: int) -> int:
        """Draft tokens a request may verify this step (speculative decoding): k while it decodes (only
        its newest token is not cached yet), fewer near its length limits or the step's token budget."""
        if not self.num_speculative_tokens or not request.output_token_ids or \
                request.num_tokens - request.num_computed_tokens != 1:
            return 0
        tokens_left = request.params.max_new_tokens - len(request.output_token_ids) - 1  # after this step's own token
        room_left = self.blocks.max_model_len - request.num_tokens - 1
        return max(0, min(self.num_speculative_tokens, budget - 1, tokens_left, room_left))

    def schedule(self, now: float) -> StepPlan:
        raise NotImplementedError
