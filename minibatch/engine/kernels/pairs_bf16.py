"""bfloat16 products pair by pair, 32 multiplications in one instruction, on CPUs with AVX512-BF16 (Numba).

    out[t, n] = sum_k x[t, k] * weight[n, k]      x (T, K) and weight (N, K) as bfloat16 bits, T >= 4

The streamed loop (`kernels.gemv_cpu`) widens each bfloat16 to a float32 and multiplies in float32:
half the bytes of float32 for the same arithmetic. Past a few rows that arithmetic, not the memory, is
the limit (each weight is multiplied into every row), so bfloat16 is no faster than float32 there. A
CPU with AVX512-BF16 has an instruction for exactly this product (`vdpbf16ps`): it takes 32 bfloat16s
of a row of x and 32 of a weight row, multiplies them pair by pair and adds each two neighbouring
products into one of sixteen float32 sums. One instruction does the work of two sixteen-lane multiply-
adds and of the widening before them; the products of two bfloat16s are exact in float32 and the sums
stay float32, as in the widening loop, so only the order of the additions differs.

`pairs(acc, a, i, j, b, k, l)` is that instruction: acc (sixteen float32 lanes) plus the pairwise
products of a[i, j:j+32] and b[k, l:l+32]. `pairs_product` is the loop around it, the one idea here:
blocks of four rows of x by four weight rows (`_block`), sixteen running sums, eight rows of 64 bytes
loaded for sixteen instructions; the last rows of x, if not a whole four, in a block that overlaps the
one before (the same sums written twice); the task's last weight rows, if not a whole four, one at a
time (`_block_of_one`); the columns past the last whole 32, if any, one by one.

`PAIRS` says whether the compiled code has the instruction (`engine.numba_target`); `gemv_cpu` takes
this loop only then, for four rows or more (`takes_pairs`): below, the memory is the limit and the widening
loop reads as fast. Measurements: docs/performance.md, section "bfloat16".
"""
from __future__ import annotations

from llvmlite import ir
from llvmlite.ir.types import _BaseFloatType
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from minibatch.engine.kernels import bfloat16, gemv_blocks_cpu, lanes, lanes16
from minibatch.engine.kernels.bfloat16 import get, put
from minibatch.engine.kernels.gemv_blocks_cpu import PREFETCH_AHEAD, _ask, _rest, spread
from minibatch.engine.kernels.lanes import lane, prefetch, round_to_bfloat16, sums8, zero8
from minibatch.engine.kernels.lanes16 import float32x16, fold16, zero16
from minibatch.engine.kernels.stale_cache import forget_stale
from minibatch.engine.numba_target import AVX512_BF16

PAIRS = AVX512_BF16     # does the compiled code have vdpbf16ps?
PAIR_LANES = 32         # bfloat16s of a row one instruction reads (64 bytes: one cache line)
TASK_ROWS = 24          # weight rows a thread takes at a time (six blocks)


class _BFloat(_BaseFloatType):
    """LLVM's bfloat type, which the instruction's intrinsic takes (llvmlite has no name for it)."""
    null = "0.0"
    intrinsic_name = "bf16"

    def __str__(self):
        return "bfloat"


_BFloat._create_instance()
_PAIRS = ir.VectorType(_BFloat(), PAIR_LANES)              # <32 x bfloat>
_SUMS = ir.VectorType(ir.FloatType(), 16)                  # <16 x float>


def _bits(array) -> bool:
    """A 2-D array of bfloat16 bits (`kernels.bfloat16`)."""
    return isinstance(array, types.Array) and array.dtype == types.uint16 and array.ndim == 2


def _address(context, builder, array_type, array, row, row_type, col, col_type, vector):
    """The address of array[row, col], as a pointer to an LLVM `vector` of its elements."""
    struct = context.make_array(array_type)(context, builder, array)
    index = [context.cast(builder, row, row_type, types.intp), context.cast(builder, col, col_type, types.intp)]
    return builder.bitcast(cgutils.get_item_pointer(context, builder, array_type, struct, index), vector.as_pointer())


