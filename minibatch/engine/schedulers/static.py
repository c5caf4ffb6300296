"""Static batching: form a batch, run it until its longest member finishes, then form the next.

A batch starts when `max_batch_size` requests wait or the oldest has waited `batch_timeout_s`.
Members that finish early keep their slots, idle, and nobody joins until the whole batch is done:
the wait-for-the-longest waste of a padded `generate()` call. A batch is admitted only if every
member's worst case (prompt + max_new_tokens) fits in the free KV blocks, so it never preempts.
"""
from __future__ import annotations

from minibatch.engine.schedulers.base import ScheduledSeq, Scheduler, StepPlan


class StaticScheduler(Scheduler):
    def _form_batch(self, now: float) -> None:
        if self.running or not self.waiting or not self.batch_ready(now):
            return
        free = self.blocks.num_free_blocks
        while self.waiting and len(self.running) < self.max_batch_size:
            request = self.waiting[0]
            prefix = self.cached_prefix(request)                      # [] without prefix caching
            need = self.blocks.blocks_needed(request.request_id, request.max_total_tokens, prefix)
            if need > free:
                break
            free -= need
            self._admit(self.waiting.popleft())
            if prefix:
                self.blocks.allocate(request.request_id, len(prefix) * self.blocks.block_size, prefix)
            self._start_after_prefix(request, prefix)

    def schedule(self, now: float) -> StepPlan:
        if self.running and all(r.is_finished for r in self.running):
            for request in self.running:          # the longest member is done: the batch dissolves
                self._release_slot(request)
            self.running = []
        self._form_batch(now)
        plan, budget = StepPlan(), self.max_tokens_per_step
        for request in self.running:
            todo = self.tokens_to_compute(request, budget)
            if request.is_finished or todo == 0:
                plan.held_slots[self.slot_of[request.request_id]] = request.request_id
                continue
            self.blocks.allocate(request.request_id, request.num_computed_tokens + todo)
            plan.seqs.append(ScheduledSeq(request, todo))
            budget -= todo
        return plan
