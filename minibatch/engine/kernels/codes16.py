"""Sixteen block codes or fp16 numbers at once, as sixteen float32 lanes (`lanes16.float32x16`).

The quantised products (`quantized_groups_numba`) read bytes: 4-bit codes in pairs, 8-bit codes,
fp16 scales and minimums. Written as plain loops, the compiler vectorises them, but keeps the running
sums in memory, loading and storing them for every byte it reads. With these functions a kernel
holds its sums in registers as `float32x16` values, and each load turns sixteen bytes straight into
sixteen floats in one or two instructions:

    bytes16(a, i, j)          a[i, j:j+16] of a uint8 array as floats 0..255 (a q4_1 byte, both nibbles)
    nibbles16(a, i, j)        the low four bits of a[i, j:j+16] (uint8) as floats 0..15
    signed16(a, i, j)         a[i, j:j+16] of an int8 array as floats -128..127 (q8_0 codes)
    halves16(a, i, j)         a[i, j:j+16] of a uint16 array holding fp16 bits, as their float32 values
                              (exact: every fp16 is a float32, subnormals included)
    splat16(s)                [s, s, ..., s]
    store16(a, i, j, v)       a[i, j:j+16] = v (float32)

Every conversion is exact: a byte is a whole number a float32 holds, and fp16 widens without
rounding. Like `load16` they do not check bounds: the caller keeps j + 16 <= the row's length.
Measurements: docs/performance.md, section "Quantised products".
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from minibatch.engine.kernels.lanes import _pointer
from minibatch.engine.kernels.lanes16 import _INTEGERS16, _VECTOR16, LANES16, float32x16

_BYTES16 = ir.VectorType(ir.IntType(8), LANES16)                 # <16 x i8>
_BITS16 = ir.VectorType(ir.IntType(16), LANES16)                 # <16 x i16>
_FP16x16 = ir.VectorType(ir.HalfType(), LANES16)                 # <16 x half>
_FIFTEEN = ir.Constant(_INTEGERS16, [15] * LANES16)


def _loads(a, i, j, dtype) -> bool:
    """A 2-D array of `dtype`, indexed by two integers."""
    return (isinstance(a, types.Array) and a.ndim == 2 and a.dtype == dtype and isinstance(i, types.Integer)
            and isinstance(j, types.Integer))


def _load(context, builder, sig, args, vector_type):
    """The sixteen elements at a[i, j] as one vector load."""
    address = builder.bitcast(_pointer(context, builder, sig, args), vector_type.as_pointer())
    return builder.load(address, align=1)


@intrinsic
def bytes16(typingctx, a, i, j):
    if not _loads(a, i, j, types.uint8):
        return None

    def codegen(context, builder, sig, args):
        return builder.uitofp(builder.zext(_load(context, builder, sig, args, _BYTES16), _INTEGERS16), _VECTOR16)
    return float32x16(a, i, j), codegen


@intrinsic
def nibbles16(typingctx, a, i, j):
    if not _loads(a, i, j, types.uint8):
        return None

    def codegen(context, builder, sig, args):
        wide = builder.zext(_load(context, builder, sig, args, _BYTES16), _INTEGERS16)
        return builder.uitofp(builder.and_(wide, _FIFTEEN), _VECTOR16)
    return float32x16(a, i, j), codegen


@intrinsic
def signed16(typingctx, a, i, j):
    if not _loads(a, i, j, types.int8):
        return None

    def codegen(context, builder, sig, args):
        return builder.sitofp(builder.sext(_load(context, builder, sig, args, _BYTES16), _INTEGERS16), _VECTOR16)
    return float32x16(a, i, j), codegen


@intrinsic
def halves16(typingctx, a, i, j):
    if not _loads(a, i, j, types.uint16):
        return None

    def codegen(context, builder, sig, args):
        bits = _load(context, builder, sig, args, _BITS16)
        return builder.fpext(builder.bitcast(bits, _FP16x16), _VECTOR16)
    return float32x16(a, i, j), codegen


@intrinsic
def splat16(typingctx, s):
    if not isinstance(s, types.Float):
        return None

    def codegen(context, builder, sig, args):
        value = context.cast(builder, args[0], sig.args[0], types.float32)
        one = builder.insert_element(ir.Constant(_VECTOR16, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
        return builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(ir.IntType(32), LANES16), [0] * LANES16))
    return float32x16(s), codegen


@intrinsic
def store16(typingctx, a, i, j, v):
    if not (_loads(a, i, j, types.float32) and v == float32x16):
        return None

    def codegen(context, builder, sig, args):
        address = builder.bitcast(_pointer(context, builder, sig, args), _VECTOR16.as_pointer())
        builder.store(args[3], address, align=4)
        return context.get_dummy_value()
    return types.none(a, i, j, v), codegen
