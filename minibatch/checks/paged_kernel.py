"""Chapter 08 (kernels), debugging: a paged decode-attention loop that reads the wrong block.

The exercise hands out a plain NumPy loop over a paged KV cache with a planted off-by-one in the
block-table index: it reads position `p` from block `block_table[(p + 1) // block_size]` (counting
the tokens up to `p` instead of indexing `p`) where the block that holds token `p` is
`block_table[p // block_size]`. While the context fits in one block without filling it, it is right,
so short prompts pass; past that, the last row of each block is read from the block after it (a row
not yet written, in the last block), or the loop runs off the end of the table when the context ends
at a block boundary. The checker compares the learner's loop with the engine's torch reference
backend on contexts of one block and of several, and recognises the planted bug and the usual wrong
fixes by what they return.
"""
from __future__ import annotations

import numpy as np
import torch

from minibatch.checks.core import NotSolved, checker

# (block size, KV heads, query heads per KV head, head dim, context length): contexts shorter than a block first
SHAPES = [(16, 1, 1, 8, 5), (32, 2, 2, 8, 20), (4, 1, 1, 8, 6), (8, 2, 2, 8, 8), (1, 2, 2, 8, 5),
          (16, 3, 3, 64, 37), (8, 2, 4, 32, 64), (4, 2, 1, 16, 13)]


def _case(seed: int, block_size, num_kv_heads, group, head_dim, context_len):
    """Random caches with the sequence's blocks shuffled among spare ones, and one decode query (Hq, D)."""
    rng = np.random.default_rng(seed)
    needed = -(-context_len // block_size)
    table = rng.permutation(needed + 3)[:needed].tolist()
    shape = (needed + 3, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
    query = (2 * rng.standard_normal((num_kv_heads * group, head_dim))).astype(np.float32)
    return query, k_cache, v_cache, table, context_len, float(head_dim ** -0.5)


def reference(query, k_cache, v_cache, block_table, context_len, scale):
    """The engine's torch reference backend on this one decoding sequence: (Hq, D) numpy."""
    from minibatch.checks.build_kernel import reference_attend

    out = reference_attend(torch.from_numpy(query)[None], torch.from_numpy(k_cache), torch.from_numpy(v_cache),
                           torch.tensor(block_table), context_len, scale)       # (1, Hq, D)
    return out[0].numpy()


def _loop(query, k_cache, v_cache, table, context_len, scale, block_of=None, length=None, kv_of_head=None):
    """Decode attention that reads position p from block table[block_of(p, block_size)]: (Hq, D)."""
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    num_heads = query.shape[0]
    block_of = block_of or (lambda p, b: p // b)
    kv_of_head = kv_of_head or (lambda h: h // (num_heads // num_kv_heads))
    positions = range(length or context_len)
    rows = [(table[block_of(p, block_size)], p % block_size) for p in positions]
    out = np.zeros_like(query)
    for head in range(num_heads):
        keys = np.stack([k_cache[b, r, kv_of_head(head)] for b, r in rows])      # (L, D)
        values = np.stack([v_cache[b, r, kv_of_head(head)] for b, r in rows])    # (L, D)
        scores = keys @ query[head] * scale                                       # (L,)
        weights = np.exp(scores - scores.max())
        out[head] = weights / weights.sum() @ values
    return out


WRONG_TURNS = {   # name: (what it returns on a case, what the message says)
    "planted": (lambda *a: _loop(*a, block_of=lambda p, b: (p + 1) // b),
                "the last row of each block is read from the block after it (in the last block, a row no token "
                "was written to), and a context that ends at a block boundary runs off the end of block_table"),
    "minus one": (lambda *a: _loop(*a, block_of=lambda p, b: (p + 1) // b - 1),
                  "position p is read from block_table[(p + 1) // block_size - 1]: the first block_size - 1 positions "
                  "get index -1, which Python wraps round to the LAST block; the block that holds token p (counting "
                  "from 0) is block_table[p // block_size]"),
    "whole last block": (lambda *a: _loop(*a, length=len(a[3]) * a[1].shape[1]),
                         "your loop reads every row of the last block, past context_len: the rows after the last "
                         "token hold stale keys; attend to positions 0 .. context_len - 1 only"),
    "kv head modulo": (lambda *a: _loop(*a, kv_of_head=lambda h: h % a[1].shape[2]),
                       "query head h reads KV head h % num_kv_heads: the Hq // Hkv query heads that share a KV head "
                       "are neighbours, so query head h reads KV head h // (Hq // Hkv)"),
    "no scale": (lambda *a: _loop(*a[:5], 1.0),
                 "the scores are not multiplied by scale (1 / sqrt(head_dim)): the softmax comes out too sharp"),
}


def _close(got, want) -> bool:
    return np.shape(got) == want.shape and np.allclose(np.asarray(got, dtype=np.float64), want, rtol=1e-4, atol=1e-4)


@checker("paged_decode_attention(query, k_cache, v_cache, block_table, context_len, scale), debugged")
def check_paged_decode_fix(paged_decode_attention):
    """The learner's loop against the torch reference on one-block and many-block contexts."""
    passed = []
    for seed, shape in enumerate(SHAPES):
        args = _case(seed, *shape)
        block_size, context_len = shape[0], shape[4]
        shown = (f"block_size {block_size}, context_len {context_len} ({-(-context_len // block_size)} blocks), "
                 f"{shape[1]} KV heads x {shape[2]} query heads each")
        want = reference(*args)
        try:
            got = paged_decode_attention(*[np.copy(a) if isinstance(a, np.ndarray) else a for a in args])
        except IndexError as err:
            raise AssertionError(f"on {shown}: IndexError ({err}): your loop runs off the end of block_table, "
                                 f"which lists {len(args[3])} blocks; position p lies in block_table[p // block_size]")
        if _close(got, want):
            passed.append(shown)
            continue
        for name, (variant, why) in WRONG_TURNS.items():
            try:
                matches = _close(got, variant(*args))
            except IndexError:
                matches = False
            if matches and name == "planted":
                raise NotSolved(f"the loop matches the torch reference on {len(passed)} context(s) shorter than one "
                                f"block, but not on {shown}. Print, for each position p, the (block, row) your loop "
                                f"reads next to block_table: {why}")
            if matches:
                raise AssertionError(f"on {shown}: {why}")
        largest = (f", largest difference {float(np.abs(np.asarray(got) - want).max()):.3g}"
                   if np.shape(got) == want.shape else f", got shape {np.shape(got)}")
        raise AssertionError(f"wrong answer on {shown}: expected the torch reference's output of shape {want.shape} "
                             f"(to 1e-4){largest}")
    return len(SHAPES)
