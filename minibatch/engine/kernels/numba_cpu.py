"""Paged attention on the CPU, compiled with Numba: `attention_backend="numba"`.

The torch reference gathers each sequence's keys and values into a contiguous copy before it
attends. This kernel reads them where they lie: key position p of sequence i is row
`p % block_size` of physical block `block_tables[i, p // block_size]`, so the block table is the
only indirection and nothing is copied.

One pass over the context with an online softmax, a KV block at a time (FlashAttention's tiling):
for each block we compute the scores of its keys, then update the largest score seen so far `m`,
the running sum `l` of `exp(score - m)` and the running weighted sum of values `acc`. When a block
raises `m`, `l` and `acc` are first scaled down by `exp(m_old - m_new)`, so at the end `acc / l`
equals `softmax(scores) @ V` without ever storing more than one block's scores.

Work is split over (query row, KV head) pairs with `prange`. The `group` query heads that share a
KV head (grouped-query attention: query head h reads KV head `h // group`) are computed together,
so each key and value is read from memory once for all of them. The inner products may be summed
in any order (`fastmath` reassociation), which lets the compiler vectorise them; results differ from
the torch reference only in the last bits. Query row j of sequence i sits at position
`context_lens[i] - query_lens[i] + j` and sees cache positions 0..that position, which covers
prefill, chunked prefill and decode alike. Inputs are float32 CPU tensors, handed to Numba as
zero-copy numpy views; compiled code is cached on disk (`cache=True`), so only the first process
ever pays for compilation.
"""
from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange


@njit(nogil=True, cache=True)
def _write_kv(key, value, k_cache, v_cache, slot_mapping):
    block_size = k_cache.shape[1]
    for t in range(key.shape[0]):                        # a memory copy: threads would not pay off
        block, offset = slot_mapping[t] // block_size, slot_mapping[t] % block_size
        k_cache[block, offset] = key[t]                  # (Hkv, D)
        v_cache[block, offset] = value[t]


@njit(parallel=True, nogil=True, fastmath={"reassoc", "contract"}, cache=True)
def _paged_attention(query, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale, out):
    num_rows, num_heads, head_dim = query.shape                 # query, out: (T, Hq, D)
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]  # caches: (N, bs, Hkv, D)
    group = num_heads // num_kv_heads
    seq_of_row = np.empty(num_rows, dtype=np.int64)             # (T,) the sequence each query row belongs to
    for seq in range(context_lens.shape[0]):
        seq_of_row[query_start_loc[seq]:query_start_loc[seq + 1]] = seq
    for pair in prange(num_rows * num_kv_heads):
        row, kv_head = pair // num_kv_heads, pair % num_kv_heads
        seq = seq_of_row[row]
        visible = context_lens[seq] - (query_start_loc[seq + 1] - row) + 1  # causal: keys 0..own position
        first_head = kv_head * group                            # query heads first_head.. share this KV head
        m = np.full(group, -np.inf, dtype=np.float32)           # (group,) running max score
        l = np.zeros(group, dtype=np.float32)                   # (group,) running sum of weights
        acc = np.zeros((group, head_dim), dtype=np.float32)     # (group, D) running sum of weight * value
        scores = np.empty((group, block_size), dtype=np.float32)  # (group, bs) one block's scores
        for first in range(0, visible, block_size):
            block = block_tables[seq, first // block_size]
            n = min(block_size, visible - first)                # keys of this block the row may see
            for g in range(group):
                block_max = -np.inf
                for j in range(n):
                    score = np.float32(0.0)
                    for d in range(head_dim):
                        score += query[row, first_head + g, d] * k_cache[block, j, kv_head, d]
                    scores[g, j] = score * scale
                    block_max = max(block_max, scores[g, j])
                new_m = max(m[g], block_max)
                correction = np.exp(m[g] - new_m)               # rescale what was summed (exp(-inf) = 0 at first)
                l[g] *= correction
                for d in range(head_dim):
                    acc[g, d] *= correction
                m[g] = new_m
                for j in range(n):
                    weight = np.exp(scores[g, j] - new_m)
                    l[g] += weight
                    for d in range(head_dim):
                        acc[g, d] += weight * v_cache[block, j, kv_head, d]
        for g in range(group):
            for d in range(head_dim):
                out[row, first_head + g, d] = acc[g, d] / l[g]


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