@intrinsic
def pairs(typingctx, acc, a, i, j, b, k, l):
    """acc + [a[i, j+2m] b[k, l+2m] + a[i, j+2m+1] b[k, l+2m+1] for m in 0..15]: one vdpbf16ps."""
    if not (acc == float32x16 and _bits(a) and _bits(b)):
        return None

    def codegen(context, builder, sig, args):
        first = _address(context, builder, sig.args[1], args[1], args[2], sig.args[2], args[3], sig.args[3], _PAIRS)
        second = _address(context, builder, sig.args[4], args[4], args[5], sig.args[5], args[6], sig.args[6], _PAIRS)
        instruction = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_SUMS, [_SUMS, _PAIRS, _PAIRS]), "llvm.x86.avx512bf16.dpbf16ps.512")
        return builder.call(instruction, [args[0], builder.load(first, align=2), builder.load(second, align=2)])
    return float32x16(acc, a, i, j, b, k, l), codegen


@intrinsic
def _store_two_rows(typingctx, out, t, n, v):
    """out[t, n:n+4] = v[0:4] and out[t + 1, n:n+4] = v[4:8] (v: eight float32 lanes, `lanes.sums8`'s), each rounded
    to bfloat16 (out holds its bits): two stores of four, not eight of one."""
    if not _bits(out):
        return None

    def codegen(context, builder, sig, args):
        row = args[1]
        rounded = round_to_bfloat16(builder, args[3])                    # <8 x i16>
        four_bits = ir.VectorType(rounded.type.element, 4)
        for half, next_row in ((0, row), (1, builder.add(row, ir.Constant(row.type, 1)))):
            four = builder.shuffle_vector(rounded, rounded, ir.Constant(ir.VectorType(ir.IntType(32), 4),
                                                                        [4 * half + i for i in range(4)]))
            address = _address(context, builder, sig.args[0], args[0], next_row, sig.args[1], args[2], sig.args[2],
                               four_bits)
            builder.store(four, address, align=2)
        return context.get_dummy_value()
    return types.void(out, t, n, v), codegen


@njit(inline="always")
def _block(weight, x, n, t, ahead, asked, last, out):
    """out[t:t+4, n:n+4] = x[t:t+4] . weight[n:n+4]: sixteen running sums, s<i><j> row t + i by weight row n + j;
    weight rows ahead to ahead + asked are asked for meanwhile (a cache line each, every 32 columns)."""
    s00, s01, s02, s03 = zero16(), zero16(), zero16(), zero16()
    s10, s11, s12, s13 = zero16(), zero16(), zero16(), zero16()
    s20, s21, s22, s23 = zero16(), zero16(), zero16(), zero16()
    s30, s31, s32, s33 = zero16(), zero16(), zero16(), zero16()
    for k in range(0, last, PAIR_LANES):
        _ask(weight, ahead, asked, k)
        s00, s01 = pairs(s00, x, t, k, weight, n, k), pairs(s01, x, t, k, weight, n + 1, k)
        s02, s03 = pairs(s02, x, t, k, weight, n + 2, k), pairs(s03, x, t, k, weight, n + 3, k)
        s10, s11 = pairs(s10, x, t + 1, k, weight, n, k), pairs(s11, x, t + 1, k, weight, n + 1, k)
        s12, s13 = pairs(s12, x, t + 1, k, weight, n + 2, k), pairs(s13, x, t + 1, k, weight, n + 3, k)
        s20, s21 = pairs(s20, x, t + 2, k, weight, n, k), pairs(s21, x, t + 2, k, weight, n + 1, k)
        s22, s23 = pairs(s22, x, t + 2, k, weight, n + 2, k), pairs(s23, x, t + 2, k, weight, n + 3, k)
        s30, s31 = pairs(s30, x, t + 3, k, weight, n, k), pairs(s31, x, t + 3, k, weight, n + 1, k)
        s32, s33 = pairs(s32, x, t + 3, k, weight, n + 2, k), pairs(s33, x, t + 3, k, weight, n + 3, k)
    rows01 = sums8(fold16(s00), fold16(s01), fold16(s02), fold16(s03),
                   fold16(s10), fold16(s11), fold16(s12), fold16(s13))
    rows23 = sums8(fold16(s20), fold16(s21), fold16(s22), fold16(s23),
                   fold16(s30), fold16(s31), fold16(s32), fold16(s33))
    if last == weight.shape[1]:                                  # lane 4 i + j: row t + i, weight row n + j
        _store_two_rows(out, t, n, rows01)
        _store_two_rows(out, t + 2, n, rows23)
        return
    for i in range(2):                                           # columns past the whole 32s: added one by one
        for j in range(4):
            put(out, (t + i, n + j), lane(rows01, 4 * i + j) + _rest(weight, x, n + j, t + i, last))
            put(out, (t + 2 + i, n + j), lane(rows23, 4 * i + j) + _rest(weight, x, n + j, t + 2 + i, last))


