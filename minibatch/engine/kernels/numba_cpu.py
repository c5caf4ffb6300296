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
so each key and value is read from memory once for all of them. The loops are written in
eight-float vectors (`kernels.lanes`): a block's scores eight keys at a time, the query's vector
loaded once for all eight (`_block_scores`); the weights exp(score - m) eight at a time (`exp8`,
where scalar `np.exp` calls the C library once per score); the weighted values 32 columns at a
time, held in four registers while the block's keys go by, so each value is loaded once and no
running sum goes back to memory between keys (`_add_weighted_values`). Results differ from the
torch reference only in the last bits (the order of the additions).

Threads take contiguous shares of the pairs, and in a causal prefill a row sees as many keys as its
position: in row order the thread with the later rows would have three times the work of the other. So
the rows are taken from both ends in turn (0, T-1, 1, T-2, ...) and every share holds as much work.

A block's largest score and the sum of its weights are each a chain of additions (or comparisons)
one after another; where the block's keys fill whole vectors they are taken eight lanes at a time
(`_largest`, and the weights summed as they are computed). Each query head's steps on a block depend
on one another (its scores, their largest, the weights, the weighted values), but the `group` heads'
steps do not: taken step after step (the scores of every head of the group, then every head's weights,
then their values) the heads' work on each step sits side by side and overlaps, where one head's whole
chain is too long for the CPU to start the next head's while it waits. From a few hundred tokens of
prefill on, torch's gathered attention (one matrix product for all the rows) stays ahead of this kernel.

