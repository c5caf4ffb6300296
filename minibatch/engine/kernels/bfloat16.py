"""bfloat16 in the CPU kernels: one kernel source for float32 and bfloat16 arrays alike (Numba).

Numba has no bfloat16 type, but a bfloat16 is the top half of a float32: the same sign and
exponent, 7 of float32's 23 mantissa bits. So a bfloat16 tensor is handed to a kernel as its bits,
a uint16 array (`host_view`), and the kernel computes in float32: it widens each value it reads
and rounds each value it stores to the nearest bfloat16 (ties to even, as torch rounds). The
kernels read and write through these helpers, which are plain reads and writes for float32 arrays:

    get(a, index)          a[index] (an int, or a tuple such as (t, c)) as a float32
    put(a, index, v)       a[index] = v, rounded to a's precision
    as_stored(a, v)        v (a float32 or a float32x8) rounded as a would store it
    as_float32(x)          x (T, K) itself if it is float32, else a float32 copy

(`lanes.load8` and `store8` do the same eight lanes at a time.) Numba compiles a kernel once for
each combination of array types it is called with, so `_layer` in float32 and in bfloat16 are two
machine codes from one source, and in float32 the helpers compile to nothing.

Where transformers, computing in bfloat16, rounds a result (each operator's output is a bfloat16
tensor), the kernels round with `put` or `as_stored`: after the norm's scaling and again after its
weight, after each rotary product and their sum, after a matrix product and again after its
residual, after SiLU and after its product with `up`. Inside an operator (a dot product's sum,
the softmax) they keep float32, as torch's bfloat16 kernels do. So the results follow the
reference's roundings, and differ only where a sum in another order rounds the other way.

Measurements: docs/performance.md, section "bfloat16".
"""
from __future__ import annotations

import numpy as np
import torch
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from minibatch.engine.kernels.lanes import float32x8, round_to_bfloat16, widen_bfloat16

_I16, _I32 = ir.IntType(16), ir.IntType(32)


@intrinsic
def _widen(typingctx, bits):
    """A bfloat16's bits (uint16) -> its value as a float32."""
    if bits != types.uint16:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.shl(builder.zext(args[0], _I32), _I32(16)), ir.FloatType())
    return types.float32(bits), codegen


@intrinsic
def _narrow(typingctx, value):
    """A float32 -> the bits (uint16) of the nearest bfloat16, ties to even (finite values)."""
    if value != types.float32:
        return None

    def codegen(context, builder, sig, args):
        bits = builder.bitcast(args[0], _I32)
        odd = builder.and_(builder.lshr(bits, _I32(16)), _I32(1))
        return builder.trunc(builder.lshr(builder.add(bits, builder.add(odd, _I32(0x7FFF))), _I32(16)), _I16)
    return types.uint16(value), codegen


def _bits(a) -> bool:
    return isinstance(a, types.Array) and a.dtype == types.uint16


def get(a, index):
    """a[index] (an int, or a tuple of them) as a float32, whatever a stores."""


def put(a, index, v):
    """a[index] = v, rounded to a's precision."""


def as_stored(a, v):
    """v rounded to what an element of a can hold: v itself for float32, the nearest bfloat16 for bits."""


def as_float32(x):
    """x (T, K) itself when float32, else a float32 copy of its values."""


@overload(get, inline="always")
def _get(a, index):
    if _bits(a):
        return lambda a, index: _widen(a[index])
    return lambda a, index: np.float32(a[index])


@overload(put, inline="always")
def _put(a, index, v):
    if _bits(a):
        def put_bits(a, index, v):
            a[index] = _narrow(np.float32(v))
        return put_bits

    def put_value(a, index, v):
        a[index] = v
    return put_value


@intrinsic
def _round8(typingctx, v):
    """float32x8 -> float32x8, each lane rounded to the nearest bfloat16."""
    if v != float32x8:
        return None

    def codegen(context, builder, sig, args):
        return widen_bfloat16(builder, round_to_bfloat16(builder, args[0]))
    return float32x8(v), codegen


@overload(as_stored, inline="always")
def _as_stored(a, v):
    if not _bits(a):
        return lambda a, v: v
    if v == float32x8:
        return lambda a, v: _round8(v)
    return lambda a, v: _widen(_narrow(np.float32(v)))


@overload(as_float32, inline="always")
def _as_float32(x):
    if not _bits(x):
        return lambda x: x

    def widened(x):
        out = np.empty(x.shape, np.float32)
        for t in range(x.shape[0]):
            for k in range(x.shape[1]):
                out[t, k] = _widen(x[t, k])
        return out
    return widened


def supported(dtype: torch.dtype) -> bool:
    """Whether the CPU kernels compute with tensors of this dtype: float32, or bfloat16 as its bits."""
    return dtype in (torch.float32, torch.bfloat16)


def host_view(tensor: torch.Tensor) -> np.ndarray:
    """A zero-copy numpy view of a CPU tensor: its values, or for bfloat16 its bits as uint16."""
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()


def from_host(array: np.ndarray) -> torch.Tensor:
    """The tensor of a kernel's output array, without a copy: uint16 bits are bfloat16 values."""
    tensor = torch.from_numpy(array)
    return tensor.view(torch.bfloat16) if array.dtype == np.uint16 else tensor
