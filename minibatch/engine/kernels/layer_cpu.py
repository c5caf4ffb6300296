"""A whole decoder layer of a decode step in one compiled call, on the CPU (Numba): the fast path's layer.

A layer of a few rows is nine kernels: RMSNorm, the q|k|v product, rotary + KV write, paged attention,
the output product (+ residual), RMSNorm, the gate|up product, SwiGLU, the down product (+ residual).
Called one by one from Python each pays a dispatch, a tensor allocation and a few numpy views. Here the
layer is one call,

    x (T, C) -> x + attention(rms_norm(x)) = x1 -> x1 + mlp(rms_norm(x1))      (T, C)

running the same compiled kernels (`fused_cpu`, `gemv_cpu`, `numba_cpu`, `quantized_numba`, `tiles_bf16`) in the same
order, on numpy arrays that stay numpy from the first layer to the last, so the fixed cost per step
shrinks. `ops.fast.FastOps` calls it for steps whose four products all run routines the layer can run
(`ops.products`: the streamed loop, AMX's tiles, or q8_0 / q4_1 blocks) with the Numba attention backend.

Each product's operands come as a named tuple whose type says which compiled product to use (`Streamed`, `Tiles`,
`Q8_0Blocks`, `Q4_1Blocks`); Numba compiles the layer once per combination of types. Compiled code is
cached on disk; `_layer` compiles the other kernels into itself, so it is compiled again when one of
their files changes (`kernels.stale_cache`). Measurements: docs/performance.md, "Whole compiled layers".
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np
import torch
from numba import njit
from numba.extending import overload

from minibatch.engine.kernels import (bfloat16, codes16, fused_cpu, gemv_blocks_cpu, gemv_cpu, lanes, lanes16,
                                     numba_cpu, pairs_bf16, quantized_groups_numba, quantized_numba, tiles_bf16)
from minibatch.engine.kernels.bfloat16 import from_host, host_view
from minibatch.engine.kernels.fused_cpu import _kept_view, _rms_norm, _rotary_write_kv, _silu_mul
from minibatch.engine.kernels.gemv_cpu import _stream
from minibatch.engine.kernels.numba_cpu import _paged_attention
from minibatch.engine.kernels.quantized_numba import _q4_1_into, _q8_0_into
from minibatch.engine.kernels.stale_cache import forget_stale
from minibatch.engine.kernels.tiles_bf16 import _tiles_product

# What the compiled layer multiplies by, one type per kind of weight (`ops.products` makes them).
Streamed = namedtuple("Streamed", "weight")                    # (N, K) float32, or bfloat16 as its bits
Q8_0Blocks = namedtuple("Q8_0Blocks", "codes scales block grouped group_scales")
Q4_1Blocks = namedtuple("Q4_1Blocks", "codes scales mins block grouped group_scales group_mins")
Tiles = namedtuple("Tiles", "packed")                          # (N, K) bfloat16 bits in AMX's tile order


def _product(x, weight, residual, add_residual, out):
    """out (T, N) = x (T, K) times the weight (+ residual), by the compiled product for the weight's type."""


@overload(_product, inline="always")
def _product_for(x, weight, residual, add_residual, out):
    """The compiled product for the weight's type, chosen when the layer is compiled."""
    kind = getattr(weight, "instance_class", None)
    if kind is Streamed:
        return lambda x, weight, residual, add_residual, out: _stream(x, weight.weight, residual, add_residual, out)
    if kind is Tiles:
        return lambda x, weight, residual, add_residual, out: _tiles_product(x, weight.packed, residual, add_residual,
                                                                             out)
    if kind is Q8_0Blocks:
        return lambda x, weight, residual, add_residual, out: _q8_0_into(
            x, weight.codes, weight.scales, weight.block, weight.grouped, weight.group_scales, residual,
            add_residual, out)
    if kind is Q4_1Blocks:
        return lambda x, weight, residual, add_residual, out: _q4_1_into(
            x, weight.codes, weight.scales, weight.mins, weight.block, weight.grouped, weight.group_scales,
            weight.group_mins, residual, add_residual, out)
    return None


@njit(inline="always")
def _outputs(weight):
    """N, the product's output width: every operand tuple starts with an (N, ...) array."""
    return weight[0].shape[0]


@njit(nogil=True, cache=True)
def _layer(x, attn_norm, qkv_weight, o_weight, mlp_norm, gate_up_weight, down_weight, eps, num_heads,
           positions, cos, signed_sin, k_cache, v_cache, slot_mapping, block_tables, query_start_loc, context_lens,
           scale):
    rows = x.shape[0]                                      # x: (T, C)
    head_dim = k_cache.shape[3]                            # caches: (N, bs, Hkv, D)
    h = np.empty_like(x)                                   # (T, C) normed rows
    _rms_norm(x, attn_norm, eps, h)
    qkv = np.empty((rows, _outputs(qkv_weight)), x.dtype)                       # (T, (Hq + 2 Hkv) D)
    _product(h, qkv_weight, qkv, False, qkv)
    q = np.empty((rows, num_heads, head_dim), x.dtype)                            # (T, Hq, D)
    _rotary_write_kv(qkv, positions, cos, signed_sin, k_cache, v_cache, slot_mapping, q)
    attn = np.empty_like(q)                                                       # (T, Hq, D)
    _paged_attention(q, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale, attn)
    x1 = np.empty_like(x)                                                         # (T, C)
    _product(attn.reshape(rows, num_heads * head_dim), o_weight, x, True, x1)
    _rms_norm(x1, mlp_norm, eps, h)
    gate_up = np.empty((rows, _outputs(gate_up_weight)), x.dtype)               # (T, 2 I)
    _product(h, gate_up_weight, gate_up, False, gate_up)
    act = np.empty((rows, _outputs(gate_up_weight) // 2), x.dtype)              # (T, I)
    _silu_mul(gate_up, act)
    out = np.empty_like(x)                                                        # (T, C)
    _product(act, down_weight, x1, True, out)
    return out


# the modules whose kernels `_layer` compiles into itself
CALLEES = (bfloat16, codes16, fused_cpu, gemv_blocks_cpu, gemv_cpu, lanes, lanes16, numba_cpu, pairs_bf16,
           quantized_numba, quantized_groups_numba, tiles_bf16)


forget_stale(_layer, CALLEES)


def run_layers(x: torch.Tensor, layers: list[dict], products: list[tuple], kv_cache, rotary, slot_mapping, meta,
               eps: float, scale: float, num_heads: int) -> torch.Tensor:
    """x (T, C) through `layers` (LlamaModel's dicts), one compiled call each; returns (T, C).

    products: each layer's four operands (q|k|v, o, gate|up, down); rotary: positions (T,), cos (P, D) and
    signed_sin (P, D); kv_cache: its k and v lists, one per layer.
    """
    numba_cpu.check_metadata(meta, kv_cache.k[0])          # the kernels do not check bounds: the metadata is checked
    positions, cos, signed_sin = (_kept_view(t) for t in rotary)
    step = (_kept_view(slot_mapping), meta.block_tables_np, meta.query_start_loc_np, meta.context_lens_np)
    hidden = host_view(x.contiguous())
    for layer, (qkv, o, gate_up, down), k_cache, v_cache in zip(layers, products, kv_cache.k, kv_cache.v):
        hidden = _layer(hidden, _kept_view(layer["attn_norm"]), qkv, o, _kept_view(layer["mlp_norm"]), gate_up, down,
                        np.float32(eps), num_heads, positions, cos, signed_sin, _kept_view(k_cache),
                        _kept_view(v_cache), *step, float(scale))
    return from_host(hidden)
