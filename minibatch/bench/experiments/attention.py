"""Where does the Numba paged attention beat the torch reference, and where not? One layer's call, side by side.

Feeds docs/performance.md, section "Paged attention on the CPU". For each case the same queries and the
same paged cache (SmolLM2-135M's heads: 9 query heads, 3 KV heads, D = 64, blocks of 16) go through
`attention_backend="numba"` (`kernels.numba_cpu`) and `"torch"` (`kernels.torch_ref`), alternating;
the medians of one layer's call are printed, with the largest difference between the two outputs.
The cases:

    prefill T     one sequence's first T tokens (causal: row j sees keys 0..j)
    decode BxC    B sequences of one new token each, C tokens in the cache

`python -m minibatch.bench.kernels` times decode alone over a wider grid (chapter 08's table).

    python -m minibatch.bench.experiments.attention [--prefill 128 512] [--decode 1x500 8x48 32x80]
        [--dtype bfloat16] [--reps 15]
"""
from __future__ import annotations

import argparse

import torch

from minibatch.bench.experiments import check_positive, interleaved, threads_line
from minibatch.engine.kernels import AttentionMetadata, get_backend

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 16
BACKENDS = ("numba", "torch")


def case(query_lens: list[int], context_lens: list[int], dtype: torch.dtype):
    """Random queries (T, Hq, D), a cache holding every sequence's context in blocks of its own, and a maker of
    the metadata that says where they are (one for each backend: a backend keeps what it derives in it)."""
    tables, next_block = [], 0
    for context in context_lens:
        blocks = -(-context // BLOCK_SIZE)
        tables.append(list(range(next_block, next_block + blocks)))
        next_block += blocks
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(sum(query_lens), HEADS, HEAD_DIM, generator=generator).to(dtype)               # (T, Hq, D)
    k_cache = torch.randn(next_block, BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=generator).to(dtype)   # (N, bs, Hkv, D)
    v_cache = torch.randn(next_block, BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=generator).to(dtype)
    return query, k_cache, v_cache, lambda: AttentionMetadata.build(query_lens, context_lens, tables, "cpu")


def decode_case(spec: str) -> tuple[int, int]:
    """'8x48' -> (8 sequences, 48 tokens of context each)."""
    try:
        seqs, context = (int(n) for n in spec.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--decode {spec!r}: write sequences x context, e.g. 8x48") from None
    if seqs < 1 or context < 1:
        raise argparse.ArgumentTypeError(f"--decode {spec!r}: sequences and context must be at least 1")
    return seqs, context


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minibatch.bench.experiments.attention",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--prefill", type=int, nargs="*", default=[128, 512], help="prompt lengths")
    parser.add_argument("--decode", type=decode_case, nargs="*", default=[(1, 500), (8, 48), (32, 80)],
                        help="sequences x context, e.g. 8x48")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--reps", type=int, default=15, help="interleaved calls; medians are printed")
    args = parser.parse_args(argv)
    check_positive(parser, "reps", [args.reps])
    if args.prefill:
        check_positive(parser, "prefill", args.prefill)
    dtype = getattr(torch, args.dtype)
    cases = [(f"prefill {t}", [t], [t]) for t in args.prefill]
    cases += [(f"decode {seqs}x{context}", [1] * seqs, [context] * seqs) for seqs, context in args.decode]
    backends = {name: get_backend(name) for name in BACKENDS}
    print(f"one layer's attention, {args.dtype}, {threads_line()}: median ms of {args.reps} interleaved calls")
    print(f"{'case':<18}" + "".join(f"{name:>10}" for name in backends) + "   max |numba - torch|")
    with torch.inference_mode():
        for name, query_lens, context_lens in cases:
            query, k_cache, v_cache, metadata = case(query_lens, context_lens, dtype)
            calls = {b: (lambda m=m, meta=metadata(): m.attention(query, k_cache, v_cache, meta, HEAD_DIM ** -0.5))
                     for b, m in backends.items()}
            ms = interleaved(calls, args.reps)
            diff = (calls["numba"]().float() - calls["torch"]().float()).abs().max().item()
            print(f"{name:<18}" + "".join(f"{ms[b]:>10.3f}" for b in backends) + f"   {diff:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
