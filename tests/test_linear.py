"""Every matrix-product path of `Linear`: the same result as F.linear for every shape, row count and thread count."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch.engine.kernels.bfloat16 import host_view
from minibatch.engine.kernels.gemv_blocks_cpu import CHUNKED_ROWS
from minibatch.engine.kernels.gemv_cpu import K_CHUNK, STREAM_ROWS, streamed_linear
from minibatch.engine.models.linear import (PATHS, SMALL_BATCH_ROWS, TILE_STREAM_ROWS, Linear, best_path, linear,
                                           onednn_supports, streamed_rows)

CPU_PATHS = [p for p in PATHS if p != "onednn" or onednn_supports(torch.zeros(1, 1))]


@settings(max_examples=60, deadline=None)
@given(path=st.sampled_from(CPU_PATHS), rows=st.integers(0, SMALL_BATCH_ROWS + 8), k=st.integers(1, 80),
       n=st.integers(1, 120), threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))
def test_every_path_matches_f_linear(path, rows, k, n, threads, seed):
    generator = torch.Generator().manual_seed(seed)
    x, weight = torch.randn(rows, k, generator=generator), torch.randn(n, k, generator=generator)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = Linear(weight, path)(x)
    finally:
        torch.set_num_threads(before)
    assert out.shape == (rows, n)
    torch.testing.assert_close(out, F.linear(x, weight), rtol=1e-5, atol=1e-5)


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(0, 70), k=st.integers(1, 80), n=st.integers(1, 120), seed=st.integers(0, 2**16))
def test_weight_first_function_matches_f_linear(rows, k, n, seed):
    generator = torch.Generator().manual_seed(seed)
    x, weight = torch.randn(rows, k, generator=generator), torch.randn(n, k, generator=generator)
    torch.testing.assert_close(linear(x, weight), F.linear(x, weight), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", CPU_PATHS)
@pytest.mark.parametrize("rows", [1, 2, SMALL_BATCH_ROWS, SMALL_BATCH_ROWS + 1])
def test_rows_of_a_batch_do_not_see_each_other(path, rows):
    """Row i of the output depends on row i of the input only (the zero padding row included)."""
    product = Linear(torch.randn(48, 16), path)
    x = torch.randn(rows, 16)
    alone = torch.cat([product(x[i:i + 1]) for i in range(rows)])
    torch.testing.assert_close(product(x), alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", [p for p in PATHS if p != "onednn" or onednn_supports(torch.zeros(1, 1).bfloat16())])
def test_bfloat16_keeps_its_dtype_and_value(path):
    x, weight = torch.randn(3, 8, dtype=torch.bfloat16), torch.randn(5, 8, dtype=torch.bfloat16)
    out = Linear(weight, path)(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), F.linear(x.float(), weight.float()), rtol=2e-2, atol=2e-2)


def test_the_default_path_is_onednn_on_a_cpu_that_has_it_and_the_plain_paths_elsewhere():
    weight = torch.randn(4, 4)
    assert best_path(weight) == ("onednn" if torch.backends.mkldnn.is_available() else "weight-first")
    assert best_path(weight.to(torch.float16)) == "weight-first"          # oneDNN is asked for fp32 and bf16 only
    assert best_path(torch.randn(4, 4, device="meta")) == "f.linear"


def test_a_path_that_does_not_exist_or_cannot_run_is_refused_by_name():
    with pytest.raises(ValueError, match="path='fast'.*onednn"):
        Linear(torch.randn(4, 4), "fast")
    with pytest.raises(ValueError, match="path='onednn' is not allowed for a torch.float16"):
        Linear(torch.randn(4, 4, dtype=torch.float16), "onednn")


@settings(max_examples=40, deadline=None)
@given(path=st.sampled_from(CPU_PATHS), rows=st.integers(0, STREAM_ROWS + 2), k=st.integers(1, 300),
       n=st.integers(1, 200), seed=st.integers(0, 2**16))
def test_add_to_adds_the_residual_on_every_path_and_row_count(path, rows, k, n, seed):
    """Up to STREAM_ROWS rows go through the streamed loop, which adds the residual as it writes; more rows do not."""
    generator = torch.Generator().manual_seed(seed)
    x, weight = torch.randn(rows, k, generator=generator), torch.randn(n, k, generator=generator)
    residual = torch.randn(rows, n, generator=generator)
    out = Linear(weight, path).add_to(residual, x)
    torch.testing.assert_close(out, residual + F.linear(x, weight), rtol=1e-5, atol=1e-4)


def test_a_few_fp32_or_bf16_rows_are_streamed_and_other_dtypes_are_not(monkeypatch):
    import minibatch.engine.models.linear as linear_module
    calls = []
    streamed = linear_module.streamed_linear
    monkeypatch.setattr(linear_module, "streamed_linear", lambda *a: calls.append(a[0].shape[0]) or streamed(*a))
    product = Linear(torch.randn(6, 4))
    counts = (1, 2, 3, 8, STREAM_ROWS, STREAM_ROWS + 1, 2 * STREAM_ROWS)
    for rows in counts:
        product(torch.randn(rows, 4))
    assert calls == [r for r in counts if r <= STREAM_ROWS] and STREAM_ROWS + 1 not in calls
    assert Linear(torch.randn(6, 4, dtype=torch.float16), "weight-first").streamed is None
    assert Linear(torch.randn(6, 4, dtype=torch.bfloat16), "weight-first").streamed.dtype == np.uint16  # its bits


@pytest.mark.parametrize("amx", [False, True])
def test_bfloat16_products_leave_the_loop_above_a_few_rows_only_where_oneDNN_has_tiles(monkeypatch, amx):
    import minibatch.engine.models.linear as linear_module
    monkeypatch.setattr(linear_module, "AMX_BF16", amx)
    bf16, fp32, fp16 = (torch.zeros(6, 4, dtype=d) for d in (torch.bfloat16, torch.float32, torch.float16))
    assert streamed_rows(bf16, "onednn") == (TILE_STREAM_ROWS if amx else STREAM_ROWS)
    assert streamed_rows(bf16, "weight-first") == streamed_rows(fp32, "onednn") == STREAM_ROWS
    assert streamed_rows(fp16, "weight-first") == 0
    if onednn_supports(bf16):                                     # the product follows its limit
        calls = []
        streamed = linear_module.streamed_linear
        monkeypatch.setattr(linear_module, "streamed_linear", lambda *a: calls.append(a[0].shape[0]) or streamed(*a))
        weight = torch.randn(6, 4).bfloat16()
        product = Linear(weight)
        for rows in (1, TILE_STREAM_ROWS, TILE_STREAM_ROWS + 1, STREAM_ROWS):
            x = torch.randn(rows, 4).bfloat16()
            torch.testing.assert_close(product(x).float(), F.linear(x, weight).float(), rtol=2 ** -7, atol=1e-6)
        assert calls == ([1, TILE_STREAM_ROWS] if amx else [1, TILE_STREAM_ROWS, TILE_STREAM_ROWS + 1, STREAM_ROWS])


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 8, 11, 13, 30])
def test_the_streamed_loop_in_bfloat16_rounds_the_product_then_its_sum_with_the_residual(rows):
    """bfloat16 weights and rows, multiplied in float32 (each product of two bfloat16s is exact there) and
    rounded once, as oneDNN and MKL's bfloat16 products do; with a residual the sum is rounded again, as
    transformers' `residual + product` is."""
    generator = torch.Generator().manual_seed(rows)
    x, weight = (torch.randn(shape, generator=generator).bfloat16() for shape in ((rows, 77), (45, 77)))
    residual = torch.randn(rows, 45, generator=generator).bfloat16()
    product = Linear(weight, "weight-first")
    exact = F.linear(x.float(), weight.float())                                    # (T, N) in float32
    out, with_residual = product(x), product.add_to(residual, x)
    assert out.dtype == with_residual.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), exact.bfloat16().float(), rtol=2 ** -7, atol=1e-6)   # one step
    assert (out != exact.bfloat16()).float().mean() < 0.02            # only where the sum's order rounds the other way
    assert torch.equal(with_residual, residual + out)


