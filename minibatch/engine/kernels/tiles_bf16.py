"""bfloat16 products on AMX tiles, for decode steps of up to a few dozen rows, on CPUs that have them (Numba).

    out[t, n] = sum_k x[t, k] * weight[n, k]      x (T, K) and weight (N, K) as bfloat16 bits

Past a few rows a bfloat16 step is bound by its arithmetic, not its memory: every weight is multiplied into
every row. An Intel CPU with AMX has eight tile registers of up to 16 rows of 64 bytes and an instruction,
`tdpbf16ps`, that multiplies a tile of 16 rows of 32 bfloat16s by a tile of 32 x 16 bfloat16s into a tile of
16 x 16 float32 sums: 8,192 multiply-adds in one instruction, many times what the pairs of `kernels.pairs_bf16`
reach. Its products of two bfloat16s are exact and its sums float32, as in the other loops, so only the
order of the additions differs.

The weight must be laid out in pairs: row r of a weight tile holds, for each of 16 weight rows, its columns
2r and 2r + 1 side by side (`pack`, once, at load). Each task takes 32 weight rows (two weight tiles) and,
for every 32 rows of x (two tiles of x), four tiles of sums: for each 32 columns it loads the two tiles of
x and the two of the weight and makes four products, while it asks the memory for the same tiles of the
next task (the thread's next: the parallel loop hands each thread a contiguous share). The sums are stored
to a scratch block and each rounded to bfloat16, then added to the residual (rounded again) where the layer
adds one, as transformers rounds. A tile's shape is set per thread (`ldtilecfg`), so each task sets it for
the rows it multiplies.

The tiles are driven through LLVM's AMX intrinsics, the tile numbers part of each instruction (one Numba
intrinsic per tile). Linux hands the tiles' state only to a process that asks (`arch_prctl`), which this
module does on import where the CPU has them; `TILES` says whether it may use them. `ops.products` takes
this loop for bfloat16 weights of whole tiles (N and K multiples of 32) up to STREAM_ROWS rows, inside the
compiled layer. Measurements: docs/performance.md, section "bfloat16".
"""
from __future__ import annotations

import ctypes
import sys

import numpy as np
import torch
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from minibatch.engine.kernels import bfloat16, lanes
from minibatch.engine.kernels.bfloat16 import get, host_view, put
from minibatch.engine.kernels.lanes import prefetch
from minibatch.engine.kernels.stale_cache import forget_stale
from minibatch.engine.numba_target import AMX_BF16

TILE_ROWS, TILE_BYTES = 16, 64          # a tile: at most 16 rows of 64 bytes (32 bfloat16s or 16 float32s)
STEP = 32                               # columns (bfloat16s) of x one tile holds: the product's step along K
BLOCK = 2 * TILE_ROWS                   # weight rows a task takes, and rows of x per group of sums tiles
ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA, SYS_ARCH_PRCTL = 0x1023, 18, 158   # Linux: ask for the tiles' state
_BYTE, _INT64 = ir.IntType(8), ir.IntType(64)
_ADDRESS = _BYTE.as_pointer()


def _ask_for_tiles() -> bool:
    """Whether the compiled code has AMX's bfloat16 tiles and Linux lets this process use them (elsewhere: no)."""
    if not (AMX_BF16 and sys.platform.startswith("linux")):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):                               # no C library's syscall to call
        return False


TILES = _ask_for_tiles()


def _call(builder, name, argument_types, arguments):
    function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), argument_types), name)
    builder.call(function, arguments)


def _address(context, builder, array_type, array, offset=None, offset_type=None):
    """The address of a contiguous array's first byte, or of its byte `offset`."""
    data = builder.bitcast(context.make_array(array_type)(context, builder, array).data, _ADDRESS)
    if offset is None:
        return data
    return builder.gep(data, [context.cast(builder, offset, offset_type, types.int64)])


@intrinsic
def configure(typingctx, config):
    """Set this thread's tiles' shapes from `config` (64 bytes: palette 1, each tile's bytes per row and rows)."""
    def codegen(context, builder, sig, args):
        _call(builder, "llvm.x86.ldtilecfg", [_ADDRESS], [_address(context, builder, sig.args[0], args[0])])
        return context.get_dummy_value()
    return types.void(config), codegen


@intrinsic
def release(typingctx):
    """Give this thread's tiles back (their state returns to its initial form, cheap to save)."""
    def codegen(context, builder, sig, args):
        _call(builder, "llvm.x86.tilerelease", [], [])
        return context.get_dummy_value()
    return types.void(), codegen


def _zero(tile: int):
    @intrinsic
    def zero(typingctx):
        """Tile `tile` set to zeros."""
        def codegen(context, builder, sig, args):
            _call(builder, "llvm.x86.tilezero", [_BYTE], [ir.Constant(_BYTE, tile)])
            return context.get_dummy_value()
        return types.void(), codegen
    return zero


