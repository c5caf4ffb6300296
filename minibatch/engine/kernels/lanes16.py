"""Sixteen float32 lanes, one AVX-512 register, for the loops whose speed is their multiply-adds.

`kernels.lanes` works in eight lanes (256 bits), which every x86 CPU of the last ten years and
ARM's NEON (as two registers) run at full speed. A CPU with AVX-512 has registers twice as wide,
and on many (those with two 512-bit FMA units per core) one instruction on sixteen lanes does
twice the multiply-adds of one on eight in the same time. Where a loop is bound by its multiply-adds
rather than by the memory (a product of many rows by a weight: each weight loaded once is multiplied
into a dozen rows or more), sixteen lanes are up to twice as fast there. Other CPUs with AVX-512
split a 512-bit instruction into two 256-bit halves: the same speed as eight lanes, in half the
instructions. Without AVX-512 the compiler would split
every sixteen-lane value into two registers and run out of them, so `WIDE` says whether the code
Numba compiles has them (`engine.numba_target`), and kernels take the sixteen-lane loop only then.

    zero16()                  sixteen zeros
    load16(a, i, j)           a[i, j:j+16], one load (float32, or bfloat16 bits widened as `load8` does)
    fma16(a, b, c)            a * b + c lane by lane, fused
    fold16(a)                 a[0:8] + a[8:16]: eight lanes (`lanes.float32x8`), for `lanes.sums8`

Measurements: docs/performance.md, sections "Blocks of rows" and "Wide vectors".
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

from minibatch.engine.kernels.lanes import _HALVES, _INDEX, _matrix, _pointer, float32x8
from minibatch.engine.numba_target import AVX512

LANES16 = 16
WIDE = AVX512                                                   # does the compiled code have 512-bit registers?
_VECTOR16 = ir.VectorType(ir.FloatType(), LANES16)               # <16 x float>
_INTEGERS16 = ir.VectorType(ir.IntType(32), LANES16)             # <16 x i32>
_HALVES16 = ir.VectorType(_HALVES.element, LANES16)              # <16 x i16>: sixteen bfloat16s as bits


class Float32x16(types.Type):
    """Numba's type for sixteen float32 lanes held in one vector register."""

    def __init__(self):
        super().__init__(name="float32x16")


float32x16 = Float32x16()


@register_model(Float32x16)
class _Float32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VECTOR16)


@intrinsic
def zero16(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(_VECTOR16, [0.0] * LANES16)
    return float32x16(), codegen


@intrinsic
def load16(typingctx, a, i, j):
    if not (_matrix(a) and isinstance(i, types.Integer) and isinstance(j, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        if sig.args[0].dtype == types.uint16:                        # bfloat16 bits: the top half of a float32
            address = builder.bitcast(_pointer(context, builder, sig, args), _HALVES16.as_pointer())
            wide = builder.zext(builder.load(address, align=2), _INTEGERS16)
            return builder.bitcast(builder.shl(wide, ir.Constant(_INTEGERS16, [16] * LANES16)), _VECTOR16)
        address = builder.bitcast(_pointer(context, builder, sig, args), _VECTOR16.as_pointer())
        return builder.load(address, align=4)
    return float32x16(a, i, j), codegen


@intrinsic
def fma16(typingctx, a, b, c):
    if not (a == b == c == float32x16):
        return None

    def codegen(context, builder, sig, args):
        fmuladd = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_VECTOR16, [_VECTOR16] * 3), "llvm.fmuladd.v16f32")
        return builder.call(fmuladd, args)
    return float32x16(a, b, c), codegen


@intrinsic
def fold16(typingctx, a):
    if a != float32x16:
        return None

    def codegen(context, builder, sig, args):
        def half(first):
            picks = ir.Constant(ir.VectorType(_INDEX, 8), list(range(first, first + 8)))
            return builder.shuffle_vector(args[0], args[0], picks)
        low, high = half(0), half(8)
        return builder.fadd(low, high)
    return float32x8(a), codegen
