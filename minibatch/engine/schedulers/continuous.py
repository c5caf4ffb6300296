"""Continuous batching: at every step finished requests leave and waiting ones join.

Each step first serves the running requests in the order they were admitted (a decode token
each, or the next chunk of a long prompt), then admits waiting requests while there is a free
slot, token budget and KV room. Prompts longer than the budget are prefilled in chunks. When a
running request needs a block and none is free, the newest running request is preempted: its
blocks are freed and it waits again at the head of the queue, to recompute what it had.
An idle engine honours the batching timeout before it starts; a busy one admits at once.
"""
from __future__ import annotations

from minibatch.engine.request import Request, RequestStatus
from minibatch.engine.schedulers.base import ScheduledSeq, Scheduler, StepPlan


class ContinuousScheduler(Scheduler):
    def _preempt(self, request: Request, plan: StepPlan) -> None:
        self.running.remove(request)
        self._release_slot(request)
        self.blocks.free(request.request_id)
        request.num_computed_tokens = 0          # recompute from scratch when it runs again
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.waiting.appendleft(request)
        plan.preempted.append(request)

    def _serve_running(self, plan: StepPlan, budget: int) -> int:
        for request in list(self.running):
            if request not in self.running or budget == 0:
                continue
            todo = min(request.num_tokens - request.num_computed_tokens, budget)
            target = request.num_computed_tokens + todo
            while not self.blocks.can_allocate(request.request_id, target) and request in self.running:
                self._preempt(self.running[-1], plan)
            if request in self.running:
                lookahead = self.lookahead(request, budget)         # 0 unless speculating; never preempts for it
                if not self.blocks.can_allocate(request.request_id, target + lookahead):
                    lookahead = 0
                self.blocks.allocate(request.request_id, target + lookahead)
                plan.seqs.append(ScheduledSeq(request, todo, lookahead))
                budget -= todo + lookahead
        return budget

    def _admit_waiting(self, plan: StepPlan, budget: int, now: float) -> None:
        if not self.running and self.waiting and not self.batch_ready(now):
            return
        while self.waiting and len(self.running) < self.max_batch_size and budget > 0:
            request = self.waiting[0]
            todo = min(request.num_tokens - request.num_computed_tokens, budget)
            if not self.blocks.can_allocate(request.request_id, todo):
                break
            self._admit(self.waiting.popleft())
            self.blocks.allocate(request.request_id, todo)
            plan.seqs.append(ScheduledSeq(request, todo))
            budget -= todo

    def schedule(self, now: float) -> StepPlan:
        plan = StepPlan()
        budget = self._serve_running(plan, self.max_tokens_per_step)
        if not plan.preempted:                   # memory is short: let the preempted wait a step
            self._admit_waiting(plan, budget, now)
        return plan

    def finish(self, request: Request) -> None:
        super().finish(request)
        if request in self.running:
            self.running.remove(request)
            self._release_slot(request)
