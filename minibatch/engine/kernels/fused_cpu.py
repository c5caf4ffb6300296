"""The small parts of a decode step fused into one compiled loop each, on the CPU (Numba).

A decode step multiplies a handful of rows by every weight matrix; between those products a
layer runs dozens of tiny torch operators (the RMSNorm alone is a dozen: pow, mean, add, rsqrt,
two multiplies, casts), each with its dispatch and thread start-up, for a few hundred numbers.
At batch 1 that bookkeeping costs as much as reading a third of the weights. Here each part is
one loop over the rows, compiled once; the first two run on the calling thread:

- `rms_norm(x, weight, eps)`: x / sqrt(mean(x^2) + eps) * weight, row by row;
- `rotary_write_kv(qkv, positions, cos, signed_sin, k_cache, v_cache, slot_mapping, num_heads)`:
  rotate the query and key heads of the fused q|k|v product, store the new keys and values in
  their cache slots, and return the rotated queries (T, Hq, D), all in one pass, in eight-float
  vectors: rotate_half pairs column d of a head with d + D/2, so both halves go side by side;
- `silu_mul(gate_up)`: SwiGLU's silu(gate) * up = gate / (1 + exp(-gate)) * up of the fused gate|up
  product, in eight-float vectors (`lanes.exp8`), each row split in chunks of SILU_CHUNK columns over
  the threads. In torch it is three operators (a strided view of gate, SiLU, the product), each over
  the whole (T, I) array, a tenth of a decode step of a few dozen rows.

Each product and sum is rounded in the order transformers computes it, to float32, or in bfloat16
where transformers rounds to bfloat16 (`kernels.bfloat16`), so the results equal its operators' up
to the order of the 576 additions inside a norm's sum of squares (taken sixteen at a time in vector
registers, `kernels.lanes`, as torch's own reduction does). Inputs are float32 or bfloat16 CPU
tensors handed over as zero-copy numpy views; compiled code is cached on disk (and compiled again when
`bfloat16` or `lanes` changes, `kernels.stale_cache`).

Measurements: docs/performance.md, section "Fused small parts".
"""
from __future__ import annotations

import ctypes
import weakref

import numpy as np
import torch
from numba import njit, prange

from minibatch.engine.kernels import bfloat16, lanes
from minibatch.engine.kernels.bfloat16 import as_stored, get, host_view, put
from minibatch.engine.kernels.lanes import LANES, exp8, fma8, load8, splat8, store8, sum8, zero8
from minibatch.engine.kernels.stale_cache import forget_stale

_C_TYPES = {torch.float32: ctypes.c_float, torch.bfloat16: ctypes.c_uint16, torch.int64: ctypes.c_int64}
_views: dict[int, tuple[weakref.ref, np.ndarray]] = {}     # id(tensor) -> (the tensor, weakly; its numpy view)


@njit(inline="always")
def _sum_of_squares(x, t):
    """sum_c x[t, c] ** 2: sixteen columns at a time in two running sums of eight, then the rest."""
    even, odd = zero8(), zero8()
    width, c = x.shape[1], 0
    while c + 2 * LANES <= width:
        here, there = load8(x, t, c), load8(x, t, c + LANES)
        even, odd = fma8(here, here, even), fma8(there, there, odd)
        c += 2 * LANES
    squares = sum8(even + odd)
    for c in range(c, width):
        squares += get(x, (t, c)) * get(x, (t, c))
    return squares


@njit(nogil=True, cache=True)
def _rms_norm(x, weight, eps, out):
    """The loop behind `rms_norm`: out (T, C) = each row of x (T, C) over its root-mean-square, times weight (C,)."""
    rows, width = x.shape                                  # x, out: (T, C)
    for t in range(rows):
        squares = _sum_of_squares(x, t)
        inv_rms = np.float32(1.0) / np.sqrt(squares / np.float32(width) + eps)
        for c in range(width):                             # rounded as transformers rounds: the scaled row, then
            put(out, (t, c), get(weight, c) * as_stored(out, get(x, (t, c)) * inv_rms))      # its product by weight


@njit(inline="always")
def _rotate(x, t, base, cos, signed_sin, p, out, row):
    """out[row] (D,) = x[t, base:base + D] * cos[p] + rotate_half(x[t, base:base + D]) * signed_sin[p]: each
    product rounded, then their sum. rotate_half's partner of column d is d + half in the first half, d - half
    in the second, so the halves go side by side, eight columns of each at a time, then the rest one by one."""
    half = out.shape[1] // 2
    vector_end = half - half % LANES
    for d in range(0, vector_end, LANES):
        first, second = load8(x, t, base + d), load8(x, t, base + half + d)
        store8(out, row, d, as_stored(out, first * load8(cos, p, d))
               + as_stored(out, second * load8(signed_sin, p, d)))
        store8(out, row, half + d, as_stored(out, second * load8(cos, p, half + d))
               + as_stored(out, first * load8(signed_sin, p, half + d)))
    for d in range(vector_end, half):
        first, second = get(x, (t, base + d)), get(x, (t, base + half + d))
        put(out, (row, d), as_stored(out, first * get(cos, (p, d))) + as_stored(out, second * get(signed_sin, (p, d))))
        put(out, (row, half + d), as_stored(out, second * get(cos, (p, half + d)))
            + as_stored(out, first * get(signed_sin, (p, half + d))))


