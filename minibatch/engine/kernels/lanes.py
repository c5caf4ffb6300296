"""Eight float32 lanes as a Numba value: the vector registers a hand-written CPU kernel works in.

A compiler vectorises a simple loop by itself, but it decides on its own how: which values stay in registers, how
many sums run side by side, whether the memory ahead is asked for early. A kernel that must run at the speed of the
hardware says it explicitly, as C code does with intrinsics. These functions are that vocabulary, for Numba: each
compiles to one or a few LLVM vector instructions (AVX's 256-bit registers on x86, two 128-bit NEON registers on
ARM). Kernels in these lanes against scalar loops: docs/performance.md, section "Paged attention on the CPU".

    zero8()                   [0, 0, 0, 0, 0, 0, 0, 0]
    splat8(s)                 [s, s, s, s, s, s, s, s]
    load8(a, i, j)            a[i, j:j+8], one load (a 2-D array whose rows are contiguous)
    store8(a, i, j, v)        a[i, j:j+8] = v, one store
    a + b, a - b, a * b, a / b  lane by lane
    fma8(a, b, c)             a * b + c lane by lane, fused where the CPU has FMA
    max8(a, b), min8(a, b)    the larger (smaller) of a[i] and b[i] in each lane
    floor8(a)                 each lane rounded down to a whole number
    pow2_8(n)                 2 ** n[i] in each lane, for whole numbers n[i] in -126..127 (built from the
                              exponent bits, no arithmetic)
    exp8(a)                   e ** a[i] in each lane, to float32's precision (a polynomial, below)
    sum8(a)                   a[0] + a[1] + ... + a[7]
    sums8(a0, ..., a7)        [sum8(a0), sum8(a1), ..., sum8(a7)]: eight reductions at once
    lane(v, i)                v[i]
    prefetch(a, i, j)         ask the memory for a[i, j]'s cache line now, before it is needed
                              (into the second-level cache: x86's prefetcht1)

`load8` and `store8` do not check bounds: their caller keeps j + 8 <= the row's length. They read
and write float32 arrays, and bfloat16 ones kept as their 16 bits in uint16 arrays (`kernels.bfloat16`):
a bfloat16 is the top half of a float32, so loading widens each lane and shifts it up 16 bits, and
storing rounds each float32 to the nearest bfloat16 (ties to even, as torch does) and keeps its top half.

A vector `exp` is not in the list of things a CPU does in one instruction, and without a vector
math library the compiler calls the scalar `expf` once per lane. `exp8` computes it as C math
libraries do: e ** x = 2 ** n * e ** r with n = round(x / ln 2) and r = x - n ln 2 in [-ln 2 / 2,
ln 2 / 2] (ln 2 split in two constants, so that n ln 2 is exact enough), e ** r by a degree-7
polynomial (Cephes' expf coefficients), 2 ** n from the exponent bits. Relative error about 2e-7
for x in [-87.3, 88] (x is clamped to that range: below it e ** x is 1e-38 rather than 0).
"""
from __future__ import annotations

import operator

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, models, overload, register_model

LANES = 8
_VECTOR = ir.VectorType(ir.FloatType(), LANES)            # <8 x float>
_INTEGERS = ir.VectorType(ir.IntType(32), LANES)          # <8 x i32>
_HALVES = ir.VectorType(ir.IntType(16), LANES)           # <8 x i16>: eight bfloat16s as bits
_INDEX = ir.IntType(32)
_SIXTEEN, _ONE, _HALF_UNIT = (ir.Constant(_INTEGERS, [n] * LANES) for n in (16, 1, 0x7FFF))


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
    array_type, row_type, col_type = sig.args[:3]
    array = context.make_array(array_type)(context, builder, args[0])
    row = context.cast(builder, args[1], row_type, types.intp)
    col = context.cast(builder, args[2], col_type, types.intp)
    return cgutils.get_item_pointer(context, builder, array_type, array, [row, col])


def _matrix(a) -> bool:
    """A float32 2-D array, or a bfloat16 one as uint16 bits: what load8, store8 and prefetch take."""
    return isinstance(a, types.Array) and a.dtype in (types.float32, types.uint16) and a.ndim == 2


def widen_bfloat16(builder, halves):
    """<8 x i16> bfloat16 bits -> <8 x float>: the bits become the top half of each float32."""
    return builder.bitcast(builder.shl(builder.zext(halves, _INTEGERS), _SIXTEEN), _VECTOR)


def round_to_bfloat16(builder, vector):
    """<8 x float> -> <8 x i16>: each lane rounded to the nearest bfloat16, ties to even (finite values)."""
    bits = builder.bitcast(vector, _INTEGERS)
    odd = builder.and_(builder.lshr(bits, _SIXTEEN), _ONE)
    rounded = builder.add(bits, builder.add(odd, _HALF_UNIT))
    return builder.trunc(builder.lshr(rounded, _SIXTEEN), _HALVES)


