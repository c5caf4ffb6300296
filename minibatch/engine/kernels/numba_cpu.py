"""Paged attention on the CPU, compiled with Numba: `attention_backend="numba"`.

The torch reference gathers each sequence's keys and values into a contiguous copy before it
attends. This kernel reads them where they lie: key position p of sequence i is row
`p % block_size` of physical block `block_tables[i, p // block_size]`, so the block table is the
only indirection and nothing is copied.

One pass over the context with an online softmax: walking the keys in order we keep the largest
score seen so far `m`, the running sum `l` of `exp(score - m)` and the running weighted sum of
values `acc`. When a new key beats `m`, `l` and `acc` are scaled down by `exp(m_old - m_new)`,
so at the end `acc / l` equals `softmax(scores) @ V` without ever storing the scores.

Work is split over (sequence, query head) pairs with `prange`; query head h reads KV head
`h // group` (grouped-query attention). Query row j of sequence i sits at position
`context_lens[i] - query_lens[i] + j` and sees cache positions 0..that position, which covers
prefill, chunked prefill and decode alike. Inputs are float32 CPU tensors, handed to Numba as
zero-copy numpy views; compiled code is cached on disk (`cache=True`), so only the first process
ever pays for compilation.
"""
from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange


@njit(cache=True)
def _write_kv(key, value, k_cache, v_cache, slot_mapping):
    block_size = k_cache.shape[1]
    for t in range(key.shape[0]):                        # a memory copy: threads would not pay off
        block, offset = slot_mapping[t] // block_size, slot_mapping[t] % block_size
        k_cache[block, offset] = key[t]                  # (Hkv, D)
        v_cache[block, offset] = value[t]


@njit(parallel=True, fastmath=False, cache=True)
def _paged_attention(query, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale, out):
    num_heads, head_dim = query.shape[1], query.shape[2]       # query, out: (T, Hq, D)
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]  # caches: (N, bs, Hkv, D)
    group = num_heads // num_kv_heads
    num_seqs = context_lens.shape[0]
    for pair in prange(num_seqs * num_heads):
        seq, head = pair // num_heads, pair % num_heads
        kv_head = head // group
        first_row = query_start_loc[seq]
        query_len = query_start_loc[seq + 1] - first_row
        first_pos = context_lens[seq] - query_len          # position of the sequence's first query row
        acc = np.empty(head_dim, dtype=np.float32)         # (D,) running sum of weight * value
        for j in range(query_len):
            row = first_row + j
            m, l = -np.inf, 0.0                            # running max score, running sum of weights
            acc[:] = 0.0
            for pos in range(first_pos + j + 1):           # causal: keys 0..own position
                block = block_tables[seq, pos // block_size]
                offset = pos % block_size
                score = 0.0
                for d in range(head_dim):
                    score += query[row, head, d] * k_cache[block, offset, kv_head, d]
                score *= scale
                if score > m:                              # new maximum: rescale what we summed so far
                    correction = np.exp(m - score)         # exp(-inf) = 0 on the first key
                    l *= correction
                    for d in range(head_dim):
                        acc[d] *= correction
                    m = score
                weight = np.exp(score - m)
                l += weight
                for d in range(head_dim):
                    acc[d] += weight * v_cache[block, offset, kv_head, d]
            for d in range(head_dim):
                out[row, head, d] = acc[d] / l


def _host_view(tensor: torch.Tensor, name: str) -> np.ndarray:
    """Zero-copy numpy view of a CPU tensor (contiguous, so one compiled signature serves all)."""
    if tensor.device.type != "cpu":
        raise ValueError(
            f"attention_backend='numba' runs on the CPU, but {name} is on {tensor.device}: "
            "use attention_backend='numba-cuda' or 'torch' on a GPU"
        )
    if tensor.is_floating_point() and tensor.dtype != torch.float32:
        raise ValueError(
            f"attention_backend='numba' supports float32 only, but {name} is {tensor.dtype}: "
            "use dtype='float32' or attention_backend='torch'"
        )
    return tensor.detach().contiguous().numpy()


def write_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    """Store key, value (T, Hkv, D) into the flat slots `slot_mapping` (T,) of the (N, bs, Hkv, D) caches."""
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not cache.is_contiguous():
            raise ValueError(f"{name} must be contiguous: the kernel writes into it in place")
    slots = _host_view(slot_mapping, "slot_mapping")   # (T,) int64
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    if len(slots) and not (0 <= slots.min() and slots.max() < num_slots):
        raise ValueError(
            f"slot_mapping holds slots {slots.min()}..{slots.max()}, outside the cache's 0..{num_slots - 1}"
        )
    _write_kv(_host_view(key, "key"), _host_view(value, "value"),
              _host_view(k_cache, "k_cache"), _host_view(v_cache, "v_cache"), slots)


def check_metadata(meta, k_cache) -> None:
    """Numba does not check bounds, so refuse metadata that would read outside the cache."""
    query_lens, context_lens, tables = meta.query_lens_np, meta.context_lens_np, meta.block_tables_np
    if np.any(context_lens < query_lens):
        raise ValueError(f"context_lens {context_lens} must be >= query_lens {query_lens}: "
                         "the cache must already hold each step's new tokens")
    if np.any(context_lens > tables.shape[1] * k_cache.shape[1]):
        raise ValueError(f"context_lens {context_lens} exceed the block tables' "
                         f"{tables.shape[1]} blocks x {k_cache.shape[1]} tokens")
    if tables.size and not (0 <= tables.min() and tables.max() < k_cache.shape[0]):
        raise ValueError(f"block_tables hold ids {tables.min()}..{tables.max()}, "
                         f"outside the cache's 0..{k_cache.shape[0] - 1}")


def attention(query, k_cache, v_cache, meta, scale):
    """Causal attention of packed queries (T, Hq, D) over each sequence's paged K/V; returns (T, Hq, D)."""
    if "numba_checked" not in meta.cache:                # once per step, not once per layer
        check_metadata(meta, k_cache)
        meta.cache["numba_checked"] = True
    out = torch.empty(query.shape, dtype=torch.float32)  # (T, Hq, D), filled in place by the kernel
    _paged_attention(_host_view(query, "query"), _host_view(k_cache, "k_cache"), _host_view(v_cache, "v_cache"),
                     meta.block_tables_np, meta.query_start_loc_np, meta.context_lens_np, float(scale),
                     _host_view(out, "out"))
    return out
