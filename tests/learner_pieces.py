"""A learner's correct pieces for the engine's extension points, as the build exercises' solutions write them,
and the allocator mistakes that both the checkers' and the engine guards' tests plant."""
import torch

from minibatch.engine.kv import BlockManager
from minibatch.engine.schedulers import ScheduledSeq, Scheduler, StepPlan


class JoinLeaveScheduler(Scheduler):
    """Continuous batching: serve the running in order, then admit from the head of the queue."""

    def schedule(self, now):
        plan, budget = StepPlan(), self.max_tokens_per_step
        for request in self.running:
            tokens = self.tokens_to_compute(request, budget)
            if tokens == 0:
                break
            self.blocks.allocate(request.request_id, request.num_computed_tokens + tokens)
            plan.seqs.append(ScheduledSeq(request, tokens))
            budget -= tokens
        while self.waiting and len(self.running) < self.max_batch_size and budget > 0:
            request = self.waiting[0]
            tokens = self.tokens_to_compute(request, budget)
            if not self.blocks.can_allocate(request.request_id, tokens):
                break
            self.admit(request)
            self.blocks.allocate(request.request_id, tokens)
            plan.seqs.append(ScheduledSeq(request, tokens))
            budget -= tokens
        return plan

    def finish(self, request):
        super().finish(request)
        self.leave(request)


class FreeListAllocator(BlockManager):
    """Paged blocks from the front of the free list, given back at its end."""

    def allocate(self, request_id, num_tokens, prefix=()):
        table = self.block_tables.setdefault(request_id, [])
        while len(table) * self.block_size < num_tokens:
            block = self.free_blocks.popleft()
            self.ref_counts[block] = 1
            table.append(block)
        self.tokens_stored[request_id] = max(self.tokens_stored.get(request_id, 0), num_tokens)
        return table

    def free(self, request_id):
        for block in self.block_tables.pop(request_id, []):
            del self.ref_counts[block]
            self.free_blocks.append(block)
        self.tokens_stored.pop(request_id, None)


def attend(query, k_cache, v_cache, block_table, context_len, scale):
    """One sequence's causal attention over its paged K/V: query (Tq, Hq, D) -> (Tq, Hq, D)."""
    num_q, num_heads, _ = query.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    positions = torch.arange(context_len, device=query.device)
    blocks, offsets = block_table[positions // block_size], positions % block_size
    group = num_heads // num_kv_heads
    keys = k_cache[blocks, offsets].repeat_interleave(group, dim=1)          # (L, Hq, D)
    values = v_cache[blocks, offsets].repeat_interleave(group, dim=1)        # (L, Hq, D)
    scores = torch.einsum("qhd,lhd->hql", query, keys) * scale              # (Hq, Tq, L)
    query_pos = context_len - num_q + torch.arange(num_q, device=query.device)
    scores = scores.masked_fill(positions[None, :] > query_pos[:, None], float("-inf"))
    return torch.einsum("hql,lhd->qhd", scores.softmax(-1), values)


def greedy(logits, requests):
    return logits.argmax(-1)


class LosesFreedBlocks(FreeListAllocator):
    """A planted mistake: free() drops a request's blocks without returning them to the free list."""

    def free(self, request_id):
        for block in self.block_tables.pop(request_id, []):
            del self.ref_counts[block]
        self.tokens_stored.pop(request_id, None)


class ForgetsRefCounts(FreeListAllocator):
    """A planted mistake: allocate() leaves no reference counts (free() returns the blocks all the same)."""

    def allocate(self, request_id, num_tokens, prefix=()):
        table = super().allocate(request_id, num_tokens, prefix)
        self.ref_counts.clear()
        return table

    def free(self, request_id):
        self.free_blocks.extend(self.block_tables.pop(request_id, []))
        self.tokens_stored.pop(request_id, None)
