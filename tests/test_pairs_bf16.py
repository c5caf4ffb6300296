"""bfloat16 products pair by pair (AVX512-BF16's vdpbf16ps): the same products as the widening loop, rounded as
transformers rounds them, on every shape; taken only for bfloat16 and four rows or more."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from numba import njit

from minibatch.engine.kernels import pairs_bf16
from minibatch.engine.kernels.bfloat16 import host_view
from minibatch.engine.kernels.gemv_cpu import streamed_linear

needs_pairs = pytest.mark.skipif(not pairs_bf16.PAIRS, reason="this CPU has no AVX512-BF16")


@njit
def _takes(x, weight):
    return pairs_bf16.takes_pairs(x, weight)


def _bits(rows, cols, generator):
    return torch.randn(rows, cols, generator=generator).to(torch.bfloat16)


def test_only_bfloat16_of_four_rows_or_more_takes_the_pairs():
    generator = torch.Generator().manual_seed(0)
    weight = _bits(8, 64, generator)
    for rows, want in ((1, False), (3, False), (4, pairs_bf16.PAIRS), (40, pairs_bf16.PAIRS)):
        assert _takes(host_view(_bits(rows, 64, generator)), host_view(weight)) is want
    assert _takes(np.zeros((8, 64), np.float32), np.zeros((8, 64), np.float32)) is False


@needs_pairs
@settings(max_examples=40, deadline=None)
@given(rows=st.integers(4, 70), k=st.integers(1, 6).map(lambda m: 32 * m) | st.integers(1, 200),
       n=st.integers(1, 60), residual=st.booleans(), seed=st.integers(0, 2**16))
def test_pairs_give_the_product_rounded_as_transformers_rounds_it(rows, k, n, residual, seed):
    """Whole fours of rows and weight rows, the rest of each (an overlapping block, one weight row at a time) and
    columns past the last whole 32: the product, then its sum with the residual, each rounded to bfloat16."""
    generator = torch.Generator().manual_seed(seed)
    x, weight, added = _bits(rows, k, generator), _bits(n, k, generator), _bits(rows, n, generator)
    got = streamed_linear(x, host_view(weight), added if residual else None)
    product = F.linear(x.double(), weight.double()).to(torch.bfloat16)     # (T, N), the exact sum rounded once
    want = (product + added) if residual else product
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=1.6e-2, atol=1e-2)


@needs_pairs
def test_pairs_and_the_widening_loop_compute_the_same_products():
    """The rows of a step of 12 (pairs) against each row alone (the widening loop): equal up to one rounding."""
    generator = torch.Generator().manual_seed(1)
    x, weight = _bits(12, 576, generator), _bits(96, 576, generator)
    together = streamed_linear(x, host_view(weight)).float()
    alone = torch.cat([streamed_linear(x[t:t + 1], host_view(weight)) for t in range(12)]).float()
    torch.testing.assert_close(together, alone, rtol=8e-3, atol=1e-3)
    assert (together == alone).float().mean() > 0.9                       # most sums round the same way
