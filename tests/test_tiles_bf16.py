"""bfloat16 products on AMX tiles: the product rounded as transformers rounds it, for every row count a decode step
has, with and without the residual; the weight laid out as the tiles read it; taken for bfloat16 weights of whole
tiles on a CPU that has them, inside the compiled layer too."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from minibatch.engine.kernels import tiles_bf16
from minibatch.engine.kernels.bfloat16 import host_view
from minibatch.engine.ops.products import Product, bands

needs_tiles = pytest.mark.skipif(not tiles_bf16.TILES, reason="this CPU has no AMX bfloat16 tiles")


def _bfloat16(rows, cols, generator):
    return torch.randn(rows, cols, generator=generator).to(torch.bfloat16)


def test_the_layout_puts_each_weight_pair_where_a_tile_row_reads_it():
    """Tile of weight rows 16 j.. for step s is 16 rows (pairs p) of 64 bytes: word (p, n) holds columns 32 s + 2 p
    and 32 s + 2 p + 1 of weight row 16 j + n."""
    weight = np.arange(32 * 64, dtype=np.uint32).reshape(32, 64).astype(np.uint16)
    packed = tiles_bf16.pack(weight)
    assert packed.shape == weight.shape and packed.dtype == np.uint16
    words = packed.reshape(2, 2, 16, 16, 2)                              # (tile j, step s, pair p, row n, half)
    for j, step, pair, n in [(0, 0, 0, 0), (1, 1, 15, 15), (0, 1, 3, 7), (1, 0, 9, 2)]:
        row, column = 16 * j + n, 32 * step + 2 * pair
        assert tuple(words[j, step, pair, n]) == (weight[row, column], weight[row, column + 1])
    assert sorted(packed.ravel()) == sorted(weight.ravel())             # every value once


@needs_tiles
@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 70), k=st.integers(1, 20).map(lambda m: 32 * m), n=st.integers(1, 8).map(lambda m: 32 * m),
       residual=st.booleans(), seed=st.integers(0, 2**16))
def test_tiles_give_the_product_rounded_as_transformers_rounds_it(rows, k, n, residual, seed):
    """One group of 16 rows or two, several groups of 32, any whole number of tiles: the product, then its sum
    with the residual, each rounded to bfloat16."""
    generator = torch.Generator().manual_seed(seed)
    x, weight, added = _bfloat16(rows, k, generator), _bfloat16(n, k, generator), _bfloat16(rows, n, generator)
    got = tiles_bf16.tiled_linear(x, tiles_bf16.pack(host_view(weight)), added if residual else None)
    product = F.linear(x.double(), weight.double()).to(torch.bfloat16)  # (T, N), the exact sum rounded once
    want = (product + added) if residual else product
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
    torch.testing.assert_close(got.float(), want.float(), rtol=1.6e-2, atol=1e-2)


@needs_tiles
def test_a_wrong_layout_gives_a_wrong_product():
    """The check above can fail: the plain weight, not laid out in pairs, multiplies into something else."""
    generator = torch.Generator().manual_seed(3)
    x, weight = _bfloat16(8, 64, generator), _bfloat16(32, 64, generator)
    right = tiles_bf16.tiled_linear(x, tiles_bf16.pack(host_view(weight)))
    wrong = tiles_bf16.tiled_linear(x, host_view(weight).copy())
    torch.testing.assert_close(right.float(), F.linear(x.float(), weight.float()), rtol=1.6e-2, atol=1e-2)
    assert not torch.allclose(wrong.float(), right.float(), atol=0.1)


def test_bfloat16_weights_of_whole_tiles_take_the_tiles_where_the_cpu_has_them():
    fits, ragged = torch.zeros(64, 96, dtype=torch.bfloat16), torch.zeros(40, 96, dtype=torch.bfloat16)
    names = lambda w: [name for _, name in bands(w)]                    # noqa: E731
    if tiles_bf16.TILES:
        assert names(fits) == ["tiles", "onednn"] and bands(fits)[0][0] == 64
    else:
        assert "tiles" not in names(fits)
    assert "tiles" not in names(ragged)                                  # 40 rows: not whole tiles
    assert "tiles" not in names(torch.zeros(64, 96))                     # float32


@needs_tiles
def test_the_tiles_run_inside_a_compiled_layer():
    """A step of a few rows hands the compiled layer the tiles' operands, which it multiplies by."""
    from minibatch.engine.kernels.layer_cpu import Tiles
    product = Product(torch.randn(64, 96).to(torch.bfloat16))
    assert isinstance(product.operands(8), Tiles) and product.operands(65) is None
