"""The KV cache tensors: one key and one value tensor per layer, laid out by block.

Each is `(num_blocks, block_size, num_kv_heads, head_dim)`. Their size per token is what caps the
batch: `2 (K and V) x layers x kv_heads x head_dim x bytes per element`.
"""
from __future__ import annotations

import torch


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes of cache one token occupies across all layers (keys and values)."""
    return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


class KVCache:
    """Per-layer key and value tensors of the paged cache."""

    def __init__(self, num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, device):
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]  # each (N, bs, Hkv, D)
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.bytes_per_token = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype)

    @property
    def total_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)
