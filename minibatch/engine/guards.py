"""Guards around pieces written outside the engine: the invariants the rest of the engine relies on.

A guard runs the piece, checks what it did, and raises `InvariantError` at the first rule broken,
naming the piece, the step, the request and the rule, with what to do instead. Scheduler: at most
`max_batch_size` sequences and `max_tokens_per_step` tokens a step, no request twice, only running
requests with KV room for what they compute, every running request served while budget is left, a
ready queue not left waiting, a finished request's blocks freed. Allocator: room for the tokens asked,
a request's blocks never changed under it, every block free, held or cached and only one of them,
`ref_counts` and `tokens_stored` kept. Attention: a finite (Tq, Hq, D) output like the query.
Sampling rule: a token id in [0, V) per row. Prefix hash: deterministic, hashable, and dependent
on the parent and on every token.
"""
from __future__ import annotations

from typing import Callable

import torch

from minibatch.engine.kernels import torch_ref
from minibatch.engine.request import RequestStatus
from minibatch.engine.sampling import SampledToken
from minibatch.engine.schedulers.base import StepPlan


class InvariantError(RuntimeError):
    """A piece passed in through `Plugins` broke one of the engine's rules."""


def _fail(piece: str, step: int, rule: str, fix: str) -> None:
    raise InvariantError(f"{piece}, step {step}: {rule}.\n  What to do: {fix}")


# ---- scheduler --------------------------------------------------------------------------------

def guard_scheduler(scheduler, step_of: Callable[[], int]):
    """Check every `admit`, every plan `scheduler.schedule` returns and every `finish`; returns the same
    scheduler. The limits are read once, here, from the configuration the scheduler was built with."""
    schedule, finish, admit, name = scheduler.schedule, scheduler.finish, scheduler.admit, type(scheduler).__name__
    limits = (scheduler.max_batch_size, scheduler.max_tokens_per_step)

    def checked_admit(request) -> None:
        if request not in scheduler.waiting:
            _fail(f"scheduler {name}.admit", step_of(), f"request {request.request_id} was admitted but is not "
                  f"waiting (status {request.status.value})", "admit only requests from self.waiting, once")
        if len(scheduler.running) >= limits[0]:
            _fail(f"scheduler {name}.admit", step_of(), f"request {request.request_id} joins while all {limits[0]} "
                  f"slots are taken (running: {[r.request_id for r in scheduler.running]})",
                  "admit only while len(self.running) < self.max_batch_size")
        admit(request)

    def checked_schedule(now: float) -> StepPlan:
        plan = schedule(now)
        _check_plan(scheduler, plan, now, f"scheduler {name}.schedule", step_of(), *limits)
        return plan

    def checked_finish(request) -> None:
        finish(request)
        if request.request_id in scheduler.blocks.block_tables:
            _fail(f"scheduler {name}.finish", step_of(), f"request {request.request_id} finished but still holds "
                  f"KV blocks {scheduler.blocks.block_tables[request.request_id]}",
                  "call super().finish(request) first: it frees the request's blocks")

    scheduler.schedule, scheduler.finish, scheduler.admit = checked_schedule, checked_finish, checked_admit
    return scheduler


