"""A whole decoder layer of a decode step in one compiled call, on the CPU (Numba).

A layer of a few rows is eight kernels: RMSNorm, the q|k|v product, rotary + KV write, paged
attention, the output product (+ residual), RMSNorm, the gate|up product, SwiGLU, the down product
(+ residual). Called one by one from Python, each pays a dispatch, a tensor allocation and a few
numpy views, and SwiGLU is three torch operators: measured on a 2-core CPU about 0.3 ms per layer
at batch 1, a fifth of a decode step spent between the kernels. Here the layer is one call:

    x (T, C) -> x + attention(rms_norm(x)) = x1 -> x1 + mlp(rms_norm(x1))      (T, C)

which runs the same compiled kernels (`fused_cpu`, `gemv_cpu`, `numba_cpu`) in the same order, on
numpy arrays that stay numpy from the first layer to the last. It applies to steps of up to
`gemv_cpu.STREAM_ROWS` (64) rows (decode steps, and prefills as short; bfloat16 on a CPU with AMX
tiles, up to 8, `models.linear`) on a CPU with the Numba attention backend, whose products the layer can
run: float32 or
bfloat16 weights through the streamed loop (bfloat16 arrays as their bits: the same source compiled
again, rounding where transformers rounds, `kernels.bfloat16`), or q8_0 and q4_1 blocks through
`quantized_numba`'s kernels
(`_product` picks one by the weight's format when the layer is compiled, so each format has its own
machine code); any other step runs the layer part by part (`LlamaModel.forward`), and so does a step
profiled with `EngineConfig(profile_steps=True)`, which times the parts. Torch operators per decode
step of one sequence: 3622 part by part, 57 this way; in bfloat16 67 this way, where it ran 4554 torch
operators before these kernels took bfloat16 (counted with torch.profiler).

Measured with `python scripts/layer_ab.py [--quantization q4_1]` (SmolLM2-135M, 2 threads, median
decode step of 5 interleaved rounds), whole layers against part by part, the same tokens. On a 2-core
Intel Xeon (AVX-512): float32 23.3 against 28.7 ms at batch 1, 31.0 against 36.2 ms at batch 8. On a
2-core AMD EPYC (AVX2), before the vector exp and the nearer prefetch: q4_1 9.0 against 12.4 ms at
batch 1 and 33.0 against 37.1 at batch 8; q8_0 9.4 against 12.7 at batch 1 and 29.4 against 33.3 at
batch 8. On a 2-core AMD EPYC with AVX-512 and BF16 (`--dtype bfloat16`, 3 rounds): bfloat16 15.3
against 17.7 ms at batch 1, 23.6 against 26.8 at batch 8. The ratios are what carries over from one
machine, and one hour, to another.

The other way to fewer operator calls is `torch.compile`, which fuses the small operators around the
products itself. `python scripts/compile_ab.py --rows 1 8 16 32 128 512` times it (Inductor, weights
frozen, one dynamic graph) against the engine's calls part by part, on the dense parts of the 30 layers
(everything but the attention, which it has no paged kernel for). On a 2-core Xeon with AMX, two runs:
one row 19.8 ms against 20.1-20.8, eight 29.9-30.4 against 24.2-24.6, sixteen 36.5-37.0 against
30.3-32.5, 32 rows 49.0-49.3 against 45.0-45.2; 128 rows 123.9-125.6 against 131.5-149.4, 512 403-410
against 418-420; and 17.6-18.0 s of compiling in every new process. So it loses the decode steps,
which run faster still as whole layers here, and would save a few percent of a prefill's products for
18 s at start: not used.

Compiled code is cached on disk (`cache=True`). Numba checks a cached function against its own
file only, so `_layer`, which compiles the other kernels into itself, is compiled again when one
of their files changes (`kernels.stale_cache`).
"""
from __future__ import annotations

import numpy as np
import torch
from numba import njit
from numba.extending import overload

from minibatch.engine.kernels import (bfloat16, fused_cpu, gemv_blocks_cpu, gemv_cpu, lanes, lanes16, numba_cpu,
                                     quantized_groups_numba, quantized_numba)
from minibatch.engine.kernels.bfloat16 import from_host, host_view
from minibatch.engine.kernels.fused_cpu import _kept_view, _rms_norm, _rotary_write_kv, _silu_mul
from minibatch.engine.kernels.gemv_cpu import _stream
from minibatch.engine.kernels.numba_cpu import _paged_attention
from minibatch.engine.kernels.quantized_numba import _q4_1_into, _q8_0_into
from minibatch.engine.kernels.stale_cache import forget_stale

PRODUCTS = ("qkv", "o", "gate_up", "down")     # a layer's products, each a Linear or a QuantizedLinear


