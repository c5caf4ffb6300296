"""The weight-first matrix product: the same result as F.linear for every row count and thread count."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch.engine.models.linear import SMALL_BATCH_ROWS, linear


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(0, SMALL_BATCH_ROWS + 8), k=st.integers(1, 80), n=st.integers(1, 120),
       threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))
def test_matches_f_linear(rows, k, n, threads, seed):
    generator = torch.Generator().manual_seed(seed)
    x, weight = torch.randn(rows, k, generator=generator), torch.randn(n, k, generator=generator)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = linear(x, weight)
    finally:
        torch.set_num_threads(before)
    assert out.shape == (rows, n)
    torch.testing.assert_close(out, F.linear(x, weight), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 2, SMALL_BATCH_ROWS, SMALL_BATCH_ROWS + 1])
def test_rows_of_a_batch_do_not_see_each_other(rows):
    """Row i of the output depends on row i of the input only (the zero padding row included)."""
    weight = torch.randn(48, 16)
    x = torch.randn(rows, 16)
    alone = torch.cat([linear(x[i:i + 1], weight) for i in range(rows)])
    torch.testing.assert_close(linear(x, weight), alone, rtol=1e-5, atol=1e-5)


def test_bfloat16_keeps_its_dtype():
    x, weight = torch.randn(3, 8, dtype=torch.bfloat16), torch.randn(5, 8, dtype=torch.bfloat16)
    assert linear(x, weight).dtype == torch.bfloat16
