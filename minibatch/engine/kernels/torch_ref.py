"""The readable reference for paged attention, in plain torch.

For each sequence we gather its keys and values from the blocks its block table names into a
padded contiguous tensor, then run ordinary masked attention. Gathering copies K/V (the Numba
kernels avoid that copy by reading blocks in place), but every step is easy to follow.

GQA without copying KV: the `group` query heads that share one KV head are folded into the
query-length axis, so `(Tq, Hq, D)` becomes `(Hkv, group * Tq, D)` and attends to `(Hkv, L, D)`.
Decode sequences (one query each) and prefill sequences (many) are attended as two groups, so a
long prompt does not pad every decode row to its length.

Shapes: query (T, Hq, D), caches (N, block_size, Hkv, D), output (T, Hq, D). The Numba kernel is
measured against this reference: docs/performance.md, section "Paged attention on the CPU".
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def write_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    """Store new K/V: key, value (T, Hkv, D) into the flat slots of the (N, bs, Hkv, D) caches."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value)


def _plan(meta, seq_ids: np.ndarray, block_size: int, group: int, device) -> dict:
    """Index tensors for attending a group of sequences; computed once per step, reused per layer."""
    starts = meta.query_start_loc_np[seq_ids]
    qlens = meta.query_start_loc_np[seq_ids + 1] - starts
    ctx = meta.context_lens_np[seq_ids]
    max_q, max_ctx = int(qlens.max()), int(ctx.max())
    t = np.arange(max_q)
    rows = starts[:, None] + np.minimum(t[None, :], qlens[:, None] - 1)  # (G, max_q) packed row of each padded query
    q_pos = (ctx - qlens)[:, None] + t[None, :]                                    # (G, max_q) position of each query
    k_pos = np.arange(max_ctx)                                                     # (L,)
    blocks = meta.block_tables_np[seq_ids][:, np.minimum(k_pos // block_size, meta.block_tables_np.shape[1] - 1)]
    slots = blocks * block_size + k_pos % block_size                               # (G, L) flat cache slot of each key
    visible = k_pos[None, None, :] <= q_pos[:, :, None]                  # (G, max_q, L) causal within the sequence
    valid_rows = t[None, :] < qlens[:, None]                                       # (G, max_q) padding rows are dropped
    as_tensor = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)
    return {
        "rows": as_tensor(rows),
        "slots": as_tensor(slots),
        # (G, 1, group*max_q, L), tiled here once per step, not in every layer; None when every key is visible
        "mask": None if visible.all() else as_tensor(np.tile(visible, (1, group, 1)))[:, None],
        "out_rows": as_tensor(rows[valid_rows]),
        "valid": as_tensor(valid_rows),
    }


def _attend_group(query, k_cache, v_cache, plan, scale, out) -> None:
    """out[rows] for one group of sequences (decode or prefill): their K/V gathered from the blocks into a padded
    (G, Hkv, L, D) copy, the query heads of each KV head folded into the query axis, masked attention."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    num_seqs, max_q = plan["rows"].shape
    group = query.shape[1] // num_kv_heads
    q = query[plan["rows"]]                                                        # (G, max_q, Hq, D)
    q = q.view(num_seqs, max_q, num_kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
    q = q.reshape(num_seqs, num_kv_heads, group * max_q, head_dim)                 # (G, Hkv, group*max_q, D)
    k = k_cache.view(-1, num_kv_heads, head_dim)[plan["slots"]].transpose(1, 2)    # (G, Hkv, L, D)
    v = v_cache.view(-1, num_kv_heads, head_dim)[plan["slots"]].transpose(1, 2)    # (G, Hkv, L, D)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=plan["mask"], scale=scale)  # (G, Hkv, group*max_q, D)
    o = o.view(num_seqs, num_kv_heads, group, max_q, head_dim).permute(0, 3, 1, 2, 4)
    o = o.reshape(num_seqs, max_q, num_kv_heads * group, head_dim)                 # (G, max_q, Hq, D)
    out[plan["out_rows"]] = o[plan["valid"]].to(out.dtype)


def _attend_decode(query, k_cache, v_cache, plan, scale):
    """A step of decode tokens only (one query per sequence, in order): no gathers of rows, views only."""
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    q = query.view(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)  # (G, Hkv, group, D)
    k = k_cache.view(-1, num_kv_heads, head_dim)[plan["slots"]].transpose(1, 2)    # (G, Hkv, L, D)
    v = v_cache.view(-1, num_kv_heads, head_dim)[plan["slots"]].transpose(1, 2)    # (G, Hkv, L, D)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=plan["mask"], scale=scale)  # (G, Hkv, group, D)
    return o.reshape(num_seqs, num_heads, head_dim)                                # (G, Hq, D)


def attention(query, k_cache, v_cache, meta, scale):
    """Causal attention of packed queries (T, Hq, D) over each sequence's cached K/V; returns (T, Hq, D)."""
    if query.shape[0] == 0:
        return torch.empty_like(query)
    block_size = k_cache.shape[1]
    if "torch_plans" not in meta.cache:
        qlens = meta.query_lens_np
        groups = [np.flatnonzero(qlens == 1), np.flatnonzero(qlens > 1)]
        group = query.shape[1] // k_cache.shape[2]
        meta.cache["torch_plans"] = [_plan(meta, ids, block_size, group, query.device) for ids in groups if len(ids)]
    if (qlens := meta.query_lens_np).max() == 1 and len(qlens) == query.shape[0]:
        return _attend_decode(query, k_cache, v_cache, meta.cache["torch_plans"][0], scale)
    out = torch.empty_like(query)
    for plan in meta.cache["torch_plans"]:
        _attend_group(query, k_cache, v_cache, plan, scale, out)
    return out
