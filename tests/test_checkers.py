"""Each exercise checker passes the reference answer and catches the planted mistakes a learner
makes, with a message that names the mistake or the input it failed on."""

from dataclasses import replace

import pytest
import torch

from minibatch.checks import (check_burst_lab, check_long_prompt_ttft, check_pick_token_budget,
                              check_roofline_tokens_per_s, check_saturating_batch, chunking, slm_vs_llm)
from minibatch.checks.why_batch import ADVICE, MISTAKES, roofline_tokens_per_s


def test_roofline_reference_is_solved():
    assert check_roofline_tokens_per_s(roofline_tokens_per_s).solved


@pytest.mark.parametrize("mistake", MISTAKES)
def test_roofline_mistake_is_named(mistake):
    with pytest.raises(AssertionError, match=ADVICE[mistake].split(":")[0]):
        check_roofline_tokens_per_s(MISTAKES[mistake])


def test_roofline_other_wrong_answer_names_its_input():
    with pytest.raises(AssertionError, match=r"(?s)input:.*expected"):
        check_roofline_tokens_per_s(lambda b, wb, wp, bw, fl: 1 / max(wb / bw, 2 * b * wp / fl))  # steps/s


# ---- chapter 05: a token budget for an inter-token latency --------------------------------------

def _budgets(step_s_of):
    """A pick_token_budget that asks step_s_of(budget, num_decoding, step_s) for a candidate's fullest step."""
    def pick(step_s, num_decoding, itl_limit_s, candidates):
        fits = [b for b in candidates if b > num_decoding and step_s_of(b, num_decoding, step_s) <= itl_limit_s]
        return max(fits, default=None)
    return pick


def test_budget_references_are_solved():
    assert check_pick_token_budget(chunking.pick_token_budget).solved
    assert check_long_prompt_ttft(chunking.long_prompt_ttft).solved


@pytest.mark.parametrize("wrong, named", [
    (_budgets(lambda b, d, step_s: step_s(b - d, 0)), "the decoders' tokens cost time"),          # decoders free
    (_budgets(lambda b, d, step_s: step_s(b, d)), "carries the 8 decode tokens and 56 prompt"),   # b prompt + d
    (lambda step_s, d, limit, candidates: min((b for b in candidates if b > d and step_s(b - d, d) <= limit),
                                              default=None), "not the smallest"),
    (lambda step_s, d, limit, candidates: max((b for b in candidates if step_s(b - d, d) <= limit), default=None),
     r"(?s)input:.*20, 0\.05"),                                                    # a budget the decoders fill
])
def test_budget_mistakes_are_caught(wrong, named):
    with pytest.raises(AssertionError, match=named):
        check_pick_token_budget(wrong)


