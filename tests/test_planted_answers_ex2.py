"""Chapters 08-14: each checker rejects the planted wrong answers with a message that teaches (asserted on a
key phrase), reports the handed-out stub as unsolved, and passes the reference answer."""

import numpy as np

from minibatch.checks.core import CheckResult


def rejected(check, *answers) -> str:
    """The message a checker gives a wrong answer: its AssertionError, or its "not solved yet" result."""
    try:
        result = check(*answers)
    except AssertionError as err:
        return str(err)
    assert isinstance(result, CheckResult) and not result.solved, f"a planted wrong answer passed: {result}"
    return result.message


def unsolved(check, *answers) -> str:
    """The message of a checker that must report `not solved yet` (a stub), raising nothing."""
    result = check(*answers)
    assert isinstance(result, CheckResult) and not result.solved and "not solved yet" in result.message, result
    return result.message


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise: write this part")


# ---- chapter 08: the paged decode loop that reads the wrong block ---------------------------------

def _decode_loop(block_of, scale_too=True, kv_modulo=False, rows_of=None):
    """The exercise's loop with a chosen block formula, as a learner might leave it."""
    def paged_decode_attention(query, k_cache, v_cache, block_table, context_len, scale):
        num_heads, head_dim = query.shape
        block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
        out = np.zeros((num_heads, head_dim), dtype=np.float32)
        length = rows_of(block_table, block_size) if rows_of else context_len
        for head in range(num_heads):
            kv = head % num_kv_heads if kv_modulo else head // (num_heads // num_kv_heads)
            cells = [(block_table[block_of(p, block_size)], p % block_size) for p in range(length)]
            scores = np.array([query[head] @ k_cache[b, r, kv] * (scale if scale_too else 1.0) for b, r in cells])
            weights = np.exp(scores - scores.max())
            out[head] = weights / weights.sum() @ np.stack([v_cache[b, r, kv] for b, r in cells])
        return out
    return paged_decode_attention


def test_08_paged_loop():
    from minibatch.checks.paged_kernel import check_paged_decode_fix

    assert check_paged_decode_fix(_decode_loop(lambda p, b: p // b)).solved
    buggy = unsolved(check_paged_decode_fix, _decode_loop(lambda p, b: (p + 1) // b))      # the handed-out bug
    assert "shorter than one block" in buggy and "read from the block after it" in buggy
    minus_one = _decode_loop(lambda p, b: (p + 1) // b - 1)
    assert "wraps round to the LAST block" in rejected(check_paged_decode_fix, minus_one)
    assert "past context_len" in rejected(check_paged_decode_fix,
                                          _decode_loop(lambda p, b: p // b, rows_of=lambda t, b: len(t) * b))
    assert "h // (Hq // Hkv)" in rejected(check_paged_decode_fix, _decode_loop(lambda p, b: p // b, kv_modulo=True))
    assert "too sharp" in rejected(check_paged_decode_fix, _decode_loop(lambda p, b: p // b, scale_too=False))
    assert "runs off the end" in rejected(check_paged_decode_fix, _decode_loop(lambda p, b: p // b + 1))
    assert "not solved yet" in unsolved(check_paged_decode_fix, stub)