@intrinsic
def zero8(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(_VECTOR, [0.0] * LANES)
    return float32x8(), codegen


@intrinsic
def splat8(typingctx, s):
    if not isinstance(s, (types.Float, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        value = context.cast(builder, args[0], sig.args[0], types.float32)
        one_lane = builder.insert_element(ir.Constant(_VECTOR, ir.Undefined), value, _INDEX(0))
        return _shuffle(builder, one_lane, one_lane, [0] * LANES)
    return float32x8(s), codegen


@intrinsic
def load8(typingctx, a, i, j):
    if not (_matrix(a) and isinstance(i, types.Integer) and isinstance(j, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        if sig.args[0].dtype == types.uint16:                        # bfloat16 bits, widened to float32
            address = builder.bitcast(_pointer(context, builder, sig, args), _HALVES.as_pointer())
            return widen_bfloat16(builder, builder.load(address, align=2))
        address = builder.bitcast(_pointer(context, builder, sig, args), _VECTOR.as_pointer())
        return builder.load(address, align=4)
    return float32x8(a, i, j), codegen


@intrinsic
def store8(typingctx, a, i, j, v):
    if not (_matrix(a) and isinstance(i, types.Integer) and isinstance(j, types.Integer)
            and v == float32x8):
        return None

    def codegen(context, builder, sig, args):
        if sig.args[0].dtype == types.uint16:                        # rounded to bfloat16, stored as bits
            address = builder.bitcast(_pointer(context, builder, sig, args), _HALVES.as_pointer())
            builder.store(round_to_bfloat16(builder, args[3]), address, align=2)
            return context.get_dummy_value()
        address = builder.bitcast(_pointer(context, builder, sig, args), _VECTOR.as_pointer())
        builder.store(args[3], address, align=4)
        return context.get_dummy_value()
    return types.void(a, i, j, v), codegen


@intrinsic
def prefetch(typingctx, a, i, j):
    if not (_matrix(a) and isinstance(i, types.Integer) and isinstance(j, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        byte_pointer = ir.IntType(8).as_pointer()
        llvm_prefetch = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [byte_pointer, _INDEX, _INDEX, _INDEX]), "llvm.prefetch.p0")
        address = builder.bitcast(_pointer(context, builder, sig, args), byte_pointer)
        builder.call(llvm_prefetch, [address, _INDEX(0), _INDEX(2), _INDEX(1)])     # a read, kept in L2 and beyond
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


def _lanewise(instruction):
    """An intrinsic for a float32x8 op float32x8, emitted as `instruction(builder, a, b)`."""
    @intrinsic
    def op(typingctx, a, b):
        if not (a == b == float32x8):
            return None

        def codegen(context, builder, sig, args):
            return instruction(builder, *args)
        return float32x8(a, b), codegen
    return op


def _llvm_vector_call(builder, name, args):
    """A call of LLVM's own vector function `name` (llvm.maxnum.v8f32, ...) on <8 x float> arguments."""
    function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VECTOR, [_VECTOR] * len(args)), name)
    return builder.call(function, args)


_add8 = _lanewise(lambda builder, a, b: builder.fadd(a, b))
_sub8 = _lanewise(lambda builder, a, b: builder.fsub(a, b))
_mul8 = _lanewise(lambda builder, a, b: builder.fmul(a, b))
_div8 = _lanewise(lambda builder, a, b: builder.fdiv(a, b))
max8 = _lanewise(lambda builder, a, b: _llvm_vector_call(builder, "llvm.maxnum.v8f32", [a, b]))
min8 = _lanewise(lambda builder, a, b: _llvm_vector_call(builder, "llvm.minnum.v8f32", [a, b]))


def _as_operator(python_operator, lanewise):
    """Let kernels write `a * b` for lanewise(a, b) on two float32x8."""
    @overload(python_operator)
    def vector_operator(a, b):
        if a == b == float32x8:
            return lambda a, b: lanewise(a, b)
        return None


for _operator, _lanewise_op in ((operator.add, _add8), (operator.sub, _sub8), (operator.mul, _mul8),
                                (operator.truediv, _div8)):
    _as_operator(_operator, _lanewise_op)


@intrinsic
def floor8(typingctx, a):
    if a != float32x8:
        return None

    def codegen(context, builder, sig, args):
        return _llvm_vector_call(builder, "llvm.floor.v8f32", args)
    return float32x8(a), codegen


@intrinsic
def pow2_8(typingctx, n):
    if n != float32x8:
        return None

    def codegen(context, builder, sig, args):
        whole = builder.fptosi(args[0], _INTEGERS)                         # n as integers
        biased = builder.add(whole, ir.Constant(_INTEGERS, [127] * LANES))  # float32's exponent bias
        bits = builder.shl(biased, ir.Constant(_INTEGERS, [23] * LANES))     # into the exponent field
        return builder.bitcast(bits, _VECTOR)                               # sign 0, mantissa 0: 2 ** n
    return float32x8(n), codegen


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


_LOG2_E = 1.44269504088896341
_LN2_HIGH, _LN2_LOW = 0.693359375, -2.12194440e-4     # ln 2 = high + low; high has few bits, so n * high is exact
_EXP_POLYNOMIAL = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
                   5.0000001201e-1)                    # e ** r = 1 + r + r ** 2 (c5 + c4 r + ... + c0 r ** 5)
_EXP_LOWEST, _EXP_HIGHEST = -87.33654, 88.0          # x is clamped to these, where 2 ** n is a normal float32


@njit(inline="always")
def exp8(x):
    x = min8(max8(x, splat8(_EXP_LOWEST)), splat8(_EXP_HIGHEST))
    n = floor8(fma8(x, splat8(_LOG2_E), splat8(0.5)))                           # round(x / ln 2)
    r = x - n * splat8(_LN2_HIGH) - n * splat8(_LN2_LOW)                          # in [-ln 2 / 2, ln 2 / 2]
    p = splat8(_EXP_POLYNOMIAL[0])
    for c in _EXP_POLYNOMIAL[1:]:
        p = fma8(p, r, splat8(c))
    return (fma8(p, r * r, r) + splat8(1.0)) * pow2_8(n)
