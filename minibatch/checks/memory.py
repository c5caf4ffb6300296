"""Chapters 06 and 08 (the KV cache, memory and paged attention): block growth and a paged decode kernel."""

import numpy as np
import torch

from minibatch.checks.core import Case, check_cases, checker, same_value


def _growth_cases():
    """(block_size, free list order, prompt tokens, tokens to append) per scenario."""
    rng = np.random.default_rng(6)
    cases = [(4, list(range(8)), 1, 10), (4, [5, 2, 7, 0, 1, 3, 6, 4], 4, 9), (16, [3, 1, 2, 0], 15, 20),
             (1, [9, 4, 6, 2, 8], 0, 5), (8, [2, 0, 1], 0, 24)]
    for _ in range(6):
        block_size, num_blocks = int(rng.choice([2, 4, 8, 16])), int(rng.integers(6, 20))
        prompt = int(rng.integers(0, 3 * block_size))
        room = num_blocks * block_size - prompt
        cases.append((block_size, rng.permutation(num_blocks).tolist(), prompt, int(rng.integers(1, room + 1))))
    return cases


def _explain_growth(call, num_tokens, block_size, got, expected):
    """AssertionError naming the rule a wrong step broke, when it is one of the usual ones."""
    (slot, table, _), (want_slot, want_table, _) = got, expected
    if len(table) > len(want_table):
        raise AssertionError(f"{call}: you took a new block, but position {num_tokens} still fits in the last block "
                             f"(a block holds {block_size} tokens; a new one is needed only when "
                             "num_tokens % block_size == 0)")
    if len(table) < len(want_table):
        raise AssertionError(f"{call}: position {num_tokens} starts a new block, but you took none: every block so far "
                             "is full")
    if table != want_table:
        raise AssertionError(f"{call}: you took block {table[-1]}, the free list's front is {want_table[-1]}: take "
                             "blocks from the front (popleft), as the engine's BlockManager does")
    if slot != want_slot:
        raise AssertionError(f"{call}: slot {slot}, the engine's is {want_slot}: a token's slot is its block's id "
                             "times block_size, plus its offset in the block (position % block_size)")


@checker("append_token(block_table, num_tokens, free_blocks, block_size)")
def check_append_token(append_token):
    """Grow sequences one token at a time beside the engine's BlockManager: same slots, tables, free lists."""
    from collections import deque

    from minibatch.engine.kv import BlockManager

    count = 0
    for block_size, order, prompt, new_tokens in _growth_cases():
        manager = BlockManager(len(order), block_size)
        manager.free_blocks = deque(order)
        if prompt:
            manager.allocate(0, prompt)
        table, free = list(manager.block_tables.get(0, [])), deque(manager.free_blocks)
        for num_tokens in range(prompt, prompt + new_tokens):
            before = f"append_token({table}, {num_tokens}, deque({list(free)}), {block_size})"
            manager.allocate(0, num_tokens + 1)
            expected = (manager.slot(0, num_tokens), manager.block_tables[0], list(manager.free_blocks))
            slot = append_token(table, num_tokens, free, block_size)
            got = (slot, table, list(free))
            if not same_value(got, expected):
                _explain_growth(before, num_tokens, block_size, got, expected)
            assert same_value(got, expected), (
                f"wrong answer\n  call:     {before}\n  expected: slot {expected[0]}, block_table {expected[1]}, "
                f"free_blocks {expected[2]}\n  got:      slot {got[0]}, block_table {got[1]}, free_blocks {got[2]}")
            count += 1
    return count


def _decode_case(seed, block_size, num_kv_heads, group, head_dim, context_len):
    """Random caches with the sequence's blocks shuffled among spare ones, and one decode query."""
    rng = np.random.default_rng(seed)
    needed = -(-context_len // block_size)
    num_blocks = needed + 3
    table = rng.permutation(num_blocks)[:needed].tolist()
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
    query = (2 * rng.standard_normal((num_kv_heads * group, head_dim))).astype(np.float32)
    return query, k_cache, v_cache, table, context_len, float(head_dim ** -0.5)


def _reference_decode(query, k_cache, v_cache, block_table, context_len, scale):
    """The torch reference backend on a batch of one decoding sequence; (Hq, D) numpy."""
    from minibatch.engine.kernels import AttentionMetadata, get_backend

    meta = AttentionMetadata.build([1], [context_len], [block_table], "cpu")
    out = get_backend("torch").attention(torch.from_numpy(query)[None], torch.from_numpy(k_cache),
                                         torch.from_numpy(v_cache), meta, scale)
    return out[0].numpy()


@checker("paged_decode_attention(query, k_cache, v_cache, block_table, context_len, scale)")
def check_paged_decode_attention(paged_decode_attention):
    """One decoding sequence over a paged cache, against the torch reference backend (fp32, 1e-4)."""
    shapes = [(4, 1, 1, 8, 1), (4, 1, 1, 8, 4), (4, 1, 1, 8, 6), (1, 2, 2, 8, 5), (16, 3, 3, 64, 37),
              (8, 2, 4, 32, 64), (32, 1, 3, 16, 33), (16, 3, 3, 64, 200)]
    cases = [Case(_decode_case(seed, *shape), None) for seed, shape in enumerate(shapes)]
    cases = [Case(c.args, _reference_decode(*c.args)) for c in cases]
    close = lambda got, want: (np.shape(got) == want.shape  # noqa: E731
                               and np.allclose(np.asarray(got, dtype=np.float64), want, rtol=1e-4, atol=1e-4))
    return check_cases(paged_decode_attention, cases, equal=close)
