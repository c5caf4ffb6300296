"""Continuous batching: at every step finished requests leave and waiting ones join.

Each step first serves the running requests in the order they were admitted (a decode token
each, or the next chunk of a long prompt), then admits waiting requests while there is a free
slot, token budget and KV room. Prompts longer than the budget are prefilled in chunks. When a
running request needs a block and none is free, the newest running request is preempted: its
blocks are freed and it waits again at the head of the queue, to recompute what it had.
An idle engine honours the batching timeout before it starts; a busy one admits at once.

That order is `step_priority="decode-first"`, vLLM's: the running requests keep their stream going
and new prompts take what is left of the budget. `"prefill-first"` puts prompt work first: the
prompts in flight take their chunks, then waiting requests are admitted, and the decodes get what
budget is left (none while the prompts fill it: a burst of long prompts stalls every decoder, as a
scheduler that always runs prefills first does). It admits a prompt only while the blocks the
running decodes need this step stay free; when a decode still finds none (the prompts in flight
took them), the newest running request gives way as above, and leaves this step if it was in it.

The scheduling policy (`policies.py`) decides the orders: which waiting request is admitted next,
which running one gets the budget first and which gives way; under "priority" a waiting request
that cannot fit first preempts the running ones that rank below it. With the default "fcfs" every
order is the arrival order described above.
"""
from __future__ import annotations

from minibatch.config import EngineConfig
from minibatch.engine.kv import BlockManager
from minibatch.engine.request import Request, RequestStatus
from minibatch.engine.schedulers.base import ScheduledSeq, Scheduler, StepPlan


def prefilling(request: Request) -> bool:
    """Whether a request still has prompt work to do (its prompt, or a recomputation after preemption)
    rather than one decode token."""
    return request.num_tokens - request.num_computed_tokens > 1 or \
        request.num_computed_tokens < len(request.prompt_token_ids)


class ContinuousScheduler(Scheduler):
    def __init__(self, config: EngineConfig, block_manager: BlockManager):
        super().__init__(config, block_manager)
        self.prefill_first = config.step_priority == "prefill-first"

    def _preempt(self, request: Request, plan: StepPlan) -> None:
        self.running.remove(request)
        self._release_slot(request)
        self.blocks.free(request.request_id)
        request.num_computed_tokens = 0          # recompute from scratch when it runs again
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.waiting.appendleft(request)
        plan.preempted.append(request)
        plan.seqs = [s for s in plan.seqs if s.request is not request]   # prefill-first may have planned it already

    def _make_room_for_waiting(self, plan: StepPlan, now: float) -> None:
        """Forced preemption ("priority"): the best waiting requests that cannot fit take the slots and
        blocks of running requests ranked below them (vLLM's victim: lowest priority, latest arrival)."""
        slots, blocks = self.max_batch_size - len(self.running), self.blocks.num_free_blocks
        for request in self.policy.by_rank(self.waiting, now):
            first_chunk = self.tokens_to_compute(request, self.max_tokens_per_step)
            need = self.blocks.blocks_needed(request.request_id, first_chunk)
            while (slots < 1 or blocks < need) and self.running:
                victim = self.policy.victim(self.running, now)
                if self.policy.rank(victim, now) <= self.policy.rank(request, now):
                    return                                 # nobody ranked below it is running
                slots, blocks = slots + 1, blocks + len(self.blocks.block_tables.get(victim.request_id, ()))
                self._preempt(victim, plan)
            if slots < 1 or blocks < need:
                return
            slots, blocks = slots - 1, blocks - need

    def _serve_running(self, plan: StepPlan, budget: int, now: float, which=lambda request: True) -> int:
        """Give the running requests that `which` selects their tokens, in the policy's order."""
        for request in self.policy.by_rank(self.running, now):
            if request not in self.running or budget == 0 or not which(request):
                continue
            todo = self.tokens_to_compute(request, budget)
            target = request.num_computed_tokens + todo
            while not self.blocks.can_allocate(request.request_id, target) and request in self.running:
                self._preempt(self.policy.victim(self.running, now), plan)
            if request in self.running:
                lookahead = self.lookahead(request, budget)         # 0 unless speculating; never preempts for it
                if not self.blocks.can_allocate(request.request_id, target + lookahead):
                    lookahead = 0
                self.blocks.allocate(request.request_id, target + lookahead)
                plan.seqs.append(ScheduledSeq(request, todo, lookahead))
                budget -= todo + lookahead
        return budget

    def _admit_waiting(self, plan: StepPlan, budget: int, now: float, reserve: int = 0) -> int:
        """Admit waiting requests while a slot, budget and KV blocks (beyond `reserve`) are free; the budget left."""
        if not self.running and self.waiting and not self.batch_ready(now):
            return budget
        while self.waiting and len(self.running) < self.max_batch_size and budget > 0:
            request = self.policy.next_waiting(self.waiting, now)
            prefix = self.cached_prefix(request)                      # [] without prefix caching
            cached = len(prefix) * self.blocks.block_size
            todo = min(self.tokens_to_compute(request, budget), request.num_tokens - cached)
            if self.blocks.blocks_needed(request.request_id, cached + todo, prefix) + reserve > \
                    self.blocks.num_free_blocks:
                break
            self.waiting.remove(request)
            self._admit(request)
            self.blocks.allocate(request.request_id, cached + todo, prefix)
            self._start_after_prefix(request, prefix)
            plan.seqs.append(ScheduledSeq(request, todo))
            budget -= todo
        return budget

    def schedule(self, now: float) -> StepPlan:
        plan = StepPlan()
        if self.policy.forces_preemption:
            self._make_room_for_waiting(plan, now)
        forced = len(plan.preempted)
        if self.prefill_first:
            budget = self._serve_running(plan, self.max_tokens_per_step, now, which=prefilling)
            decoding = [r for r in self.running if not prefilling(r)]
            if len(plan.preempted) == forced:    # keep free the blocks the decodes need this step
                reserve = sum(self.blocks.blocks_needed(r.request_id, r.num_tokens) for r in decoding)
                budget = self._admit_waiting(plan, budget, now, reserve)
            self._serve_running(plan, budget, now, which=lambda request: request in decoding)
            return plan
        budget = self._serve_running(plan, self.max_tokens_per_step, now)
        if len(plan.preempted) == forced:        # memory is short: let the preempted wait a step
            self._admit_waiting(plan, budget, now)
        return plan

    def finish(self, request: Request) -> None:
        super().finish(request)
        if request in self.running:
            self.leave(request)