def _check_plan(s, plan, now: float, piece: str, step: int, max_batch_size: int, max_tokens_per_step: int) -> None:
    if not isinstance(plan, StepPlan):
        _fail(piece, step, f"it returned {plan!r}", "return a StepPlan whose seqs list the ScheduledSeq of each "
              "request that computes this step")
    seen, tokens = set(), 0
    for seq in plan.seqs:
        r = seq.request
        rid, start, n = r.request_id, seq.start, seq.num_new_tokens
        if rid in seen:
            _fail(piece, step, f"request {rid} is scheduled twice in one step", "give each request one ScheduledSeq "
                  "per step, with all the tokens it computes in that step")
        seen.add(rid)
        if r.is_finished:
            _fail(piece, step, f"request {rid} finished ({r.finish_reason}) but was scheduled again",
                  "a finished request leaves: finish(request) takes it out of self.running")
        if r.status is not RequestStatus.RUNNING or r not in s.running or rid not in s.slot_of:
            _fail(piece, step, f"request {rid} is scheduled but is not running (status {r.status.value})",
                  "admit a waiting request first (self.admit(request)): it takes a slot and joins self.running")
        if n < 1 or start + n > r.num_tokens:
            _fail(piece, step, f"request {rid} computes {n} tokens from position {start}, but {r.num_tokens} "
                  "tokens are known", "schedule between 1 and num_tokens - num_computed_tokens tokens "
                  "(self.tokens_to_compute(request, budget_left) does)")
        room = len(s.blocks.block_tables.get(rid, ())) * s.blocks.block_size
        if room < start + n + seq.num_lookahead:
            _fail(piece, step, f"request {rid} computes up to token {start + n} but its KV blocks hold {room} "
                  "tokens", "allocate before scheduling: self.blocks.allocate(request.request_id, "
                  "request.num_computed_tokens + tokens)")
        tokens += n + seq.num_lookahead
    if len(plan.seqs) > max_batch_size:
        _fail(piece, step, f"{len(plan.seqs)} sequences run (requests {sorted(seen)}), more than "
              f"max_batch_size={max_batch_size}", "admit only while len(self.running) < self.max_batch_size")
    if tokens > max_tokens_per_step:
        _fail(piece, step, f"the step computes {tokens} tokens, more than max_tokens_per_step="
              f"{max_tokens_per_step}", "take each request's tokens out of the budget left, "
              "min(tokens it has left, budget left), and stop when none is left")
    slots = [s.slot_of.get(r.request_id) for r in s.running]
    if len(s.running) > max_batch_size or None in slots or len(set(slots)) != len(slots):
        _fail(piece, step, f"{len(s.running)} running requests hold slots {slots} of {max_batch_size}",
              "each running request holds one slot of its own: admit with self.admit(request), give it back "
              "with self.leave(request)")
    left_out = [r.request_id for r in s.running if not r.is_finished and r.request_id not in seen
                and r not in plan.preempted]
    if left_out and tokens < max_tokens_per_step:
        _fail(piece, step, f"request {left_out[0]} is running but computes nothing, though the step used {tokens} "
              f"of its {max_tokens_per_step}-token budget", "serve every running request at every step while "
              "budget is left (a decode token, or the next chunk of its prompt)")
    if not plan.seqs and s.waiting and not any(not r.is_finished for r in s.running) and s.batch_ready(now):
        _fail(piece, step, f"requests {[r.request_id for r in list(s.waiting)[:4]]} wait, the batch is ready and "
              "nothing runs", "admit waiting requests while a slot, budget and KV blocks are free")


# ---- allocator --------------------------------------------------------------------------------

def guard_allocator(blocks, step_of: Callable[[], int]):
    """Check the pool after every `allocate`, `free` and `shrink`; returns the same block manager."""
    allocate, free, shrink, name = blocks.allocate, blocks.free, blocks.shrink, type(blocks).__name__

    def checked_allocate(request_id, num_tokens, prefix=()):
        piece, step = f"allocator {name}.allocate(request {request_id}, {num_tokens} tokens)", step_of()
        old = list(blocks.block_tables.get(request_id, ()))
        table = allocate(request_id, num_tokens, prefix)
        got = blocks.block_tables.get(request_id)
        if got is None or len(got) * blocks.block_size < num_tokens:
            _fail(piece, step, f"request {request_id}'s table {got} holds fewer than {num_tokens} tokens",
                  f"grow block_tables[request_id] to ceil(num_tokens / block_size) blocks (block_size "
                  f"{blocks.block_size}), one free block at a time")
        if got[:len(old)] != old:
            _fail(piece, step, f"request {request_id}'s blocks {old} became {got[:len(old)]}",
                  "keep the blocks a request holds (its K/V are in them); only append new ones")
        if blocks.tokens_stored.get(request_id, 0) < num_tokens:
            _fail(piece, step, f"tokens_stored[{request_id}] is {blocks.tokens_stored.get(request_id)}, not at "
                  f"least {num_tokens}", "record the room asked for: tokens_stored[request_id] = "
                  "max(what it was, num_tokens) (the memory figures read it)")
        _check_pool(blocks, piece, step)
        return table

    def checked_free(request_id):
        piece = f"allocator {name}.free(request {request_id})"
        free(request_id)
        if request_id in blocks.block_tables or request_id in blocks.tokens_stored:
            _fail(piece, step_of(), f"request {request_id} still has a block table or tokens_stored entry",
                  "pop the request's entries: block_tables.pop(request_id) and tokens_stored.pop(request_id)")
        _check_pool(blocks, piece, step_of())

    def checked_shrink(request_id, num_tokens):
        shrink(request_id, num_tokens)
        _check_pool(blocks, f"allocator {name}.shrink(request {request_id}, {num_tokens} tokens)", step_of())

    blocks.allocate, blocks.free, blocks.shrink = checked_allocate, checked_free, checked_shrink
    return blocks


