"""Eight float32 lanes as a Numba value: the vector registers a hand-written CPU kernel works in.

A compiler vectorises a simple loop by itself, but it decides on its own how: which values stay in
registers, how many sums run side by side, whether the memory ahead is asked for early. A kernel
that must run at the speed of the hardware says it explicitly, as C code does with intrinsics.
These functions are that vocabulary, for Numba: each compiles to one or a few LLVM vector
instructions (AVX's 256-bit registers on x86, two 128-bit NEON registers on ARM).

    zero8()                   [0, 0, 0, 0, 0, 0, 0, 0]
    load8(a, i, j)            a[i, j:j+8], one load (a float32 2-D array whose rows are contiguous)
    fma8(a, b, c)             a * b + c lane by lane, fused where the CPU has FMA
    sum8(a)                   a[0] + a[1] + ... + a[7]
    sums8(a0, ..., a7)        [sum8(a0), sum8(a1), ..., sum8(a7)]: eight reductions at once
    lane(v, i)                v[i]
    prefetch(a, i, j)         ask the memory for a[i, j]'s cache line now, before it is needed
                              (as data read once: x86's prefetchnta)

`load8` does not check bounds: its caller keeps j + 8 <= the row's length.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

LANES = 8
_VECTOR = ir.VectorType(ir.FloatType(), LANES)            # <8 x float>
_INDEX = ir.IntType(32)


class Float32x8(types.Type):
    """Numba's type for eight float32 lanes held in one vector register."""

    def __init__(self):
        super().__init__(name="float32x8")


float32x8 = Float32x8()


@register_model(Float32x8)
class _Float32x8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VECTOR)


def _pointer(context, builder, sig, args):
    """The address of a[i, j] for the call's (array, i, j) arguments."""
    array_type, row_type, col_type = sig.args
    array = context.make_array(array_type)(context, builder, args[0])
    row = context.cast(builder, args[1], row_type, types.intp)
    col = context.cast(builder, args[2], col_type, types.intp)
    return cgutils.get_item_pointer(context, builder, array_type, array, [row, col])


def _float32_matrix(a) -> bool:
    return isinstance(a, types.Array) and a.dtype == types.float32 and a.ndim == 2


@intrinsic
def zero8(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(_VECTOR, [0.0] * LANES)
    return float32x8(), codegen


@intrinsic
def load8(typingctx, a, i, j):
    if not (_float32_matrix(a) and isinstance(i, types.Integer) and isinstance(j, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        address = builder.bitcast(_pointer(context, builder, sig, args), _VECTOR.as_pointer())
        return builder.load(address, align=4)
    return float32x8(a, i, j), codegen


@intrinsic
def prefetch(typingctx, a, i, j):
    if not (_float32_matrix(a) and isinstance(i, types.Integer) and isinstance(j, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        byte_pointer = ir.IntType(8).as_pointer()
        llvm_prefetch = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [byte_pointer, _INDEX, _INDEX, _INDEX]), "llvm.prefetch.p0")
        address = builder.bitcast(_pointer(context, builder, sig, args), byte_pointer)
        builder.call(llvm_prefetch, [address, _INDEX(0), _INDEX(0), _INDEX(1)])     # a read, of data used once
        return context.get_dummy_value()
    return types.void(a, i, j), codegen


@intrinsic
def fma8(typingctx, a, b, c):
    if not (a == b == c == float32x8):
        return None

    def codegen(context, builder, sig, args):
        fmuladd = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_VECTOR, [_VECTOR] * 3), "llvm.fmuladd.v8f32")
        return builder.call(fmuladd, args)                   # one FMA instruction where the CPU has one
    return float32x8(a, b, c), codegen


def _shuffle(builder, a, b, picks):
    """Lanes of a (0-7) and b (8-15), in the order given."""
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_INDEX, LANES), picks))


@intrinsic
def sum8(typingctx, a):
    if a != float32x8:
        return None

    def codegen(context, builder, sig, args):
        values = [builder.extract_element(args[0], _INDEX(i)) for i in range(LANES)]
        while len(values) > 1:                                   # pairwise: 8 -> 4 -> 2 -> 1
            values = [builder.fadd(values[i], values[i + 1]) for i in range(0, len(values), 2)]
        return values[0]
    return types.float32(a), codegen


@intrinsic
def sums8(typingctx, a0, a1, a2, a3, a4, a5, a6, a7):
    if any(a != float32x8 for a in (a0, a1, a2, a3, a4, a5, a6, a7)):
        return None

    def codegen(context, builder, sig, args):
        # Three rounds of pairwise sums, each adding two shuffles of two vectors (the transpose-and-add
        # of a GEMM's final reduction): eight vectors -> four -> two -> one, 7 additions in all.
        def add_pairs(a, b, even, odd):
            return builder.fadd(_shuffle(builder, a, b, even), _shuffle(builder, a, b, odd))
        first = [add_pairs(args[i], args[i + 1], [0, 8, 2, 10, 4, 12, 6, 14], [1, 9, 3, 11, 5, 13, 7, 15])
                 for i in range(0, 8, 2)]            # [ai:01, ai+1:01, ai:23, ai+1:23, ai:45, ...]
        second = [add_pairs(first[i], first[i + 1], [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15])
                  for i in (0, 2)]                   # [a0:0-3, a1:0-3, a2:0-3, a3:0-3, a0:4-7, ...]
        return add_pairs(second[0], second[1], [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15])
    return float32x8(a0, a1, a2, a3, a4, a5, a6, a7), codegen


@intrinsic
def lane(typingctx, v, i):
    if not (v == float32x8 and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], context.cast(builder, args[1], sig.args[1], types.intp))
    return types.float32(v, i), codegen