@pytest.mark.parametrize("rows", [*range(1, 26), 63, 64])
def test_the_streamed_loop_at_every_grouping_of_rows(rows):
    """Up to BLOCK_ROWS rows go eight, then four, then one at a time; more in blocks of four rows by six weight
    rows (sixteen lanes), then four, then one (47 weight rows: a thread's task of 24, then 23: three sixes, a
    four, the last one alone), the rows four at a time, then one at a time, or two or three in a block
    overlapping the one before: every mix equals F.linear."""
    generator = torch.Generator().manual_seed(rows)
    x, weight = torch.randn(rows, 77, generator=generator), torch.randn(47, 77, generator=generator)
    residual = torch.randn(rows, 47, generator=generator)
    torch.testing.assert_close(streamed_linear(x, weight.numpy()), F.linear(x, weight), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(streamed_linear(x, weight.numpy(), residual), residual + F.linear(x, weight),
                               rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows", [5, 6, 7, 8, 11, 12, 19, 32, CHUNKED_ROWS, CHUNKED_ROWS + 2])
@pytest.mark.parametrize("width", [K_CHUNK + 1, 2 * K_CHUNK + 13, 3 * K_CHUNK])   # chunks, a tail, whole chunks
def test_rows_longer_than_a_chunk_are_summed_chunk_by_chunk_to_the_same_product(rows, width):
    """Over columns in chunks (so the rows of x stay in the first-level cache), the sums kept in float32 across
    chunks: eight rows of x at a time up to BLOCK_ROWS rows, above it blocks of four by four (one of them
    overlapping the one before where two or three rows are left, only their new rows counted) up to CHUNKED_ROWS
    rows, and more rows unchunked (with AVX-512, by six weight rows); the other rows and weight rows (70: tasks of
    24, 24 and 22) as before; bfloat16 rounded once at the end."""
    generator = torch.Generator().manual_seed(rows + width)
    x, weight = torch.randn(rows, width, generator=generator), torch.randn(70, width, generator=generator)
    residual = torch.randn(rows, 70, generator=generator)
    torch.testing.assert_close(streamed_linear(x, weight.numpy(), residual), residual + F.linear(x, weight),
                               rtol=1e-5, atol=2e-4)
    halves = [t.bfloat16() for t in (x, weight)]
    exact = F.linear(*(t.float() for t in halves))                                # (T, N) float32
    out = streamed_linear(halves[0], host_view(halves[1]))
    torch.testing.assert_close(out.float(), exact.bfloat16().float(), rtol=2 ** -7, atol=1e-5)   # one step
    assert (out != exact.bfloat16()).float().mean() < 0.02


def test_the_streamed_loop_reads_a_transposed_input_and_leaves_it_alone():
    x, weight = torch.randn(8, 2).t(), torch.randn(5, 8)                 # (2, 8), not contiguous
    before = x.clone()
    out = streamed_linear(x, weight.numpy())
    torch.testing.assert_close(out, F.linear(x, weight), rtol=1e-5, atol=1e-5)
    assert torch.equal(x, before)
