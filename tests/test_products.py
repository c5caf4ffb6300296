"""Every product routine of the one table (`engine/ops/products.py`): the same result as F.linear for every shape,
row count and thread count, and the table's bands."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch.engine.kernels.bfloat16 import host_view
from minibatch.engine.kernels.gemv_blocks_cpu import CHUNKED_ROWS
from minibatch.engine.kernels.gemv_cpu import K_CHUNK, streamed_linear
from minibatch.engine.ops import FastOps, ReferenceOps, crossover, products
from minibatch.engine.ops.crossover import STREAM_ROWS
from minibatch.engine.ops.products import ROUTINES, bands, onednn_supports
from minibatch.engine.ops.reference import TorchProduct

CPU_ROUTINES = [r for r in ("torch", "streamed", "onednn") if r != "onednn" or onednn_supports(torch.zeros(1, 1))]


def routine(name, weight):
    return ROUTINES[name](weight)


def product(kernels, weight):
    """The product a path builds for this weight at load."""
    return {"reference": ReferenceOps, "fast": FastOps}[kernels](None).product(weight)


@settings(max_examples=60, deadline=None)
@given(path=st.sampled_from(CPU_ROUTINES), rows=st.integers(0, STREAM_ROWS + 8), k=st.integers(1, 80),
       n=st.integers(1, 120), threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))
def test_every_routine_matches_f_linear(path, rows, k, n, threads, seed):
    generator = torch.Generator().manual_seed(seed)
    x, weight = torch.randn(rows, k, generator=generator), torch.randn(n, k, generator=generator)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = routine(path, weight)(x) if rows or path != "streamed" else F.linear(x, weight)
    finally:
        torch.set_num_threads(before)
    assert out.shape == (rows, n)
    torch.testing.assert_close(out, F.linear(x, weight), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernels", ["reference", "fast"])
@pytest.mark.parametrize("rows", [1, 2, STREAM_ROWS, STREAM_ROWS + 1])
def test_rows_of_a_batch_do_not_see_each_other(kernels, rows):
    """Row i of the output depends on row i of the input only, whichever band takes the rows."""
    product_ = product(kernels, torch.randn(48, 16))
    x = torch.randn(rows, 16)
    alone = torch.cat([product_(x[i:i + 1]) for i in range(rows)])
    torch.testing.assert_close(product_(x), alone, rtol=1e-5, atol=1e-5)


BF16_ROUTINES = [p for p in CPU_ROUTINES if p != "onednn" or onednn_supports(torch.zeros(1).bfloat16())]


@pytest.mark.parametrize("path", BF16_ROUTINES)
def test_bfloat16_keeps_its_dtype_and_value(path):
    x, weight = torch.randn(3, 8, dtype=torch.bfloat16), torch.randn(5, 8, dtype=torch.bfloat16)
    out = routine(path, weight)(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), F.linear(x.float(), weight.float()), rtol=2e-2, atol=2e-2)


def test_the_table_gives_each_weight_its_bands(monkeypatch):
    """reference: F.linear for every row count; fast: the streamed loop up to its crossover, then a GEMM;
    blocks: their own kernels; where oneDNN is missing, F.linear takes the rows above the loop."""
    from minibatch.engine.models.quantized import quantize_q8_0
    fp32 = torch.randn(64, 32)
    assert isinstance(product("reference", fp32), TorchProduct)
    assert isinstance(product("reference", quantize_q8_0(fp32)), TorchProduct)
    many = "onednn" if onednn_supports(fp32) else "torch"
    assert bands(fp32) == [(STREAM_ROWS, "streamed"), (products.ANY_ROWS, many)]
    assert bands(quantize_q8_0(fp32)) == [(products.ANY_ROWS, "blocks")]
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert bands(fp32) == [(STREAM_ROWS, "streamed"), (products.ANY_ROWS, "torch")]


def test_the_crossovers_are_measured_once_and_kept(tmp_path, monkeypatch):
    """bfloat16 weights and the float32 LM head get a crossover measured on the machine, once, then read from the
    cache file; float32 weights in a layer keep the loop up to STREAM_ROWS (their compiled layers)."""
    monkeypatch.setenv("MINIBATCH_CACHE", str(tmp_path))
    measured = []
    monkeypatch.setattr(crossover, "measure_crossover",
                        lambda dtype, shape, margin: measured.append((dtype, shape, margin)) or 16)
    assert crossover.streamed_rows(torch.bfloat16, "onednn") == 16
    assert crossover.streamed_rows(torch.bfloat16, "onednn") == 16 and len(measured) == 1   # from the cache file
    assert (tmp_path / "crossovers.json").exists()
    assert crossover.streamed_rows(torch.float32, "onednn") == STREAM_ROWS             # in a layer: a constant
    assert crossover.streamed_rows(torch.float32, "onednn", alone=True) == 16          # the LM head: measured
    assert crossover.streamed_rows(torch.float32, "onednn", alone=True) == 16
    assert crossover.streamed_rows(torch.bfloat16, "torch") == STREAM_ROWS             # no GEMM to hand rows to
    assert measured == [(torch.bfloat16, crossover.LAYER_SHAPE, crossover.MARGIN),
                        (torch.float32, crossover.HEAD_SHAPE, 1.0)]


def test_the_lm_head_alone_takes_its_own_bands(tmp_path, monkeypatch):
    """The LM head is built with alone=True, so its float32 product can leave the loop at its own crossover."""
    monkeypatch.setenv("MINIBATCH_CACHE", str(tmp_path))
    monkeypatch.setattr(crossover, "measure_crossover", lambda dtype, shape, margin: 8)
    fp32 = torch.randn(64, 32)
    many = "onednn" if onednn_supports(fp32) else "torch"
    want = 8 if many == "onednn" else STREAM_ROWS
    assert bands(fp32, alone=True) == [(want, "streamed"), (products.ANY_ROWS, many)]
    assert bands(fp32) == [(STREAM_ROWS, "streamed"), (products.ANY_ROWS, many)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_measured_crossover_is_one_of_the_candidates(dtype):
    if not onednn_supports(torch.zeros(1, dtype=dtype)):
        pytest.skip(f"oneDNN has no {dtype} here")
    assert crossover.measure_crossover(dtype, (256, 64), crossover.MARGIN, rounds=2) in crossover.CANDIDATES


@settings(max_examples=40, deadline=None)
@given(kernels=st.sampled_from(["reference", "fast"]), rows=st.integers(0, STREAM_ROWS + 2), k=st.integers(1, 300),
       n=st.integers(1, 200), seed=st.integers(0, 2**16))
def test_the_residual_is_added_on_every_path_and_row_count(kernels, rows, k, n, seed):
    """Up to STREAM_ROWS rows go through the streamed loop, which adds the residual as it writes; more rows do not."""
    generator = torch.Generator().manual_seed(seed)
    x, weight = torch.randn(rows, k, generator=generator), torch.randn(n, k, generator=generator)
    residual = torch.randn(rows, n, generator=generator)
    out = product(kernels, weight)(x, residual=residual)
    torch.testing.assert_close(out, residual + F.linear(x, weight), rtol=1e-5, atol=1e-4)


def test_a_few_rows_are_streamed_and_more_are_not(monkeypatch):
    calls = []
    streamed = products.streamed_linear
    monkeypatch.setattr(products, "streamed_linear", lambda *a: calls.append(a[0].shape[0]) or streamed(*a))
    fast = product("fast", torch.randn(6, 4))
    counts = (1, 2, 3, 8, STREAM_ROWS, STREAM_ROWS + 1, 2 * STREAM_ROWS)
    for rows in counts:
        fast(torch.randn(rows, 4))
    assert calls == [r for r in counts if r <= STREAM_ROWS]
    assert fast.operands(1) is not None and fast.operands(STREAM_ROWS + 1) is None
    assert product("fast", torch.randn(6, 4, dtype=torch.bfloat16)).routine(1).plain.dtype == np.uint16  # its bits
    assert product("reference", torch.randn(6, 4)).operands(1) is None      # the reference never compiles a layer


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 8, 11, 13, 30])
def test_the_streamed_loop_in_bfloat16_rounds_the_product_then_its_sum_with_the_residual(rows):
    """bfloat16 weights and rows, multiplied in float32 (each product of two bfloat16s is exact there) and
    rounded once, as oneDNN and MKL's bfloat16 products do; with a residual the sum is rounded again, as
    transformers' `residual + product` is."""
    generator = torch.Generator().manual_seed(rows)
    x, weight = (torch.randn(shape, generator=generator).bfloat16() for shape in ((rows, 77), (45, 77)))
    residual = torch.randn(rows, 45, generator=generator).bfloat16()
    product = routine("streamed", weight)
    exact = F.linear(x.float(), weight.float())                                    # (T, N) in float32
    out, with_residual = product(x), product(x, residual)
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