def _move(name: str, tile: int):
    @intrinsic
    def move(typingctx, array, offset, stride):
        """Tile `tile`'s rows loaded from, or stored to, an array's bytes offset, offset + stride, ..."""
        def codegen(context, builder, sig, args):
            address = _address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            _call(builder, name, [_BYTE, _ADDRESS, _INT64],
                  [ir.Constant(_BYTE, tile), address, context.cast(builder, args[2], sig.args[2], types.int64)])
            return context.get_dummy_value()
        return types.void(array, offset, stride), codegen
    return move


def _product(sums: int, rows: int, columns: int):
    @intrinsic
    def product(typingctx):
        """Tile `sums` (float32) += tile `rows` (bfloat16) times tile `columns` (bfloat16 in pairs): one tdpbf16ps."""
        def codegen(context, builder, sig, args):
            _call(builder, "llvm.x86.tdpbf16ps", [_BYTE] * 3, [ir.Constant(_BYTE, t) for t in (sums, rows, columns)])
            return context.get_dummy_value()
        return types.void(), codegen
    return product


# Tiles 0-3: sums (rows 0-15 or 16-31 of x by weight rows 0-15 or 16-31); 4-5: rows of x; 6-7: weight in pairs.
zero0, zero1, zero2, zero3 = (_zero(t) for t in range(4))
store0, store1, store2, store3 = (_move("llvm.x86.tilestored64", t) for t in range(4))
load4, load5, load6, load7 = (_move("llvm.x86.tileloadd64", t) for t in range(4, 8))
product0, product1, product2, product3 = (_product(s, r, c) for s, r, c in ((0, 4, 6), (1, 4, 7), (2, 5, 6), (3, 5, 7)))


def fits(weight_shape) -> bool:
    """Whether a weight (N, K) is whole tiles: N a multiple of 32 rows, K of 32 columns."""
    return weight_shape[0] % BLOCK == 0 and weight_shape[1] % STEP == 0


