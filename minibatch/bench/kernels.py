"""Micro-benchmark of decode attention: each backend against the torch reference.

Decode is where paged attention spends its time: every sequence has one new query token that
attends to its whole context. `bench_decode` times one attention call (one layer) for each
backend over a grid of context lengths and batch sizes, on shapes of the default model
(3 KV heads, 9 query heads, head dim 64), with each sequence's blocks scattered over the cache.
Each point is timed with `torch.utils.benchmark`: calls run in blocks for a fixed time after warm-up
(the GPU synchronised, torch's thread count kept). It prints the median block (or the fastest) and
the ratio `torch time / backend time` (above 1: faster than torch). The metadata is reused across
calls, as the layers of one step reuse it.

    python -m minibatch.bench.kernels            # CPU: torch vs numba
"""
from __future__ import annotations

import math

import torch
from torch.utils import benchmark
from tqdm.auto import tqdm

from minibatch.engine.kernels import AttentionMetadata, get_backend


def _decode_batch(batch_size, context_len, num_kv_heads, group, head_dim, block_size, device, seed):
    """Random caches and queries for `batch_size` sequences that each decode one token."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = math.ceil(context_len / block_size)
    ids = torch.randperm(batch_size * per_seq, generator=gen).view(batch_size, per_seq).tolist()
    shape = (batch_size * per_seq, block_size, num_kv_heads, head_dim)                # (N, bs, Hkv, D)
    k_cache = torch.randn(shape, generator=gen).to(device)
    v_cache = torch.randn(shape, generator=gen).to(device)
    query = torch.randn(batch_size, num_kv_heads * group, head_dim, generator=gen).to(device)  # (B, Hq, D)
    meta = AttentionMetadata.build([1] * batch_size, [context_len] * batch_size, ids, device)
    return query, k_cache, v_cache, meta


def _seconds(fn, min_run_time_s: float, statistic: str) -> float:
    """Seconds per call of fn: the median block of calls, or the fastest block."""
    fn()                                 # compilation (Numba), first touch of memory, cached plans
    timer = benchmark.Timer("fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    measurement = timer.blocked_autorange(min_run_time=min_run_time_s)
    return min(measurement.times) if statistic == "min" else measurement.median


def bench_decode(
    device: str = "cpu",                              # "cpu": torch vs numba; "cuda": torch vs numba-cuda
    context_lens=(128, 512, 1024, 2048, 4096),        # tokens each sequence attends to
    batch_sizes=(1, 8, 32, 64),                       # sequences decoding together
    min_run_time_s: float = 0.1,                      # seconds of timed calls per point and backend
    statistic: str = "median",                        # "median" block of calls, or "min" (on a busy machine noise only adds)
    num_kv_heads: int = 3, group: int = 3, head_dim: int = 64,  # SmolLM2-135M's attention shape
    block_size: int = 16,                             # tokens per KV block
    seed: int = 0,
    extra: dict | None = None,                        # name -> another backend object timed beside (yours, in a Plugins)
) -> list[dict]:
    """Time decode attention per backend; print a table and return one row per (batch, context)."""
    if statistic not in ("median", "min"):
        raise ValueError(f"statistic={statistic!r} is not allowed: choose 'median' or 'min'")
    backends = ("torch", "numba" if device == "cpu" else "numba-cuda")
    scale = head_dim ** -0.5
    rows = []
    grid = [(b, c) for b in batch_sizes for c in context_lens]
    for batch_size, context_len in tqdm(grid, desc="decode attention"):
        query, k_cache, v_cache, meta = _decode_batch(
            batch_size, context_len, num_kv_heads, group, head_dim, block_size, device, seed)
        row = {"batch_size": batch_size, "context_len": context_len}
        for name, backend in [(n, get_backend(n)) for n in backends] + list((extra or {}).items()):
            call = lambda: backend.attention(query, k_cache, v_cache, meta, scale)  # noqa: E731
            row[f"{name}_ms"] = 1e3 * _seconds(call, min_run_time_s, statistic)
        row["speedup"] = row["torch_ms"] / row[f"{backends[1]}_ms"]
        rows.append(row)
    print(f"{'batch':>5} {'context':>7} {'torch ms':>9} {backends[1] + ' ms':>13} {'torch/' + backends[1]:>17}")
    for row in rows:
        print(f"{row['batch_size']:>5} {row['context_len']:>7} {row['torch_ms']:>9.3f} "
              f"{row[backends[1] + '_ms']:>13.3f} {row['speedup']:>17.2f}")
    return rows


if __name__ == "__main__":
    bench_decode("cuda" if torch.cuda.is_available() else "cpu")
