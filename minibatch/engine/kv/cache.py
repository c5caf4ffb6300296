"""The KV cache tensors: one key and one value tensor per layer, laid out by block.

Each is `(num_blocks, block_size, num_kv_heads, head_dim)`. Their size per token is what caps the
batch: `2 (K and V) x layers x kv_heads x head_dim x bytes per element`.
"""
from __future__ import annotations

import torch

from minibatch.engine.kv.block_manager import blocks_for


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes of cache one token occupies across all layers (keys and values)."""
    return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def pool_blocks(num_kv_blocks: int | None, memory_bytes: int, block_size: int, bytes_per_token: int,
                max_model_len: int, max_batch_size: int) -> int:
    """Blocks in the KV pool: `num_kv_blocks` when given; else as many as `memory_bytes` holds, but no
    more than `max_batch_size` sequences of `max_model_len` tokens could ever use at once."""
    if num_kv_blocks:
        return num_kv_blocks
    most_usable = blocks_for(max_model_len, block_size) * max_batch_size   # every slot holding a full-length sequence
    return max(1, min(most_usable, memory_bytes // (bytes_per_token * block_size)))


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