@njit(nogil=True, cache=True)
def _rotary_write_kv(qkv, positions, cos, signed_sin, k_cache, v_cache, slot_mapping, q_out):
    """The loop behind `rotary_write_kv`: q_out (T, Hq, D) and the caches' slots written in one pass over qkv."""
    num_heads, head_dim = q_out.shape[1], q_out.shape[2]   # qkv: (T, (Hq + 2 Hkv) D), q_out: (T, Hq, D)
    num_slots, num_kv_heads = k_cache.shape[0] * k_cache.shape[1], k_cache.shape[2]   # caches: (N, bs, Hkv, D)
    queries = q_out.reshape(q_out.shape[0] * num_heads, head_dim)                 # (T Hq, D)
    keys = k_cache.reshape(num_slots * num_kv_heads, head_dim)                    # (N bs Hkv, D): slot s at s Hkv
    values = v_cache.reshape(num_slots * num_kv_heads, head_dim)
    vector_end = head_dim - head_dim % LANES
    for t in range(qkv.shape[0]):
        p, slot = positions[t], slot_mapping[t]
        if not (0 <= slot < num_slots and 0 <= p < cos.shape[0]):
            raise IndexError("a slot or a position lies outside the KV cache or the rotary tables")
        for head in range(num_heads):
            _rotate(qkv, t, head * head_dim, cos, signed_sin, p, queries, t * num_heads + head)
        for kv_head in range(num_kv_heads):
            row = slot * num_kv_heads + kv_head
            _rotate(qkv, t, (num_heads + kv_head) * head_dim, cos, signed_sin, p, keys, row)
            v_base = (num_heads + num_kv_heads + kv_head) * head_dim
            for d in range(0, vector_end, LANES):          # the value as it is, eight columns at a time
                store8(values, row, d, load8(qkv, t, v_base + d))
            for d in range(vector_end, head_dim):
                put(values, (row, d), get(qkv, (t, v_base + d)))


SILU_CHUNK = 256        # columns of one row a thread takes at a time in SwiGLU


@njit(parallel=True, nogil=True, cache=True)
def _silu_mul(gate_up, out):
    """The loop behind `silu_mul`: out (T, I) = silu(gate) * up of gate_up (T, 2 I), in chunks over the threads."""
    rows, inter = out.shape                                # gate_up: (T, 2 I) = gate | up, out: (T, I)
    chunks = (inter + SILU_CHUNK - 1) // SILU_CHUNK        # (even one row is split over the threads)
    vector_end = inter - inter % LANES
    for task in prange(rows * chunks):
        t, start = task // chunks, task % chunks * SILU_CHUNK
        end = min(start + SILU_CHUNK, inter)
        i = start
        while i < min(end, vector_end):                    # eight columns at a time: exp8, not np.exp per value
            gate = load8(gate_up, t, i)
            silu = as_stored(out, gate / (splat8(1.0) + exp8(zero8() - gate)))    # rounded, then times up
            store8(out, t, i, silu * load8(gate_up, t, inter + i))
            i += LANES
        for i in range(i, end):
            gate = get(gate_up, (t, i))
            silu = as_stored(out, gate / (np.float32(1.0) + np.exp(-gate)))
            put(out, (t, i), silu * get(gate_up, (t, inter + i)))


def _kept_view(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a contiguous CPU tensor that every layer passes again (weights, tables, caches, the
    step's positions and slots), made once: `Tensor.numpy()` costs microseconds, hundreds of times a step.
    The view holds no reference to the tensor; it is forgotten when the tensor is freed."""
    key = id(tensor)
    entry = _views.get(key)
    if entry is not None and entry[0]() is tensor:
        return entry[1]
    if not tensor.is_contiguous() or tensor.dtype not in _C_TYPES:
        return host_view(tensor)
    memory = (_C_TYPES[tensor.dtype] * tensor.numel()).from_address(tensor.data_ptr())
    view = np.ctypeslib.as_array(memory).reshape(tensor.shape)
    _views[key] = (weakref.ref(tensor, lambda _: _views.pop(key, None)), view)
    return view


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x (T, C) scaled to unit root-mean-square, times weight (C,): (T, C)."""
    out = torch.empty_like(x)
    _rms_norm(host_view(x), _kept_view(weight), np.float32(eps), host_view(out))
    return out


def rotary_write_kv(qkv, positions, cos, signed_sin, k_cache, v_cache, slot_mapping, num_heads):
    """Rotated queries (T, Hq, D) from qkv (T, (Hq + 2 Hkv) D); rotated keys and values go to the caches.

    cos, signed_sin: (P, D) tables by position (signed_sin's first half negated: rotate_half's sign);
    positions, slot_mapping: (T,) int64; caches (N, bs, Hkv, D), written in place.
    """
    head_dim = k_cache.shape[3]
    q = qkv.new_empty(qkv.shape[0], num_heads, head_dim)
    _rotary_write_kv(host_view(qkv), _kept_view(positions), _kept_view(cos), _kept_view(signed_sin),
                     _kept_view(k_cache), _kept_view(v_cache), _kept_view(slot_mapping), host_view(q))
    return q


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's silu(gate) * up of the fused gate|up product (T, 2 I): (T, I)."""
    out = gate_up.new_empty(gate_up.shape[0], gate_up.shape[1] // 2)
    _silu_mul(host_view(gate_up.contiguous()), host_view(out))
    return out


for _kernel in (_rms_norm, _rotary_write_kv, _silu_mul):      # the files they compile into themselves
    forget_stale(_kernel, (bfloat16, lanes))