def pack(weight_bits: np.ndarray) -> np.ndarray:
    """A weight (N, K) of bfloat16 bits laid out as the tiles read it, still (N, K): each 16 rows, 16 weight rows,
    hold for each 32-column step a tile of 16 rows (column pairs) of the 16 weight rows' pairs, one after another."""
    rows, columns = weight_bits.shape
    words = np.ascontiguousarray(weight_bits).view(np.uint32)                     # (N, K / 2) column pairs
    tiles = words.reshape(rows // TILE_ROWS, TILE_ROWS, columns // STEP, TILE_ROWS)  # (N/16, n, step, pair)
    packed = np.ascontiguousarray(tiles.transpose(0, 2, 3, 1))                    # (N/16, step, pair, n)
    return packed.reshape(rows, columns // 2).view(np.uint16)                     # (N, K) bits in tile order


@njit(inline="always")
def shapes(config, rows_a, rows_b):
    """config (64,) uint8 set for `configure`: tiles of sums and of x with rows_a rows (the first group of 16
    rows of x) or rows_b (the second; 0 if none), the weight's tiles 16 rows (pairs) of 64 bytes."""
    config[:] = 0
    config[0] = 1                                          # palette 1
    for tile in range(8):
        config[16 + 2 * tile] = TILE_BYTES                 # bytes per row (little-endian uint16)
    config[48 + 0], config[48 + 1] = rows_a, rows_a        # sums of the first rows
    config[48 + 2], config[48 + 3] = rows_b, rows_b        # sums of the second rows
    config[48 + 4], config[48 + 5] = rows_a, rows_b        # x's two tiles
    config[48 + 6], config[48 + 7] = TILE_ROWS, TILE_ROWS  # the weight's two tiles
    if rows_b == 0:                                        # a tile of no rows is left unconfigured
        for tile in (2, 3, 5):
            config[16 + 2 * tile] = 0


@njit(inline="always")
def _ask_ahead(words, first_tile, weight_row_bytes, k):
    """Ask for step k's two weight tiles of the task whose first tile starts at byte first_tile (if there is one);
    words: the packed weight as one row of bits, (1, N K)."""
    ahead = first_tile + k * TILE_ROWS * TILE_BYTES
    if ahead + weight_row_bytes < 2 * words.shape[1]:
        for line in range(0, TILE_ROWS * TILE_BYTES, TILE_BYTES):
            prefetch(words, 0, (ahead + line) // 2)
            prefetch(words, 0, (ahead + weight_row_bytes + line) // 2)


@njit(nogil=True, cache=True)
def _task(x_bytes, x_stride, rows, packed_bytes, weight_row_bytes, block, residual, add_residual, out, config, sums):
    """out[:, 32 block : 32 block + 32] = x . weight rows 32 block .. + 31 (+ residual): every 32 rows of x, four
    tiles of sums over the K / 32 steps; config (64,) uint8 and sums (4, 16, 16) float32 are this task's scratch."""
    steps = x_stride // TILE_BYTES
    first_tile = 2 * block * weight_row_bytes              # byte of weight tile row 2 block of packed
    sums_bytes = sums.reshape(-1).view(np.uint8)
    words = packed_bytes.view(np.uint16).reshape(1, -1)     # (1, N K): what `prefetch` takes
    for group in range(0, rows, BLOCK):
        rows_a = min(TILE_ROWS, rows - group)
        rows_b = min(TILE_ROWS, max(0, rows - group - TILE_ROWS))
        shapes(config, rows_a, rows_b)
        configure(config)
        zero0()
        zero1()
        first_x = group * x_stride
        if rows_b > 0:
            zero2()
            zero3()
            for k in range(steps):
                if group == 0:                             # the next task's weight tiles, asked for meanwhile
                    _ask_ahead(words, first_tile + 2 * weight_row_bytes, weight_row_bytes, k)
                load4(x_bytes, first_x + k * TILE_BYTES, x_stride)
                load5(x_bytes, first_x + TILE_ROWS * x_stride + k * TILE_BYTES, x_stride)
                load6(packed_bytes, first_tile + k * TILE_ROWS * TILE_BYTES, TILE_BYTES)
                load7(packed_bytes, first_tile + weight_row_bytes + k * TILE_ROWS * TILE_BYTES, TILE_BYTES)
                product0()
                product1()
                product2()
                product3()
            store2(sums_bytes, 2 * TILE_ROWS * TILE_BYTES, TILE_BYTES)
            store3(sums_bytes, 3 * TILE_ROWS * TILE_BYTES, TILE_BYTES)
        else:
            for k in range(steps):
                if group == 0:                             # the next task's weight tiles, asked for meanwhile
                    _ask_ahead(words, first_tile + 2 * weight_row_bytes, weight_row_bytes, k)
                load4(x_bytes, first_x + k * TILE_BYTES, x_stride)
                load6(packed_bytes, first_tile + k * TILE_ROWS * TILE_BYTES, TILE_BYTES)
                load7(packed_bytes, first_tile + weight_row_bytes + k * TILE_ROWS * TILE_BYTES, TILE_BYTES)
                product0()
                product1()
        store0(sums_bytes, 0, TILE_BYTES)
        store1(sums_bytes, TILE_ROWS * TILE_BYTES, TILE_BYTES)
        for i in range(rows_a + rows_b):                   # sums tile 2 (i // 16) + (j // 16), row i % 16
            t = group + i
            for j in range(BLOCK):
                n = BLOCK * block + j
                put(out, (t, n), sums[2 * (i // TILE_ROWS) + j // TILE_ROWS, i % TILE_ROWS, j % TILE_ROWS])
                if add_residual:                           # the product rounded, then its sum with the residual
                    put(out, (t, n), get(out, (t, n)) + get(residual, (t, n)))
    release()


@njit(parallel=True, nogil=True, cache=True)
def _tiles_product(x, packed, residual, add_residual, out):
    """out (T, N) = x (T, K) . weight (N, K)^T, plus residual (T, N) if add_residual, bfloat16 bits, the weight
    packed (`pack`); each thread takes tasks of 32 weight rows (`_task`, compiled and cached on its own)."""
    rows, num_outputs = x.shape[0], packed.shape[0]
    x_bytes = x.reshape(-1).view(np.uint8)
    packed_bytes = packed.reshape(-1).view(np.uint8)
    x_stride = x.shape[1] * 2                              # bytes of one row of x
    weight_row_bytes = TILE_ROWS * packed.shape[1] * 2     # bytes of 16 weight rows in pairs
    for block in prange(num_outputs // BLOCK):
        config = np.empty(64, np.uint8)
        sums = np.empty((4, TILE_ROWS, TILE_ROWS), np.float32)
        _task(x_bytes, x_stride, rows, packed_bytes, weight_row_bytes, block, residual, add_residual, out, config,
              sums)


forget_stale(_task, (bfloat16, lanes))                  # the files each compiles in
forget_stale(_tiles_product, (bfloat16, lanes))


def tiled_linear(x: torch.Tensor, packed: np.ndarray, residual: torch.Tensor | None = None) -> torch.Tensor:
    """x (T, K) bfloat16 times the weight (N, K) packed by `pack`, transposed, plus residual (T, N) if given: (T, N)."""
    out = x.new_empty(x.shape[0], packed.shape[0])
    add = residual is not None
    if x.shape[0]:
        _tiles_product(host_view(x.contiguous()), packed, host_view(residual.contiguous()) if add else host_view(out),
                       add, host_view(out))
    return out