def _product(x, weight, residual, add_residual, out):
    """out (T, N) = x (T, K) times the weight (+ residual): `weight` is the tuple a product's
    `layer_operands` gives: (plain,); for q8_0 (codes, scales, block, grouped, group_scales); for q4_1
    (codes, scales, mins, block, grouped, group_scales, group_mins)."""


@overload(_product, inline="always")
def _product_for(x, weight, residual, add_residual, out):
    """The compiled product for the weight's format, chosen when the layer is compiled."""
    if len(weight) == 1:                                   # float32, streamed (gemv_cpu)
        return lambda x, weight, residual, add_residual, out: _stream(x, weight[0], residual, add_residual, out)
    if len(weight) == 5:                                   # q8_0 blocks, both layouts (quantized_numba)
        return lambda x, weight, residual, add_residual, out: _q8_0_into(
            x, weight[0], weight[1], weight[2], weight[3], weight[4], residual, add_residual, out)
    if len(weight) == 7:                                   # q4_1 blocks, both layouts (quantized_numba)
        return lambda x, weight, residual, add_residual, out: _q4_1_into(
            x, weight[0], weight[1], weight[2], weight[3], weight[4], weight[5], weight[6], residual, add_residual, out)
    return None


@njit(nogil=True, cache=True)
def _layer(x, attn_norm, qkv_weight, o_weight, mlp_norm, gate_up_weight, down_weight, eps, num_heads,
           positions, cos, signed_sin, k_cache, v_cache, slot_mapping, block_tables, query_start_loc, context_lens,
           scale):
    rows = x.shape[0]                                      # x: (T, C)
    head_dim = k_cache.shape[3]                            # caches: (N, bs, Hkv, D)
    h = np.empty_like(x)                                   # (T, C) normed rows
    _rms_norm(x, attn_norm, eps, h)
    qkv = np.empty((rows, qkv_weight[0].shape[0]), x.dtype)                       # (T, (Hq + 2 Hkv) D)
    _product(h, qkv_weight, qkv, False, qkv)
    q = np.empty((rows, num_heads, head_dim), x.dtype)                            # (T, Hq, D)
    _rotary_write_kv(qkv, positions, cos, signed_sin, k_cache, v_cache, slot_mapping, q)
    attn = np.empty_like(q)                                                       # (T, Hq, D)
    _paged_attention(q, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale, attn)
    x1 = np.empty_like(x)                                                         # (T, C)
    _product(attn.reshape(rows, num_heads * head_dim), o_weight, x, True, x1)
    _rms_norm(x1, mlp_norm, eps, h)
    gate_up = np.empty((rows, gate_up_weight[0].shape[0]), x.dtype)               # (T, 2 I)
    _product(h, gate_up_weight, gate_up, False, gate_up)
    act = np.empty((rows, gate_up_weight[0].shape[0] // 2), x.dtype)              # (T, I)
    _silu_mul(gate_up, act)
    out = np.empty_like(x)                                                        # (T, C)
    _product(act, down_weight, x1, True, out)
    return out


# the modules whose kernels `_layer` compiles into itself
CALLEES = (bfloat16, fused_cpu, gemv_blocks_cpu, gemv_cpu, lanes, lanes16, numba_cpu, quantized_numba,
           quantized_groups_numba)


forget_stale(_layer, CALLEES)


def operands(layers: list[dict], rows: int, backend) -> list[tuple] | None:
    """What `run_layers` multiplies by in a step of `rows` tokens: for each layer, its four products'
    `layer_operands`; None where the layers cannot run as whole compiled calls (another attention
    backend than Numba's, or a product the compiled layer cannot run at that many rows)."""
    if getattr(backend, "__name__", None) != numba_cpu.__name__ or rows <= 0:
        return None
    found = []
    for layer in layers:
        products = tuple(getattr(layer[n], "layer_operands", lambda rows: None)(rows) for n in PRODUCTS)
        if any(p is None for p in products):
            return None
        found.append(products)
    return found


def applies(layers: list[dict], rows: int, backend) -> bool:
    """Whether a step of `rows` tokens can run its layers as whole compiled calls (see `operands`)."""
    return operands(layers, rows, backend) is not None


def run_layers(x: torch.Tensor, layers: list[dict], products: list[tuple], kv_cache, rotary, slot_mapping, meta,
               eps: float, scale: float, num_heads: int) -> torch.Tensor:
    """x (T, C) through `layers` (LlamaModel's dicts), one compiled call each; returns (T, C).

    products: `operands(layers, T, backend)`; rotary: (positions (T,), cos (P, D), signed_sin (P, D));
    kv_cache: its k and v lists, one per layer.
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