Query row j of sequence i sits at position
`context_lens[i] - query_lens[i] + j` and sees cache positions 0..that position, which covers
prefill, chunked prefill and decode alike. Inputs are float32 or bfloat16 CPU tensors, handed to
Numba as zero-copy numpy views (bfloat16 as its bits, widened to float32 as it is read: scores,
softmax and sums are float32, the output is rounded to the query's dtype, `kernels.bfloat16`);
compiled code is cached on disk (`cache=True`), so only the first process ever pays for compilation (and the
first after an edit of a file it compiles in, `kernels.stale_cache`).

Measurements: docs/performance.md, section "Paged attention on the CPU".
"""
from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from minibatch.engine.kernels import bfloat16, lanes
from minibatch.engine.kernels.bfloat16 import get, host_view, put, supported
from minibatch.engine.kernels.lanes import LANES, exp8, fma8, lane, load8, max8, splat8, store8, sum8, sums8, zero8
from minibatch.engine.kernels.stale_cache import forget_stale


@njit(nogil=True, cache=True)
def _write_kv(key, value, k_cache, v_cache, slot_mapping):
    """key, value (T, Hkv, D) into the caches (N, bs, Hkv, D): token t at flat slot slot_mapping[t]."""
    block_size = k_cache.shape[1]
    for t in range(key.shape[0]):                        # a memory copy: threads would not pay off
        block, offset = slot_mapping[t] // block_size, slot_mapping[t] % block_size
        k_cache[block, offset] = key[t]                  # (Hkv, D)
        v_cache[block, offset] = value[t]


@njit(inline="always")
def _dot(queries, q_row, keys, k_row, vector_end):
    """queries[q_row] . keys[k_row]: eight columns at a time, then the last D % 8 one by one."""
    total = zero8()
    for c in range(0, vector_end, LANES):
        total = fma8(load8(queries, q_row, c), load8(keys, k_row, c), total)
    score = sum8(total)
    for d in range(vector_end, queries.shape[1]):
        score += get(queries, (q_row, d)) * get(keys, (k_row, d))
    return score


@njit(inline="always")
def _block_scores(queries, q_row, keys, first_k_row, k_step, n, block_size, vector_end, scale, scores, g):
    """scores[g, :n] = scale * (queries[q_row] . key j), key j at keys[first_k_row + j * k_step], j < n."""
    j = 0
    while j < n and j + LANES <= block_size:   # eight keys at once: the query's vector is loaded once for all
        k_row = first_k_row + j * k_step        # (keys past n but inside the block are read and ignored)
        s0, s1, s2, s3, s4, s5, s6, s7 = zero8(), zero8(), zero8(), zero8(), zero8(), zero8(), zero8(), zero8()
        for c in range(0, vector_end, LANES):
            q = load8(queries, q_row, c)
            s0 = fma8(q, load8(keys, k_row, c), s0)
            s1 = fma8(q, load8(keys, k_row + k_step, c), s1)
            s2 = fma8(q, load8(keys, k_row + 2 * k_step, c), s2)
            s3 = fma8(q, load8(keys, k_row + 3 * k_step, c), s3)
            s4 = fma8(q, load8(keys, k_row + 4 * k_step, c), s4)
            s5 = fma8(q, load8(keys, k_row + 5 * k_step, c), s5)
            s6 = fma8(q, load8(keys, k_row + 6 * k_step, c), s6)
            s7 = fma8(q, load8(keys, k_row + 7 * k_step, c), s7)
        store8(scores, g, j, sums8(s0, s1, s2, s3, s4, s5, s6, s7) * splat8(scale))
        for d in range(vector_end, queries.shape[1]):         # the last D % 8 columns, key by key
            for i in range(LANES):
                scores[g, j + i] += scale * get(queries, (q_row, d)) * get(keys, (k_row + i * k_step, d))
        j += LANES
    for j in range(j, n):                                     # blocks of fewer than eight keys
        scores[g, j] = scale * _dot(queries, q_row, keys, first_k_row + j * k_step, vector_end)


@njit(inline="always")
def _largest(scores, g, n):
    """max(scores[g, :n]) for n a multiple of eight: eight lanes at a time, then the eight lanes in a tree."""
    top = load8(scores, g, 0)
    for j in range(LANES, n, LANES):
        top = max8(top, load8(scores, g, j))
    return max(max(max(lane(top, 0), lane(top, 1)), max(lane(top, 2), lane(top, 3))),
               max(max(lane(top, 4), lane(top, 5)), max(lane(top, 6), lane(top, 7))))


@njit(inline="always")
def _add_weighted_values(acc, g, correction, scores, values, first_v_row, v_step, n, vector_end):
    """acc[g] = correction * acc[g] + sum_{j < n} scores[g, j] * values[first_v_row + j * v_step]."""
    scale = splat8(correction)
    c = 0
    while c + 4 * LANES <= vector_end:      # 32 columns held in four registers while the keys go by
        a0, a1 = load8(acc, g, c) * scale, load8(acc, g, c + LANES) * scale
        a2, a3 = load8(acc, g, c + 2 * LANES) * scale, load8(acc, g, c + 3 * LANES) * scale
        for j in range(n):
            w, row = splat8(scores[g, j]), first_v_row + j * v_step
            a0 = fma8(w, load8(values, row, c), a0)
            a1 = fma8(w, load8(values, row, c + LANES), a1)
            a2 = fma8(w, load8(values, row, c + 2 * LANES), a2)
            a3 = fma8(w, load8(values, row, c + 3 * LANES), a3)
        store8(acc, g, c, a0)
        store8(acc, g, c + LANES, a1)
        store8(acc, g, c + 2 * LANES, a2)
        store8(acc, g, c + 3 * LANES, a3)
        c += 4 * LANES
    for c in range(c, vector_end, LANES):    # the last columns eight at a time
        a0 = load8(acc, g, c) * scale
        for j in range(n):
            a0 = fma8(splat8(scores[g, j]), load8(values, first_v_row + j * v_step, c), a0)
        store8(acc, g, c, a0)
    for d in range(vector_end, acc.shape[1]):
        total = acc[g, d] * correction
        for j in range(n):
            total += scores[g, j] * get(values, (first_v_row + j * v_step, d))
        acc[g, d] = total


@njit(parallel=True, nogil=True, cache=True)
def _paged_attention(query, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale, out):
    """out (T, Hq, D): every query row attends causally to its sequence's cached keys, read in place through the
    block table, one KV block at a time with an online softmax; threads over (row, KV head) pairs."""
    num_rows, num_heads, head_dim = query.shape                 # query, out: (T, Hq, D)
    num_blocks, block_size, num_kv_heads = k_cache.shape[:3]    # caches: (N, bs, Hkv, D)
    group = num_heads // num_kv_heads
    vector_end = head_dim - head_dim % LANES                    # columns taken eight at a time
    queries = query.reshape(num_rows * num_heads, head_dim)     # (T Hq, D): head h of row t at t Hq + h
    keys = k_cache.reshape(num_blocks * block_size * num_kv_heads, head_dim)  # (N bs Hkv, D): (b bs + j) Hkv + h
    values = v_cache.reshape(num_blocks * block_size * num_kv_heads, head_dim)
    outs = out.reshape(num_rows * num_heads, head_dim)
    padded = (block_size + LANES - 1) // LANES * LANES
    seq_of_row = np.empty(num_rows, dtype=np.int64)             # (T,) the sequence each query row belongs to
    for seq in range(context_lens.shape[0]):
        seq_of_row[query_start_loc[seq]:query_start_loc[seq + 1]] = seq
    for pair in prange(num_rows * num_kv_heads):
        # Rows taken from both ends in turn (0, T-1, 1, T-2, ...): a causal prefill's later rows see more
        # keys, and each thread's contiguous share of the pairs then holds as much work as the others'.
        turn, kv_head = pair // num_kv_heads, pair % num_kv_heads
        row = turn // 2 if turn % 2 == 0 else num_rows - 1 - turn // 2
        seq = seq_of_row[row]
        visible = context_lens[seq] - (query_start_loc[seq + 1] - row) + 1  # causal: keys 0..own position
        first_q_row = row * num_heads + kv_head * group         # query heads sharing this KV head: group rows on
        m = np.full(group, -np.inf, dtype=np.float32)           # (group,) running max score
        l = np.zeros(group, dtype=np.float32)                   # (group,) running sum of weights
        acc = np.zeros((group, head_dim), dtype=np.float32)     # (group, D) running sum of weight * value
        scores = np.empty((group, padded), dtype=np.float32)    # (group, bs rounded up to 8) one block's scores
        corrections = np.empty(group, dtype=np.float32)         # (group,) exp(old m - new m) of the block
        for first in range(0, visible, block_size):
            block = block_tables[seq, first // block_size]
            n = min(block_size, visible - first)                # keys of this block the row may see
            first_kv_row = block * block_size * num_kv_heads + kv_head
            whole = n % LANES == 0                              # no keys past n in the last eight
            for g in range(group):                              # the group's scores, then their weights, then
                _block_scores(queries, first_q_row + g, keys, first_kv_row, num_kv_heads, n, block_size, vector_end,
                              np.float32(scale), scores, g)         # the values: each step independent from one
            for g in range(group):                              # query head to the next, side by side
                if whole:
                    block_max = _largest(scores, g, n)
                else:
                    block_max = scores[g, 0]
                    for j in range(1, n):
                        block_max = max(block_max, scores[g, j])
                new_m = max(m[g], block_max)
                corrections[g] = np.exp(m[g] - new_m)           # rescale what was summed (exp(-inf) = 0 at first)
                m[g] = new_m
                weights = zero8()                               # (8,) the weights' running sums, lane by lane
                for j in range(0, n, LANES):                    # weights exp(score - m), eight at a time
                    e = exp8(load8(scores, g, j) - splat8(new_m))
                    store8(scores, g, j, e)
                    weights = weights + e
                total = l[g] * corrections[g]
                if whole:
                    total += sum8(weights)
                else:
                    for j in range(n):
                        total += scores[g, j]
                l[g] = total
            for g in range(group):
                _add_weighted_values(acc, g, corrections[g], scores, values, first_kv_row, num_kv_heads, n,
                                     vector_end)
        for g in range(group):
            for d in range(head_dim):
                put(outs, (first_q_row + g, d), acc[g, d] / l[g])


def _host_view(tensor: torch.Tensor, name: str) -> np.ndarray:
    """Zero-copy numpy view of a CPU tensor (contiguous, so one compiled signature serves all)."""
    if tensor.device.type != "cpu":
        raise ValueError(
            f"attention_backend='numba' runs on the CPU, but {name} is on {tensor.device}: "
            "use attention_backend='numba-cuda' or 'torch' on a GPU"
        )
    if tensor.is_floating_point() and not supported(tensor.dtype):
        raise ValueError(
            f"attention_backend='numba' supports float32 and bfloat16, but {name} is {tensor.dtype}: "
            "use dtype='float32' or 'bfloat16', or attention_backend='torch'"
        )
    return host_view(tensor.detach().contiguous())


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
    out = torch.empty(query.shape, dtype=query.dtype)    # (T, Hq, D), filled in place by the kernel
    _paged_attention(_host_view(query, "query"), _host_view(k_cache, "k_cache"), _host_view(v_cache, "v_cache"),
                     meta.block_tables_np, meta.query_start_loc_np, meta.context_lens_np, float(scale),
                     _host_view(out, "out"))
    return out


for _kernel in (_write_kv, _paged_attention):                 # the files they compile into themselves
    forget_stale(_kernel, (bfloat16, lanes))
