"""The reference path: every operation of a forward pass in plain torch, on any device and dtype.

This is the path to read first. Each operation is a few torch calls over the whole packed batch; paged
attention is the attention backend's (`kernels.torch_ref` by default: gather each sequence's K/V from its
blocks, then ordinary masked attention). Products are `F.linear` (`ops.products`, kernels="reference").
Arithmetic is rounded where transformers rounds, so greedy float32 tokens equal its `generate()`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from minibatch.engine.models.quantized import QuantizedWeight


def describe(weight) -> tuple[torch.Size, str, int]:
    """A weight's shape (N, K), its format ('float32', 'bfloat16', 'q8_0', ...) and the bytes a product reads."""
    if isinstance(weight, QuantizedWeight):
        return torch.Size(weight.shape), weight.format, weight.nbytes()
    return weight.shape, str(weight.dtype)[6:], weight.numel() * weight.element_size()


class TorchProduct:
    """A weight (N, K) and its product by x (T, K) with F.linear: `product(x)` or `product(x, residual=r)`, (T, N).
    Blocks (q8_0, q4_1) are expanded to float32 first: the readable reference of their kernels."""

    def __init__(self, weight):
        self.weight = weight
        self.shape, self.format, self.weight_bytes = describe(weight)

    def __call__(self, x, residual=None):
        weight = self.weight.dequantize() if isinstance(self.weight, QuantizedWeight) else self.weight  # (N, K)
        out = F.linear(x, weight)                                        # (T, N)
        return out if residual is None else residual + out

    def operands(self, rows: int):
        return None                                                      # never run inside a compiled layer

    def numel(self) -> int:
        return self.shape.numel()

    def nbytes(self) -> int:
        """Bytes one product reads from the weight, in its storage format."""
        return self.weight_bytes

    def __repr__(self):
        return f"TorchProduct({tuple(self.shape)}, {self.format})"


class ReferenceOps:
    """Plain torch operations; paged attention by `backend` (a module or object with write_kv and attention)."""

    name = "reference"

    def __init__(self, backend):
        self.backend = backend

    def product(self, weight, alone: bool = False) -> TorchProduct:
        """The product by a weight (N, K), a tensor or quantised blocks, for every row count (`alone`: multiplied
        on its own, outside the layers, as the LM head is; one routine here for every product)."""
        return TorchProduct(weight)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x (T, C) scaled to unit root-mean-square, computed in float32 as Llama does, times weight (C,).

        In float32 it is bit for bit transformers' x * rsqrt(mean(x^2) + eps) * weight; in lower precisions
        transformers rounds before the weight multiplies, so the weight stays apart.
        """
        if x.dtype == torch.float32:
            return F.rms_norm(x, weight.shape, weight, eps)
        return weight * F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype)

    def rotary_write_kv(self, qkv, positions, cos, signed_sin, k_cache, v_cache, slot_mapping, num_heads):
        """Rotated queries (T, Hq, D) of the fused q|k|v rows (T, (Hq + 2 Hkv) D); the rotated keys and the
        values go to their cache slots. cos, signed_sin: (P, D) tables, looked up by positions (T,)."""
        T, Hkv, D = qkv.shape[0], k_cache.shape[2], k_cache.shape[3]
        qk, v = qkv.split([(num_heads + Hkv) * D, Hkv * D], dim=-1)
        qk = qk.reshape(T, num_heads + Hkv, D)                           # (T, Hq + Hkv, D)
        # rotate_half(x) * sin == roll(x, D/2) * signed_sin: q and k rotated together
        qk = qk * cos[positions][:, None] + qk.roll(D // 2, dims=-1) * signed_sin[positions][:, None]
        self.backend.write_kv(qk[:, num_heads:], v.reshape(T, Hkv, D), k_cache, v_cache, slot_mapping)
        return qk[:, :num_heads]                                         # (T, Hq, D)

    def attention(self, q, k_cache, v_cache, meta, scale):
        """Each query row (T, Hq, D) attends causally to its own sequence's cached K/V: (T, Hq, D)."""
        return self.backend.attention(q, k_cache, v_cache, meta, scale)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """SwiGLU of the fused gate|up rows (T, 2 I): silu(gate) * up, (T, I)."""
        gate, up = gate_up.chunk(2, dim=-1)                              # (T, I) each
        return F.silu(gate) * up

    def decoder_layers(self, model, x, layers, kv_cache, step):
        """x (T, C) through `layers`, one after another (`model.decoder_layer`); returns (T, C)."""
        for layer, k_cache, v_cache in zip(layers, kv_cache.k, kv_cache.v):
            x = model.decoder_layer(x, layer, k_cache, v_cache, step)
        return x
