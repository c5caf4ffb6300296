"""What reading K/V in place saves: the torch reference's gather against a plain copy (chapter 08).

The torch reference attends in two moves: it gathers each sequence's keys and values from the
blocks its block table names into a contiguous tensor (a copy: every byte read once, written once),
then runs ordinary attention over that copy (every byte read again). A paged kernel skips the first
move. How much that saves is set by this machine's memory: a gather cannot beat a plain copy of the
same bytes by much, whatever the library or the number of cores. So `gather_rounds` times, in
interleaved rounds, the reference's gather alone, a plain copy of as many bytes, and the whole
attention call of each CPU backend, on one decode step of one layer with SmolLM2's attention shape.
"""
from __future__ import annotations

import math

import torch

from minibatch.analysis.claims import Rounds, interleaved
from minibatch.engine.kernels import AttentionMetadata, get_backend

GATHER, COPY = "gather K and V (s)", "copy of as many bytes (s)"


def gather_rounds(batch_size: int = 32, context_len: int = 2048, rounds: int = 5, num_kv_heads: int = 3,
                  group: int = 3, head_dim: int = 64, block_size: int = 16, seed: int = 0) -> tuple[Rounds, int]:
    """Interleaved rounds of the gather, the copy and each backend's call; returns them and the bytes gathered."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = math.ceil(context_len / block_size)
    tables = torch.randperm(batch_size * per_seq, generator=gen).view(batch_size, per_seq)  # scattered blocks
    shape = (batch_size * per_seq, block_size, num_kv_heads, head_dim)                     # (N, bs, Hkv, D)
    k_cache, v_cache = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    query = torch.randn(batch_size, num_kv_heads * group, head_dim, generator=gen)         # (B, Hq, D)
    meta = AttentionMetadata.build([1] * batch_size, [context_len] * batch_size, tables.tolist(), "cpu")
    positions = torch.arange(context_len)
    slots = tables[:, positions // block_size] * block_size + positions % block_size        # (B, L) flat cache slots
    flat_k, flat_v = (c.view(-1, num_kv_heads, head_dim) for c in (k_cache, v_cache))     # (N * bs, Hkv, D)
    src = torch.randn(2, batch_size * context_len, num_kv_heads, head_dim)                 # as many bytes, contiguous
    dst = torch.empty_like(src)
    scale = head_dim ** -0.5

    def gather() -> None:   # the reference's first move: (B, L, Hkv, D) keys and values, copied out of the blocks
        flat_k.index_select(0, slots.view(-1)), flat_v.index_select(0, slots.view(-1))

    def copy() -> None:
        dst.copy_(src)

    def attend(backend) -> None:
        backend.attention(query, k_cache, v_cache, meta, scale)

    measured = {GATHER: gather, COPY: copy}
    for name in ("torch", "numba"):
        measured[f"{name} attention call (s)"] = lambda b=get_backend(name): attend(b)
    return interleaved(measured, rounds=rounds), 2 * slots.numel() * num_kv_heads * head_dim * k_cache.element_size()
