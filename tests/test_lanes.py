"""The eight-lane vector vocabulary of the CPU kernels (`engine.kernels.lanes`), lane by lane against numpy."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit
from numba.core.errors import TypingError

from minibatch.engine.kernels.lanes import (
    LANES, exp8, floor8, fma8, lane, load8, max8, min8, pow2_8, prefetch, splat8, store8, sum8, sums8, zero8,
)


@njit
def _loaded(a, i, j):
    v = load8(a, i, j)
    return np.array([lane(v, k) for k in range(LANES)], dtype=np.float32)


@njit
def _fused(a, b, c):
    v = fma8(load8(a, 0, 0), load8(b, 0, 0), load8(c, 0, 0))
    return np.array([lane(v, k) for k in range(LANES)], dtype=np.float32)


@njit
def _reduced(a):
    """Row sums of a (8, 8) array two ways: sums8 of the eight rows, and sum8 of each row."""
    s = sums8(load8(a, 0, 0), load8(a, 1, 0), load8(a, 2, 0), load8(a, 3, 0),
              load8(a, 4, 0), load8(a, 5, 0), load8(a, 6, 0), load8(a, 7, 0))
    together = np.array([lane(s, k) for k in range(LANES)], dtype=np.float32)
    one_by_one = np.array([sum8(load8(a, k, 0)) for k in range(LANES)], dtype=np.float32)
    return together, one_by_one


@njit
def _zeros_after_prefetch(a):
    prefetch(a, a.shape[0] - 1, 0)                         # a hint: it changes no value
    z = zero8()
    return np.array([lane(z, k) for k in range(LANES)], dtype=np.float32)


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 5), extra=st.integers(0, 20), seed=st.integers(0, 2**16))
def test_load8_reads_eight_consecutive_values_of_a_row(rows, extra, seed):
    a = np.random.default_rng(seed).standard_normal((rows, LANES + extra)).astype(np.float32)
    i, j = rows - 1, extra                                 # the last eight values of the last row
    np.testing.assert_array_equal(_loaded(a, i, j), a[i, j:j + LANES])
    if extra:                                              # a view that starts one value in
        np.testing.assert_array_equal(_loaded(a[:, 1:], 0, 0), a[0, 1:1 + LANES])


def test_load8_follows_the_row_stride_of_a_view():
    a = np.arange(4 * 24, dtype=np.float32).reshape(4, 24)
    view = a[1:, 8:]                                       # rows 24 values apart, starting at column 8
    np.testing.assert_array_equal(_loaded(view, 2, 4), a[3, 12:20])


def test_fma8_multiplies_and_adds_lane_by_lane():
    a, b, c = (np.random.default_rng(k).standard_normal((1, LANES)).astype(np.float32) for k in range(3))
    np.testing.assert_allclose(_fused(a, b, c), a[0] * b[0] + c[0], rtol=1e-6, atol=1e-6)


def test_sums8_and_sum8_give_each_vectors_sum():
    a = np.random.default_rng(7).standard_normal((LANES, LANES)).astype(np.float32)
    together, one_by_one = _reduced(a)
    np.testing.assert_allclose(together, a.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(one_by_one, a.sum(axis=1), rtol=1e-5, atol=1e-5)
    exact = np.eye(LANES, dtype=np.float32) * np.arange(1, LANES + 1, dtype=np.float32)   # one non-zero per row
    assert _reduced(exact)[0].tolist() == list(range(1, LANES + 1))    # lane i holds row i's sum, in order


def test_prefetch_is_only_a_hint_and_zero8_is_zero():
    assert _zeros_after_prefetch(np.ones((3, LANES), np.float32)).tolist() == [0.0] * LANES


def test_load8_refuses_what_is_not_a_float32_matrix():
    with pytest.raises(TypingError):
        _loaded(np.zeros((2, LANES), np.float64), 0, 0)
    with pytest.raises(TypingError):
        _loaded(np.zeros(LANES, np.float32), 0, 0)


@njit
def _arithmetic(a, b, out):
    """Each row of out: one lanewise operation of a's and b's first rows (out must have 10 rows)."""
    x, y = load8(a, 0, 0), load8(b, 0, 0)
    store8(out, 0, 0, x + y)
    store8(out, 1, 0, x - y)
    store8(out, 2, 0, x * y)
    store8(out, 3, 0, max8(x, y))
    store8(out, 4, 0, min8(x, y))
    store8(out, 5, 0, floor8(x))
    store8(out, 6, 0, splat8(lane(y, 3)))
    store8(out, 7, 0, x / y)
    store8(out, 8, 0, pow2_8(floor8(x)))
    store8(out, 9, 0, exp8(x))


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_lanewise_operations_match_numpy(seed):
    rng = np.random.default_rng(seed)
    a = rng.uniform(-20, 20, (1, LANES)).astype(np.float32)
    b = rng.uniform(-20, 20, (1, LANES)).astype(np.float32)
    out = np.zeros((10, LANES), np.float32)
    _arithmetic(a, b, out)
    x, y = a[0], b[0]
    for row, expected in enumerate([x + y, x - y, x * y, np.maximum(x, y), np.minimum(x, y), np.floor(x),
                                    np.full(LANES, y[3]), x / y]):
        np.testing.assert_array_equal(out[row], expected)
    np.testing.assert_array_equal(out[8], np.exp2(np.floor(x)))            # exact: a power of two
    np.testing.assert_allclose(out[9], np.exp(x.astype(np.float64)), rtol=3e-7)


@njit
def _exp_rows(a, out):
    for i in range(a.shape[0]):
        store8(out, i, 0, exp8(load8(a, i, 0)))


def test_exp8_is_float32_exact_over_its_range_and_clamps_outside():
    x = np.linspace(-87.3, 88.0, 80_000, dtype=np.float32).reshape(-1, LANES)
    out = np.empty_like(x)
    _exp_rows(x, out)
    reference = np.exp(x.astype(np.float64))
    assert (np.abs(out - reference) / reference).max() < 3e-7            # a float32 ulp is 6e-8 to 1.2e-7
    edges = np.array([[-np.inf, -1000.0, 0.0, 1.0, 100.0, np.inf, -0.0, 88.0]], np.float32)
    got = np.empty_like(edges)
    _exp_rows(edges, got)
    assert got[0, 2] == 1.0 and got[0, 6] == 1.0
    np.testing.assert_allclose(got[0, 3], np.e, rtol=2e-7)
    assert 0 < got[0, 0] == got[0, 1] < 1.2e-38                       # clamped at -87.3: tiny, not 0
    assert got[0, 4] == got[0, 5] == got[0, 7] < np.inf               # clamped at 88: e ** 88, not inf


def test_store8_writes_eight_values_and_nothing_else():
    a = np.zeros((2, LANES + 4), np.float32)
    source = np.arange(1, LANES + 1, dtype=np.float32).reshape(1, LANES)

    @njit
    def copy_into(a, source):
        store8(a, 1, 2, load8(source, 0, 0))
    copy_into(a, source)
    expected = np.zeros_like(a)
    expected[1, 2:2 + LANES] = source[0]
    np.testing.assert_array_equal(a, expected)