@njit(inline="always")
def _block_of_one(weight, x, n, t, ahead, last, out):
    """out[t:t+4, n] = x[t:t+4] . weight[n]: four running sums; weight row `ahead` is asked for meanwhile."""
    s0, s1, s2, s3 = zero16(), zero16(), zero16(), zero16()
    for k in range(0, last, PAIR_LANES):
        prefetch(weight, ahead, k)
        s0, s1 = pairs(s0, x, t, k, weight, n, k), pairs(s1, x, t + 1, k, weight, n, k)
        s2, s3 = pairs(s2, x, t + 2, k, weight, n, k), pairs(s3, x, t + 3, k, weight, n, k)
    sums = sums8(fold16(s0), fold16(s1), fold16(s2), fold16(s3), zero8(), zero8(), zero8(), zero8())
    for i in range(4):
        put(out, (t + i, n), lane(sums, i) + _rest(weight, x, n, t + i, last))


@njit(nogil=True, cache=True)
def _task(x, weight, residual, add_residual, first, end, out):
    """out[:, first:end] = x . weight[first:end]^T, every row of x (at least four), rounded to out's precision, then
    its sum with residual[:, first:end] if add_residual; while each four weight rows are multiplied, the four
    PREFETCH_AHEAD fours further on are asked for, each block of rows its share (`gemv_blocks_cpu.spread`).
    Compiled and cached on its own, not inlined into the parallel loop, as `gemv_cpu._task` says why."""
    rows, num_outputs = x.shape[0], weight.shape[0]
    last = weight.shape[1] - weight.shape[1] % PAIR_LANES
    blocks = (rows + 3) // 4
    n = first
    while n + 4 <= end:
        ahead = min(n + 4 * PREFETCH_AHEAD, num_outputs - 4)
        for block in range(blocks):
            first_asked, stop_asked = spread(block, blocks, 4)
            _block(weight, x, n, min(4 * block, rows - 4), ahead + first_asked, stop_asked - first_asked, last,
                   out)                                          # the last block may overlap the one before
        n += 4
    for n in range(n, end):
        for block in range(blocks):
            _block_of_one(weight, x, n, min(4 * block, rows - 4), min(n + PREFETCH_AHEAD, num_outputs - 1), last,
                          out)
    if add_residual:
        for n in range(first, end):
            for t in range(out.shape[0]):
                put(out, (t, n), get(out, (t, n)) + get(residual, (t, n)))


@njit(parallel=True, nogil=True, cache=True)
def _pairs_product(x, weight, residual, add_residual, out):
    """out (T, N) = x (T, K) . weight (N, K)^T, plus residual (T, N) if add_residual (bfloat16 bits, T >= 4): each
    thread takes tasks of TASK_ROWS weight rows; the product is rounded, then its sum with the residual."""
    num_outputs = weight.shape[0]
    for task in prange((num_outputs + TASK_ROWS - 1) // TASK_ROWS):
        _task(x, weight, residual, add_residual, task * TASK_ROWS, min(num_outputs, (task + 1) * TASK_ROWS), out)


def takes_pairs(x, weight):
    """Whether `pairs_product` multiplies x by weight: both bfloat16, on a CPU with the instruction, four rows or
    more."""


def pairs_product(x, weight, residual, add_residual, out):
    """out = x . weight^T (+ residual), as `gemv_cpu._stream` is called, where `takes_pairs` says so."""


@overload(takes_pairs, inline="always")
def _takes_pairs(x, weight):
    if PAIRS and _bits(x) and _bits(weight):
        return lambda x, weight: x.shape[0] >= 4
    return lambda x, weight: False


@overload(pairs_product, inline="always")
def _pairs_product_for(x, weight, residual, add_residual, out):
    if PAIRS and _bits(x) and _bits(weight):
        return lambda x, weight, residual, add_residual, out: _pairs_product(x, weight, residual, add_residual, out)
    return lambda x, weight, residual, add_residual, out: None          # float32: never asked (takes_pairs)


forget_stale(_task, (bfloat16, gemv_blocks_cpu, lanes, lanes16))              # the files each compiles in
forget_stale(_pairs_product, (bfloat16, gemv_blocks_cpu, lanes, lanes16))