def _check_pool(blocks, piece: str, step: int) -> None:
    """Every block is free, held or cached, exactly one of them, and the reference counts agree."""
    free, total = list(blocks.free_blocks), blocks.num_blocks
    if len(set(free)) != len(free):
        twice = next(b for b in free if free.count(b) > 1)
        _fail(piece, step, f"block {twice} is in free_blocks twice", "give a block back once, when its last "
              "holder lets go")
    holders: dict[int, list[int]] = {}
    for rid, table in blocks.block_tables.items():
        for block in table:
            holders.setdefault(block, []).append(rid)
    free_set = set(free)
    for block, rids in holders.items():
        if not 0 <= block < total:
            _fail(piece, step, f"request {rids[0]} holds block {block}, outside the pool's 0..{total - 1}",
                  "hand out only blocks taken from free_blocks")
        if block in free_set:
            _fail(piece, step, f"block {block} is held by request {rids[0]} and is also in free_blocks",
                  "take a block out of the free list when you hand it out (free_blocks.popleft())")
        if len(rids) > 1 and (blocks.prefix_cache is None or len(set(rids)) < len(rids)):
            _fail(piece, step, f"block {block} is held by requests {rids}", "a block belongs to one request at a "
                  "time (only prefix caching shares one, counting its holders): take new blocks from free_blocks")
        if blocks.ref_counts.get(block) != len(rids):
            _fail(piece, step, f"block {block} is in {len(rids)} block table(s) but ref_counts[{block}] is "
                  f"{blocks.ref_counts.get(block)}", "set ref_counts[block] = 1 when you hand a block out, and "
                  "delete the entry when it goes back to free_blocks")
    stale = sorted(set(blocks.ref_counts) - set(holders))
    if stale:
        _fail(piece, step, f"ref_counts counts blocks {stale[:8]} that no block table holds",
              "delete a block's ref_counts entry when it goes back to free_blocks")
    cached = set(blocks.prefix_cache.evictable) if blocks.prefix_cache else set()
    lost = sorted(set(range(total)) - free_set - set(holders) - cached)
    if lost:
        _fail(piece, step, f"blocks {lost[:8]} are neither free nor held by any request",
              "give every block of a request that lets go back to free_blocks")


# ---- attention, sampling, prefix hash ---------------------------------------------------------

