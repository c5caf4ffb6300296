"""bfloat16 in the CPU kernels (`engine.kernels.bfloat16`, and `lanes.load8` / `store8` on uint16 bits): every
value read is the bfloat16's own value, every value stored is torch's rounding of the float32 (ties to even)."""
import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from minibatch.engine.kernels.bfloat16 import as_float32, as_stored, from_host, get, host_view, put
from minibatch.engine.kernels.lanes import LANES, load8, store8

FLOATS = st.floats(-2.0 ** 126, 2.0 ** 126, allow_nan=False, allow_infinity=False, width=32)


@njit
def _copy_by_values(a, out):
    """out[i, j] = a[i, j] through float32, one value at a time."""
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            put(out, (i, j), get(a, (i, j)))


@njit
def _copy_by_lanes(a, out):
    """The same, eight lanes at a time."""
    for i in range(a.shape[0]):
        for j in range(0, a.shape[1], LANES):
            store8(out, i, j, load8(a, i, j))


@njit
def _rounded(a, like):
    """as_stored(like, v) of each value of the 1-D float32 array a."""
    out = np.empty_like(a)
    for i in range(a.shape[0]):
        out[i] = as_stored(like, a[i])
    return out


@settings(max_examples=40, deadline=None)
@given(values=st.lists(FLOATS, min_size=2 * LANES, max_size=2 * LANES))
def test_stores_round_as_torch_rounds_and_loads_give_the_value(values):
    x = torch.tensor(values, dtype=torch.float32).reshape(2, LANES)
    for copy in (_copy_by_values, _copy_by_lanes):
        out = torch.empty(2, LANES, dtype=torch.bfloat16)
        copy(x.numpy(), host_view(out))                                 # float32 -> bfloat16: rounded
        assert torch.equal(out, x.bfloat16())
        back = torch.empty(2, LANES)
        copy(host_view(out), back.numpy())                             # bfloat16 -> float32: exact
        assert torch.equal(back, out.float())


def test_halfway_values_round_to_the_even_neighbour():
    step = 2.0 ** -7                                                     # bfloat16's step between 1 and 2
    halfway = torch.tensor([[1 + step / 2, 1 + 3 * step / 2, -(1 + step / 2), 2 + step] * 2])  # ties, and a step of 2
    out = torch.empty(1, LANES, dtype=torch.bfloat16)
    _copy_by_lanes(halfway.numpy(), host_view(out))
    assert out[0, :4].tolist() == [1.0, 1 + 2 * step, -1.0, 2.0] and torch.equal(out, halfway.bfloat16())


def test_as_stored_rounds_only_for_bfloat16_arrays():
    values = np.array([1 + 2.0 ** -9, 3.14159265, -1e-3], np.float32)
    assert np.array_equal(_rounded(values, np.zeros(1, np.float32)), values)
    expected = torch.from_numpy(values).bfloat16().float().numpy()
    assert np.array_equal(_rounded(values, np.zeros(1, np.uint16)), expected)


def test_host_views_share_memory_and_as_float32_widens_a_copy():
    t = torch.tensor([[1.5, -2.25], [3.0, 1e-3]], dtype=torch.bfloat16)
    bits = host_view(t)
    assert bits.dtype == np.uint16 and from_host(bits).data_ptr() == t.data_ptr()
    assert torch.equal(from_host(bits), t)
    widened = njit(lambda x: as_float32(x))(bits)
    assert widened.dtype == np.float32 and np.array_equal(widened, t.float().numpy())
    plain = np.ones((2, 2), np.float32)
    assert np.shares_memory(njit(lambda x: as_float32(x))(plain), plain)       # float32: x itself, no copy
    assert host_view(torch.from_numpy(plain)).dtype == np.float32