def test_ttft_mistakes_are_caught():
    whole_budget_chunks = lambda step_s, b, d, n: -(-n // b) * step_s(b, d)            # noqa: E731
    with pytest.raises(AssertionError, match="each chunk holds 60 prompt tokens"):
        check_long_prompt_ttft(whole_budget_chunks)
    full_last_chunk = lambda step_s, b, d, n: -(-n // (b - d)) * step_s(b - d, d)      # noqa: E731
    with pytest.raises(AssertionError, match=r"(?s)input:.*130"):
        check_long_prompt_ttft(full_last_chunk)


# ---- chapter 05's open lab: decode-first or prefill-first, and a budget, for a burst ----------

@pytest.mark.parametrize("answer, words", [
    (lambda base: base, ["step_priority='decode-first' with max_tokens_per_step=512 misses",
                         "chat: longest gap between two tokens", "over the limit of 0.6 s by"]),
    (lambda base: replace(base, step_priority="prefill-first", max_tokens_per_step=256), ["chat: longest gap"]),
    (lambda base: replace(base, max_tokens_per_step=64), ["document: p99 TTFT", "over the limit of 11 s by"]),
    (lambda base: replace(base, max_tokens_per_step=256, max_batch_size=32), ["max_batch_size changed"]),
    (lambda base: "decode-first", ["must return an EngineConfig", "'decode-first'"]),
    (lambda base: replace(base, step_priority="decode"), ["refuses", "step_priority='decode'"]),
])
def test_burst_lab_checker_catches_planted_mistakes(answer, words):
    with pytest.raises(AssertionError) as err:
        check_burst_lab(answer)
    for word in words:
        assert word in str(err.value)


def test_burst_lab_has_an_answer_that_neither_the_default_nor_prefill_first_meets():
    from minibatch.tools.burst import BURST_BASE, BURST_LIMITS, burst_score
    assert check_burst_lab(lambda base: replace(base, max_tokens_per_step=256)).solved
    gap_limit = BURST_LIMITS[("chat", "longest_gap_s")]
    for budget in (64, 256, 2048):
        stalled = burst_score(replace(BURST_BASE, step_priority="prefill-first", max_tokens_per_step=budget))
        assert stalled["chat"]["longest_gap_s"] > 5 * gap_limit      # the decoders wait out the burst's prompts
    assert burst_score(BURST_BASE)["chat"]["longest_gap_s"] > gap_limit


# ---- chapter 13: the knee of the tokens/s curve ------------------------------------------------

def test_knee_reference_is_solved():
    assert check_saturating_batch(slm_vs_llm.saturating_batch).solved


def _first_batch(reaches):
    """A linear-scan saturating_batch whose test is reaches(batch, step_s, limit)."""
    return lambda step_s, limit=65536: next(b for b in range(1, limit + 1) if reaches(b, step_s, limit))


@pytest.mark.parametrize("wrong, named", [
    (lambda step_s, limit=65536: limit // 2, "half the limit"),
    (lambda step_s, limit=65536: slm_vs_llm.saturating_batch(step_s, limit) - 1, "smallest batch that reaches"),
    (_first_batch(lambda b, step_s, limit: b / step_s(b) > limit / step_s(limit) / 2), r"(?s)input:.*got: +33"),
    (_first_batch(lambda b, step_s, limit: b / step_s(b) >= 2 / step_s(1)), r"(?s)input:"),   # twice batch 1's
])
def test_knee_mistakes_are_caught(wrong, named):
    with pytest.raises(AssertionError, match=named):
        check_saturating_batch(wrong)

# ---- the build track: pieces that run inside the engine ---------------------------------------

from learner_pieces import ForgetsRefCounts, FreeListAllocator, JoinLeaveScheduler, LosesFreedBlocks, attend  # noqa: E402
from minibatch.checks import check_allocator, check_attend, check_built_engine, check_prefix_hash, check_scheduler  # noqa: E402


def test_build_references_are_solved():
    assert check_scheduler(JoinLeaveScheduler).solved
    assert check_allocator(FreeListAllocator).solved
    assert check_attend(attend).solved
    assert check_built_engine(JoinLeaveScheduler, FreeListAllocator, attend).solved


class NoChunks(JoinLeaveScheduler):
    """A prompt longer than the budget left waits for a later step instead of starting with a chunk."""

    def tokens_to_compute(self, request, budget):
        todo = request.num_tokens - request.num_computed_tokens
        return todo if todo <= budget or request.num_computed_tokens else 0


class NewestFirst(JoinLeaveScheduler):
    """The plan lists the newest requests first: valid for the engine, but not the engine's order."""

    def schedule(self, now):
        plan = super().schedule(now)
        plan.seqs.reverse()
        return plan


class OffByOneSlot(JoinLeaveScheduler):
    def schedule(self, now):
        self.max_batch_size += 1                                         # admits while running <= max_batch_size
        try:
            return super().schedule(now)
        finally:
            self.max_batch_size -= 1


class WholeBudgetChunks(JoinLeaveScheduler):
    def tokens_to_compute(self, request, budget):
        return min(request.num_tokens - request.num_computed_tokens, self.max_tokens_per_step)


@pytest.mark.parametrize("wrong, named", [
    (OffByOneSlot, r"(?s)joins while all 4 slots are taken.*"
                   r"admit only while len\(self.running\) < self.max_batch_size"),
    (WholeBudgetChunks, r"(?s)more than max_tokens_per_step=16.*budget left"),
    (NoChunks, r"(?s)step 0: request 0 computes 0 tokens from position 0.*tokens_to_compute"),
    (NewestFirst, r"(?s)step 0 differs from the engine's continuous scheduler.*expected: \[\(0, 26\), \(1, 2\).*"
                  r"got: +\[\(3, "),
])
def test_scheduler_mistakes_are_caught(wrong, named):
    with pytest.raises(AssertionError, match=named):
        check_scheduler(wrong)


class TakesFromTheEnd(FreeListAllocator):
    def allocate(self, request_id, num_tokens, prefix=()):
        table = self.block_tables.setdefault(request_id, [])
        while len(table) * self.block_size < num_tokens:
            table.append(self.free_blocks.pop())                     # pop() instead of popleft()
            self.ref_counts[table[-1]] = 1
        self.tokens_stored[request_id] = max(self.tokens_stored.get(request_id, 0), num_tokens)
        return table


class OneBlockPerCall(FreeListAllocator):
    def allocate(self, request_id, num_tokens, prefix=()):
        held = len(self.block_tables.get(request_id, ())) * self.block_size
        return super().allocate(request_id, min(num_tokens, held + 1))


@pytest.mark.parametrize("wrong, named", [
    (TakesFromTheEnd, r"(?s)after allocate\(0, 1\) \(block_size 4.*expected: block_tables \{0: \[0\]\}.*"
                      r"got: +block_tables \{0: \[7\]\}.*take new blocks from the front of free_blocks"),
    (OneBlockPerCall, r"(?s)allocate\(request 1, 9 tokens\), step 0: request 1's table \[\d\] holds fewer "
                      r"than 9 tokens"),
    (LosesFreedBlocks, r"(?s)free\(request 0\), step 0: blocks \[0, 1\] are neither free nor held.*"
                       r"back to free_blocks"),
    (ForgetsRefCounts, r"(?s)block 0 is in 1 block table\(s\) but ref_counts\[0\] is None"),
])
def test_allocator_mistakes_are_caught(wrong, named):
    with pytest.raises(AssertionError, match=named):
        check_allocator(wrong)


def _attend_without_mask(query, k_cache, v_cache, block_table, context_len, scale):
    return torch.cat([attend(query[j:j + 1], k_cache, v_cache, block_table, context_len, scale)
                      for j in range(len(query))])                          # every row sees the whole context


def _attend_modulo_heads(query, k_cache, v_cache, block_table, context_len, scale):
    num_kv_heads, group = k_cache.shape[2], query.shape[1] // k_cache.shape[2]
    order = torch.tensor([(h % num_kv_heads) * group + h // num_kv_heads for h in range(query.shape[1])])
    out = attend(query[:, torch.argsort(order)], k_cache, v_cache, block_table, context_len, scale)
    return out[:, order]                                                     # head h reads KV head h % Hkv


@pytest.mark.parametrize("wrong, named", [
    (_attend_without_mask, "on block_size 4, 1 KV heads x 1 query heads each, head_dim 8, 0 tokens cached before 6 new "
                           "query rows: your attend lets every query row see the whole context"),
    (_attend_modulo_heads, r"your attend maps query head h to KV head h % num_kv_heads: .* h // \(Hq // Hkv\)"),
    (lambda q, k, v, table, ctx, scale: attend(q, k, v, table, ctx, 1.0), "your attend forgets the scale"),
    (lambda q, k, v, table, ctx, scale: attend(q, k, v, table, ctx, scale)[-1],
     r"wrong answer on block_size 4.*expected a tensor of shape \(1, 1, 8\).*got shape \(1, 8\)"),
])
def test_attention_mistakes_are_caught(wrong, named):
    with pytest.raises(AssertionError, match=named):
        check_attend(wrong)


@pytest.mark.parametrize("pieces, named", [
    ((JoinLeaveScheduler, FreeListAllocator, lambda q, k, v, t, c, s: attend(q, k, v, t, c, 1.0)),
     r"(?s)with your scheduler, allocator and attention and EngineConfig\(.*\), request 0's tokens differ from "
     r"transformers' generate\(\):\n  expected: \[.*\]\n  got: "),
    ((JoinLeaveScheduler, LosesFreedBlocks, attend),
     r"(?s)the engine stopped your pieces:\nallocator LosesFreedBlocks.free"),
    ((OffByOneSlot, FreeListAllocator, attend), r"(?s)the engine stopped your pieces:\nscheduler OffByOneSlot.admit"),
])
def test_built_engine_mistakes_are_caught(pieces, named):
    with pytest.raises(AssertionError, match=named):
        check_built_engine(*pieces)


def _sha_chain(parent, tokens):
    import hashlib

    import numpy as np
    return hashlib.sha256(parent + np.asarray(tokens, dtype="<i8").tobytes()).digest()


def test_prefix_hash_reference_is_solved():
    assert check_prefix_hash(_sha_chain).solved


_calls = iter(range(10 ** 9))


@pytest.mark.parametrize("wrong, named", [
    (lambda parent, tokens: _sha_chain(b"", tokens), r"(?s)the same tokens after a different prefix got the same name"
                                                     r".*chain the parent in"),
    (lambda parent, tokens: _sha_chain(parent, tokens[:-1]), r"\(token 3 differs\) got the same name"),
    (lambda parent, tokens: _sha_chain(parent, tokens) + bytes([next(_calls) % 256]), r"then b'"),
    (lambda parent, tokens: list(_sha_chain(parent, tokens)), r"it returned list .* cannot be a dict key"),
])
def test_prefix_hash_mistakes_are_caught(wrong, named):
    with pytest.raises(AssertionError, match=named):
        check_prefix_hash(wrong)
