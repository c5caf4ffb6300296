"""The build track, chapter 08: your paged attention for one sequence, run as the engine's attention.

The checker first compares the learner's `attend(query, k_cache, v_cache, block_table, context_len,
scale)` with the engine's torch reference backend on prefills, chunks of a long prompt and decodes
(with the usual wrong turns named), then serves requests on `tiny` with it as the engine's attention
(`Plugins(attention=attend)`) and checks every request's tokens against transformers.
"""
from __future__ import annotations

import torch

from minibatch.checks.core import checker

# (block size, KV heads, query heads per KV head, head dim, cached tokens before, new query rows)
SHAPES = [(4, 1, 1, 8, 0, 1), (4, 1, 1, 8, 0, 6), (4, 2, 2, 8, 5, 1), (8, 2, 3, 16, 0, 11),
          (8, 3, 3, 16, 13, 7), (16, 3, 3, 64, 40, 1), (1, 1, 4, 8, 3, 4), (32, 2, 1, 16, 33, 30)]


def reference_attend(query, k_cache, v_cache, block_table, context_len, scale):
    """The engine's torch backend on this one sequence: (Tq, Hq, D)."""
    from minibatch.engine.kernels import AttentionMetadata, torch_ref

    meta = AttentionMetadata.build([query.shape[0]], [context_len], [block_table.tolist()], query.device)
    return torch_ref.attention(query, k_cache, v_cache, meta, scale)


def _case(seed: int, block_size, num_kv_heads, group, head_dim, cached, new):
    """Random caches whose blocks of this sequence are shuffled among spare ones; its last `new` rows query."""
    gen = torch.Generator().manual_seed(seed)
    context = cached + new
    needed = -(-context // block_size)
    table = torch.randperm(needed + 3, generator=gen)[:needed]                       # (blocks,) int64
    shape = (needed + 3, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    query = 2 * torch.randn(new, num_kv_heads * group, head_dim, generator=gen)      # (Tq, Hq, D)
    return query, k_cache, v_cache, table, context, head_dim ** -0.5


def _attend_variant(query, k_cache, v_cache, table, context, scale, causal=True, kv_of_head=None):
    """Per-sequence attention with a chosen mask and head mapping, to recognise a wrong turn; (Tq, Hq, D)."""
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    num_q, num_heads = query.shape[0], query.shape[1]
    positions = torch.arange(context)
    kv_of_head = kv_of_head or (lambda h: h // (num_heads // num_kv_heads))
    heads = torch.tensor([kv_of_head(h) for h in range(num_heads)])
    keys = k_cache[table[positions // block_size], positions % block_size][:, heads]       # (L, Hq, D)
    values = v_cache[table[positions // block_size], positions % block_size][:, heads]     # (L, Hq, D)
    scores = torch.einsum("qhd,lhd->hql", query, keys) * scale                              # (Hq, Tq, L)
    if causal:
        later = positions[None, :] > (context - num_q + torch.arange(num_q))[:, None]      # (Tq, L)
        scores = scores.masked_fill(later, float("-inf"))
    return torch.einsum("hql,lhd->qhd", scores.softmax(-1), values)


def _variants(args):
    """What the usual wrong turns would return on these arguments."""
    query, k_cache, v_cache, table, context, scale = args
    num_kv_heads = k_cache.shape[2]
    return {
        "lets every query row see the whole context": _attend_variant(*args, causal=False),
        "maps query head h to KV head h % num_kv_heads": _attend_variant(*args, kv_of_head=lambda h: h % num_kv_heads),
        "forgets the scale": _attend_variant(query, k_cache, v_cache, table, context, 1.0),
    }


ADVICE = {
    "lets every query row see the whole context": "query row j sits at position context_len - Tq + j and sees "
    "only positions up to its own: mask the later ones with -inf before the softmax",
    "maps query head h to KV head h % num_kv_heads": "the group of Hq // Hkv query heads that share a KV head "
    "are neighbours: query head h reads KV head h // (Hq // Hkv)",
    "forgets the scale": "multiply the scores q . k by scale (1 / sqrt(head_dim)) before the softmax",
}


def _close(got, want) -> bool:
    return isinstance(got, torch.Tensor) and got.shape == want.shape and torch.allclose(got.float(), want, atol=1e-4,
                                                                                         rtol=1e-4)


@checker("attend(query, k_cache, v_cache, block_table, context_len, scale), as the engine's attention")
def check_attend(attend):
    from minibatch import Plugins
    from minibatch.checks.build import SCHEDULER_RUNS, _check_tokens, _engine_error, _prompts, serve

    for seed, shape in enumerate(SHAPES):
        args = _case(seed, *shape)
        shown = (f"block_size {shape[0]}, {shape[1]} KV heads x {shape[2]} query heads each, head_dim {shape[3]}, "
                 f"{shape[4]} tokens cached before {shape[5]} new query rows")
        want = reference_attend(*args)
        got = attend(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
        if _close(got, want):
            continue
        for mistake, wrong in _variants(args).items():
            if _close(got, wrong):
                raise AssertionError(f"on {shown}: your attend {mistake}: {ADVICE[mistake]}")
        described = f"shape {tuple(got.shape)}" if isinstance(got, torch.Tensor) else repr(type(got))
        raise AssertionError(f"wrong answer on {shown}: expected a tensor of shape {tuple(want.shape)} equal to the "
                             f"torch reference backend's (to 1e-4), got {described}"
                             + (f", largest difference {float((got.float() - want).abs().max()):.3g}"
                                if isinstance(got, torch.Tensor) and got.shape == want.shape else ""))
    fields, count, longest = SCHEDULER_RUNS[1]                            # chunked prompts and decodes together
    prompts = _prompts(count, longest, 30)
    outputs, _, _ = _engine_error("attention", lambda: serve(fields, prompts, Plugins(attention=attend)))
    _check_tokens(outputs, prompts, fields, "attention")
    return len(SHAPES) + 1