class SequenceAttention:
    """A backend made of a per-sequence attention function: the engine writes K/V, then loops over sequences."""

    write_kv = staticmethod(torch_ref.write_kv)

    def __init__(self, attend: Callable, step_of: Callable[[], int], check: bool = True):
        self.attend, self.step_of, self.check = attend, step_of, check
        self.piece = f"attention {getattr(attend, '__name__', type(attend).__name__)}"

    def attention(self, query, k_cache, v_cache, meta, scale):
        """Causal attention of packed queries (T, Hq, D): the function once per sequence; returns (T, Hq, D)."""
        layer = meta.cache["plugin_layer"] = meta.cache.get("plugin_layer", -1) + 1
        out = torch.empty_like(query)                                      # (T, Hq, D)
        starts, contexts, block_size = meta.query_start_loc_np, meta.context_lens_np, k_cache.shape[1]
        request_ids = meta.cache.get("request_ids", range(meta.num_seqs))
        for i, rid in enumerate(request_ids):
            rows, context = slice(int(starts[i]), int(starts[i + 1])), int(contexts[i])
            table = meta.block_tables[i, :-(-context // block_size)]        # (blocks,) of this sequence
            got = self.attend(query[rows], k_cache, v_cache, table, context, scale)
            if self.check:
                self._check(got, query[rows], rid, layer, context)
            out[rows] = got
        return out

    def _check(self, got, query, rid, layer: int, context: int) -> None:
        what = f"request {rid} in layer {layer} ({query.shape[0]} query rows, context {context})"
        want = f"a tensor of shape {tuple(query.shape)} (query rows, heads, head_dim), dtype {query.dtype}, " \
               f"on {query.device}, like the query"
        if not isinstance(got, torch.Tensor) or got.shape != query.shape or got.dtype != query.dtype \
                or got.device != query.device:
            shown = (f"shape {tuple(got.shape)}, dtype {got.dtype}, on {got.device}"
                     if isinstance(got, torch.Tensor) else repr(type(got)))
            _fail(self.piece, self.step_of(), f"for {what} it returned {shown}", f"return {want}")
        if not torch.isfinite(got).all():
            _fail(self.piece, self.step_of(), f"for {what} it returned inf or nan", "subtract each row's largest "
                  "score before exp, and let each query see only positions up to its own (at least itself)")


class RuleSampler:
    """The sampler with its token choice replaced by a sampling rule; everything else is the sampler's."""

    def __init__(self, sampler, rule: Callable, step_of: Callable[[], int], check: bool = True):
        self.sampler, self.rule, self.step_of, self.check = sampler, rule, step_of, check
        self.piece = f"sampling rule {getattr(rule, '__name__', type(rule).__name__)}"

    def __getattr__(self, name):
        return getattr(self.sampler, name)

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, requests: list) -> list[SampledToken]:
        """logits (S, V) -> the rule's S tokens (with the raw log-probabilities where asked)."""
        params = [r.params for r in requests]
        logprobs = self.sampler._logprobs(logits, params)
        tokens = self.rule(self.sampler._process(logits.float(), requests, params), requests)
        tokens = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
        if self.check:
            self._check(tokens, requests, logits.shape[-1])
        out = [SampledToken(int(t)) for t in tokens]
        for row, (raw, top_values, top_ids) in logprobs.items():
            out[row].logprobs = {out[row].token_id: float(raw[out[row].token_id])} | dict(
                zip(top_ids.tolist(), top_values.tolist()))
        return out

    def _check(self, tokens: list, requests: list, vocab: int) -> None:
        if len(tokens) != len(requests):
            _fail(self.piece, self.step_of(), f"it returned {len(tokens)} tokens for {len(requests)} rows",
                  "return one token id per row of logits")
        for row, (token, r) in enumerate(zip(tokens, requests)):
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab:
                _fail(self.piece, self.step_of(), f"row {row} (request {r.request_id}) got {token!r}",
                      f"return an integer token id in [0, {vocab}) for every row (int(logits[row].argmax()) is one)")


def checked_hash(hash_fn: Callable, step_of: Callable[[], int]) -> Callable:
    """hash_fn, checked at every call for determinism and, at its first call, for what it depends on."""
    piece, probed = f"prefix hash {getattr(hash_fn, '__name__', type(hash_fn).__name__)}", []

    def checked(parent_hash, token_ids):
        name = hash_fn(parent_hash, token_ids)
        again = hash_fn(parent_hash, list(token_ids))
        try:
            hash(name)
        except TypeError:
            _fail(piece, step_of(), f"it returned {type(name).__name__} {name!r}, which cannot be a dict key",
                  "return bytes, an int, a str or a tuple")
        if again != name:
            _fail(piece, step_of(), f"the same parent and tokens {list(token_ids)[:8]}... got {name!r}, then "
                  f"{again!r}", "compute the name from the parent hash and the token ids alone (no counter, no "
                  "randomness, no id())")
        if not probed:
            tokens = list(token_ids)
            for where in sorted({0, len(tokens) - 1}):
                changed = tokens[:where] + [tokens[where] + 1] + tokens[where + 1:]
                if hash_fn(parent_hash, changed) == name:
                    _fail(piece, step_of(), f"blocks {tokens[:8]} and {changed[:8]} (token {where} differs) got "
                          "the same name", "hash every token id of the block")
            if hash_fn(name, tokens) == name:
                _fail(piece, step_of(), "the same tokens after a different prefix got the same name",
                      "chain the parent in: hash the parent hash together with the tokens")
            probed.append(True)
        return name

    return checked
