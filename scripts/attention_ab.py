"""Time the attention backends side by side on the model's shapes: a prefill and decode steps.

For each case, the same queries and the same paged cache (SmolLM2-135M's heads by default: 9 query
heads, 3 KV heads, D = 64, blocks of 16) go through `attention_backend="numba"` (`kernels.numba_cpu`)
and `"torch"` (`kernels.torch_ref`), alternating (A B A B ...); the medians of one layer's call are
printed, with the largest difference between the two outputs. The cases:

    prefill T     one sequence's first T tokens (causal: row j sees keys 0..j)
    decode B x C  B sequences of one new token each, C tokens in the cache

    python scripts/attention_ab.py [--prefill 128 512] [--decode 1x500 8x48 32x80] [--dtype float32] [--reps 15]
"""
import argparse
import statistics
import time

import torch

from minibatch.engine.kernels import AttentionMetadata, numba_cpu, torch_ref

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 16


def case(query_lens, context_lens, dtype):
    """Random queries (T, Hq, D) and a cache holding every sequence's context in blocks of its own."""
    tables, next_block = [], 0
    for context in context_lens:
        blocks = -(-context // BLOCK_SIZE)
        tables.append(list(range(next_block, next_block + blocks)))
        next_block += blocks
    generator = torch.Generator().manual_seed(0)
    random = lambda *shape: torch.randn(*shape, generator=generator).to(dtype)
    query = random(sum(query_lens), HEADS, HEAD_DIM)                               # (T, Hq, D)
    k_cache = random(next_block, BLOCK_SIZE, KV_HEADS, HEAD_DIM)                   # (N, bs, Hkv, D)
    v_cache = random(next_block, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    meta = lambda: AttentionMetadata.build(query_lens, context_lens, tables, "cpu")  # fresh: no cached plans
    return query, k_cache, v_cache, meta


def time_ms(backend, query, k_cache, v_cache, meta) -> float:
    start = time.perf_counter()
    backend.attention(query, k_cache, v_cache, meta, HEAD_DIM ** -0.5)
    return (time.perf_counter() - start) * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefill", type=int, nargs="*", default=[128, 512], help="prompt lengths")
    parser.add_argument("--decode", nargs="*", default=["1x500", "8x48", "32x80"], help="sequences x context")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    cases = [(f"prefill {t}", [t], [t]) for t in args.prefill]
    for spec in args.decode:
        seqs, context = (int(n) for n in spec.split("x"))
        cases.append((f"decode {seqs} x {context}", [1] * seqs, [context] * seqs))
    backends = {"numba": numba_cpu, "torch": torch_ref}
    print(f"one layer's attention, {args.dtype}, {torch.get_num_threads()} threads, median of {args.reps} (ms)")
    print(f"{'case':<20}" + "".join(f"{name:>10}" for name in backends) + "   max |numba - torch|")
    for name, query_lens, context_lens in cases:
        query, k_cache, v_cache, meta = case(query_lens, context_lens, dtype)
        plans = {b: meta() for b in backends}                                       # one per backend, built once
        outs = {b: m.attention(query, k_cache, v_cache, plans[b], HEAD_DIM ** -0.5) for b, m in backends.items()}
        times = {b: [] for b in backends}
        for _ in range(args.reps):
            for b, module in backends.items():
                times[b].append(time_ms(module, query, k_cache, v_cache, plans[b]))
        diff = (outs["numba"].float() - outs["torch"].float()).abs().max().item()
        print(f"{name:<20}" + "".join(f"{statistics.median(times[b]):>10.3f}" for b in backends) + f"   {diff:.1e}")


if __name__ == "__main__":
    main()
