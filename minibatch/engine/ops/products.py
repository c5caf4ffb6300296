"""The fast path's products: for every weight matrix, which routine multiplies how many rows, from one table.

A product multiplies the rows x (T, K) of a step by a weight (N, K) transposed, giving (T, N), and adds
the residual (T, N) where the layer adds one. The reference path does it with F.linear for any rows
(`ops.reference.TorchProduct`). On the fast path the routine depends on the weight (device, dtype, block
format) and on how many rows the step has; `bands` is that choice, written once, when the model loads:

    weight                       rows               routine    why
    float32 on a CPU             1 .. 64            streamed   each weight read once for all rows,
                                                               at memory speed; runs inside a compiled
                                                               decode layer
                                 more               onednn     a packed GEMM: prefill chunks are
                                                               compute-bound, where it is faster
    float32, the LM head         1 .. crossover     streamed   multiplied on its own, so nothing compiled
                                 more               onednn     to keep: the crossover is measured
    bfloat16 on a CPU with       1 .. 64            tiles      AMX's tiles multiply a few dozen rows as
    AMX tiles (whole tiles)                                    fast as the weight arrives; runs inside a
                                                               compiled decode layer
                                 more               onednn     prefill chunks, as above
    bfloat16 on another CPU      1 .. crossover     streamed   as above
                                 more               onednn     the crossover is measured on this
                                                               machine, once (`crossover`)
    q8_0 or q4_1 blocks          any                blocks     reads the blocks, never an fp32 copy

Where oneDNN is missing from torch's build, F.linear (`torch`) stands in for `onednn`. `Product` builds each routine
of its bands once (each keeps the weight in the form it reads) and picks the band for the rows it is given.
Measurements behind the bands: docs/performance.md, "Products and where each path wins".
"""
from __future__ import annotations

import torch

from minibatch.engine.kernels import quantized_numba, tiles_bf16
from minibatch.engine.kernels.bfloat16 import host_view
from minibatch.engine.kernels.gemv_cpu import streamed_linear
from minibatch.engine.kernels.layer_cpu import Q4_1Blocks, Q8_0Blocks, Streamed, Tiles
from minibatch.engine.models.quantized import QuantizedWeight
from minibatch.engine.ops.crossover import STREAM_ROWS, streamed_rows
from minibatch.engine.ops.reference import TorchProduct, describe

ANY_ROWS = float("inf")


class StreamedProduct:
    """The streamed loop (`kernels.gemv_cpu`) over the plain weight, float32 or bfloat16 as its bits."""

    def __init__(self, weight: torch.Tensor):
        self.plain = host_view(weight.detach().contiguous())                # (N, K) numpy view

    def __call__(self, x, residual=None):
        return streamed_linear(x, self.plain, residual)

    def operands(self, rows: int):
        return Streamed(self.plain)


class TilesProduct:
    """AMX's tiles (`kernels.tiles_bf16`) over the bfloat16 weight laid out in pairs once, at load."""

    def __init__(self, weight: torch.Tensor):
        self.packed = tiles_bf16.pack(host_view(weight.detach().contiguous()))    # (N, K) bits in tile order

    def __call__(self, x, residual=None):
        return tiles_bf16.tiled_linear(x, self.packed, residual)

    def operands(self, rows: int):
        return Tiles(self.packed)


class OneDNNProduct:
    """oneDNN's GEMM over the weight reordered once, at load, into its blocked layout."""

    def __init__(self, weight: torch.Tensor):
        self.out_features = weight.shape[0]
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)

    def __call__(self, x, residual=None):
        if x.shape[0] == 0:
            return x.new_empty(0, self.out_features)
        if residual is None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
        return torch.ops.mkldnn._linear_pointwise(x, residual, self.packed, None, "add")

    def operands(self, rows: int):
        return None                                                         # not run inside a compiled layer


class BlocksProduct:
    """The Numba kernels over q8_0 or q4_1 blocks (`kernels.quantized_numba`), which read only the blocks."""

    def __init__(self, weight: QuantizedWeight):
        parts = (weight.codes, weight.scales) + (() if weight.mins is None else (weight.mins,))
        self.format = weight.format
        self.arrays = quantized_numba.host_arrays(*parts)                   # the file's order, then row groups
        self.matmul = getattr(quantized_numba, f"{weight.format}_matmul")

    def __call__(self, x, residual=None):
        out = self.matmul(x, *self.arrays)                                  # (T, N)
        return out if residual is None else residual + out

    def operands(self, rows: int):
        plain = 2 if self.format == "q8_0" else 3                           # codes, scales[, mins]; then groups
        kind = Q8_0Blocks if self.format == "q8_0" else Q4_1Blocks
        return kind(*self.arrays[:plain], quantized_numba.BLOCK, *self.arrays[plain:])


ROUTINES = {"torch": TorchProduct, "streamed": StreamedProduct, "tiles": TilesProduct, "onednn": OneDNNProduct,
            "blocks": BlocksProduct}


def onednn_supports(weight: torch.Tensor) -> bool:
    """Whether oneDNN runs products of this weight's dtype on this machine's CPU."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return weight.dtype == torch.float32


def bands(weight, alone: bool = False) -> list[tuple[float, str]]:
    """The table above for one weight: [(up to this many rows, routine name), ...], rows ascending.
    alone: the weight is multiplied on its own, never inside a compiled layer (the LM head)."""
    if isinstance(weight, QuantizedWeight):
        return [(ANY_ROWS, "blocks")]
    many = "onednn" if onednn_supports(weight) else "torch"
    if takes_tiles(weight):
        return [(STREAM_ROWS, "tiles"), (ANY_ROWS, many)]
    return [(streamed_rows(weight.dtype, many, alone), "streamed"), (ANY_ROWS, many)]


def takes_tiles(weight) -> bool:
    """Whether AMX's tiles multiply this weight: bfloat16 on a CPU that has them, in whole tiles."""
    return (tiles_bf16.TILES and weight.device.type == "cpu" and weight.dtype == torch.bfloat16
            and tiles_bf16.fits(weight.shape))


class Product:
    """A weight (N, K) and its product by x (T, K): `product(x)` or `product(x, residual=r)`, (T, N).
    alone: multiplied on its own, never inside a compiled layer (the LM head)."""

    def __init__(self, weight, alone: bool = False):
        self.shape, self.format, self.weight_bytes = describe(weight)
        built = {}
        self.bands = [(rows, built.setdefault(name, ROUTINES[name](weight))) for rows, name in bands(weight, alone)]

    def routine(self, rows: int):
        """The routine that multiplies `rows` rows."""
        return next(routine for most, routine in self.bands if rows <= most)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        return self.routine(x.shape[0])(x, residual)

    def operands(self, rows: int):
        """What the compiled decode layer multiplies by at `rows` rows, or None where another routine runs."""
        return self.routine(rows).operands(rows) if 0 < rows <= STREAM_ROWS else None

    def numel(self) -> int:
        return self.shape.numel()

    def nbytes(self) -> int:
        """Bytes one product reads from the weight, in its storage format."""
        return self.weight_bytes

    def __repr__(self):
        names = ", ".join(f"{type(r).__name__[:-7].lower()} up to {rows} rows" for rows, r in self.bands)
        return f"Product({tuple(self.shape)}, {self.format}: {names})"
