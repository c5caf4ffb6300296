"""Which product of a few rows by a weight is fastest, and what bounds it? The model's own products, timed.

Feeds docs/performance.md, sections "Streamed products", "Blocks of rows", "bfloat16", "Quantised
products", "Wide vectors" and "Products and where each path wins". Three measurements:

    paths    every routine the fast path's table chooses from (`engine.ops.products.ROUTINES`): F.linear
             (`torch`, the reference's product), oneDNN with the weight prepacked (where torch has it), the
             streamed loop (`gemv_cpu.streamed_linear`) and, in bfloat16 on a CPU with AMX, the tiles
             (`tiles_bf16.tiled_linear`), each at every row count, then the table's own
             choice (`Product`), for one step's products of the 30 layers (each read from memory once, as
             in a real step) and the LM head, with the largest difference from F.linear's head
    formats  float32, bfloat16, q8_0 and q4_1 weights as the fast path multiplies them (`Product`): one
             step's products, the bytes they read, the bandwidth that makes, the memory bound (bytes / this
             machine's copy bandwidth) and the share of it reached
    blocks   the q8_0 and q4_1 products alone (`Product`), weight in the second-level cache (one 1024-row
             weight again and again) and from memory (96 weights of 3072 rows in turn), in GFLOP/s against
             this machine's float32 matrix-product peak: near `cache` from memory, the arithmetic bounds
             the product; far below it, the memory does
    rates    the streamed loop's multiply-adds per second with its weight in the second-level cache (one
             1024-row weight again and again: its arithmetic alone) and read from memory (64 weights of
             3072 rows in turn); where the two are close the arithmetic sets the pace, where `memory` is far
             below `cache` the memory does (each call includes `streamed_linear`'s few microseconds of
             wrapper)

    python -m minibatch.bench.experiments.products paths [--dtype bfloat16] [--rows 1 8 32] [--products down]
    python -m minibatch.bench.experiments.products formats [--rows 1 8 32]
    python -m minibatch.bench.experiments.products rates [--rows 1 8 16 32 64]
    python -m minibatch.bench.experiments.products blocks [--rows 1 2 4]
"""
from __future__ import annotations

import argparse

import torch

from minibatch.bench.experiments import (PRODUCTS, check_positive, fused_weights, interleaved, milliseconds,
                                         threads_line)
from minibatch.bench.roofline import memory_bandwidth, peak_flops
from minibatch.engine.kernels.bfloat16 import host_view
from minibatch.engine.kernels.gemv_cpu import streamed_linear
from minibatch.engine.models import load_model
from minibatch.engine.models.quantized import quantize_q4_1, quantize_q8_0
from minibatch.engine.ops.products import ROUTINES, Product, onednn_supports, takes_tiles


class Streamed:
    """The streamed loop alone, at any row count: x (T, K) -> (T, N) through `gemv_cpu.streamed_linear`."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight
        self.plain = host_view(weight.contiguous())                 # (N, K) float32, or bfloat16 as its bits

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return streamed_linear(x, self.plain)


def step_runner(layers: list[dict], head, x_in: torch.Tensor, x_mid: torch.Tensor, products=PRODUCTS):
    """One step's products: the named products of every layer (down takes the (T, I) input), or the head."""
    inputs = {"qkv": x_in, "o": x_in, "gate_up": x_in, "down": x_mid}

    def run_layers():
        for layer in layers:
            for name in products:
                layer[name](inputs[name])
    return run_layers, (lambda: head(x_in))


def paths(args) -> None:
    dtype = getattr(torch, args.dtype)
    loaded = load_model(args.model)
    sd = loaded.state_dict
    weights = fused_weights(sd, loaded.config.num_hidden_layers, dtype)
    head_weight = sd["lm_head.weight"].to(dtype).contiguous()                     # (V, C)
    hidden, inner = weights[0]["down"].shape                                      # (C, I)
    names = (["torch"] + (["onednn"] if onednn_supports(head_weight) else []) + ["streamed"]
             + (["tiles"] if takes_tiles(head_weight) else []) + ["table"])
    make = ROUTINES | {"table": Product}                                         # name -> weight -> routine
    layers = {p: [{k: make[p](w) for k, w in layer.items()} for layer in weights] for p in names}
    heads = {p: Product(head_weight, alone=True) if p == "table" else make[p](head_weight)    # the table: as the
             for p in names}                                                      # engine builds it
    print(f"{args.model}, {args.dtype}, {threads_line()}: median ms of {args.reps} interleaved rounds, one step's "
          f"products ({', '.join(args.products)} of {len(weights)} layers) + the LM head")
    print(f"{'rows':>5} " + " ".join(f"{p:>21}" for p in names) + f" {'max |diff|':>11}")
    with torch.inference_mode():
        for rows in args.rows:
            x_in = torch.randn(rows, hidden, dtype=dtype)                          # (T, C)
            x_mid = torch.randn(rows, inner, dtype=dtype)                          # (T, I)
            arms = {}
            for p in names:
                arms[p, "layers"], arms[p, "head"] = step_runner(layers[p], heads[p], x_in, x_mid, args.products)
            ms = interleaved(arms, args.reps)
            reference = heads["torch"](x_in).float()                              # (T, V)
            diff = max((heads[p](x_in).float() - reference).abs().max().item() for p in names)
            print(f"{rows:>5} " + " ".join(f"{ms[p, 'layers']:>11.1f} + {ms[p, 'head']:>4.1f} ms" for p in names)
                  + f" {diff:>11.1e}")


def formats(args) -> None:
    loaded = load_model(args.model)
    sd = loaded.state_dict
    weights = fused_weights(sd, loaded.config.num_hidden_layers, torch.float32)
    head_weight = sd["lm_head.weight"].float().contiguous()
    make = {"float32": Product, "bfloat16": lambda w, alone=False: Product(w.to(torch.bfloat16), alone),
            "q8_0": lambda w, alone=False: Product(quantize_q8_0(w), alone),
            "q4_1": lambda w, alone=False: Product(quantize_q4_1(w), alone)}      # each as the fast path stores it
    dtypes = {f: torch.bfloat16 if f == "bfloat16" else torch.float32 for f in make}   # the rows each multiplies
    steps = {f: ([{k: m(w) for k, w in layer.items()} for layer in weights], m(head_weight, alone=True))
             for f, m in make.items()}                                            # the head as the engine builds it
    read = {f: sum(p.nbytes() for layer in layers for p in layer.values()) + head.nbytes()
            for f, (layers, head) in steps.items()}                               # bytes one step reads
    bandwidth = memory_bandwidth()
    hidden, inner = weights[0]["down"].shape                                      # (C, I)
    print(f"{args.model}, {threads_line()}, copy bandwidth {bandwidth / 1e9:.1f} GB/s: one step's products, "
          f"median of {args.reps} interleaved rounds")
    print(f"{'format':>8} {'rows':>4} {'layers + head':>18} {'MB read':>8} {'GB/s':>6} {'bound ms':>9} "
          f"{'of bound':>8} {'max |diff|':>11}")
    with torch.inference_mode():
        for rows in args.rows:
            x_in, x_mid = torch.randn(rows, hidden), torch.randn(rows, inner)     # (T, C), (T, I)
            arms = {}
            for f, (layers, head) in steps.items():
                arms[f, "layers"], arms[f, "head"] = step_runner(layers, head, x_in.to(dtypes[f]),
                                                                 x_mid.to(dtypes[f]))
            ms = interleaved(arms, args.reps)
            reference = steps["float32"][1](x_in)                                 # (T, V)
            for f, (_, head) in steps.items():
                seconds = (ms[f, "layers"] + ms[f, "head"]) / 1e3
                diff = (head(x_in.to(dtypes[f])).float() - reference).abs().max().item()
                bound = read[f] / bandwidth
                print(f"{f:>8} {rows:>4} {ms[f, 'layers']:>8.1f} + {ms[f, 'head']:>4.1f} ms {read[f] / 1e6:>8.1f} "
                      f"{read[f] / seconds / 1e9:>6.1f} {bound * 1e3:>9.1f} {bound / seconds:>8.0%} {diff:>11.1e}")


def rate(rows: int, num_outputs: int, calls: int, num_weights: int, columns: int) -> float:
    """Multiply-adds per second of `calls` streamed products of `rows` rows, taking num_weights weights in turn
    (the best of three timings); checked against torch's product first."""
    generator = torch.Generator().manual_seed(0)
    weights = [Streamed(torch.rand(num_outputs, columns, generator=generator)) for _ in range(num_weights)]  # (N, K)
    x = torch.rand(rows, columns, generator=generator)                                                       # (T, K)
    if not torch.allclose(weights[0](x), x @ weights[0].weight.T, rtol=1e-4, atol=1e-3):
        raise AssertionError("the streamed product differs from torch's")

    def calls_in_turn():
        for call in range(calls):
            weights[call % num_weights](x)
    best = min(milliseconds(calls_in_turn) for _ in range(3)) / 1e3
    return rows * num_outputs * columns * calls / best


def rates(args) -> None:
    columns = args.columns
    print(f"the streamed product, float32, {columns} columns, {threads_line()}; best of 3")
    print(f"{'rows':>5} {'cache GFMA/s':>13} {'GB/s':>6} {'memory GFMA/s':>14} {'GB/s':>6}")
    with torch.inference_mode():
        for rows in args.rows:
            cache = rate(rows, 1024, 2000, 1, columns)                 # 2.4 MB at 576 columns: half per thread
            memory = rate(rows, 3072, 300, 64, columns)                # 64 x 7 MB: every weight from memory
            print(f"{rows:>5} {cache / 1e9:>13.1f} {cache * 4 / rows / 1e9:>6.1f} "
                  f"{memory / 1e9:>14.1f} {memory * 4 / rows / 1e9:>6.1f}")


def blocks(args) -> None:
    """The quantised products alone: GFLOP/s with the weight in cache and from memory, against the peak."""
    columns, generator = args.columns, torch.Generator().manual_seed(0)
    peak = peak_flops()
    print(f"q8_0 and q4_1 products (`Product`), {columns} columns, {threads_line()}, float32 matrix-product peak "
          f"{peak / 1e9:.0f} GFLOP/s; median ms of {args.reps} interleaved rounds")
    print(f"{'format':>6} {'rows':>4} {'cache GFLOP/s':>13} {'memory GFLOP/s':>14} {'memory GB/s':>11} "
          f"{'of peak':>8} {'max |diff|':>11}")
    with torch.inference_mode():
        for name, quantize in (("q8_0", quantize_q8_0), ("q4_1", quantize_q4_1)):
            small = quantize(torch.randn(1024, columns, generator=generator))              # fits the L2 cache
            large = [quantize(torch.randn(3072, columns, generator=generator)) for _ in range(96)]  # 100+ MB
            in_cache, from_memory = Product(small), [Product(w) for w in large]
            for rows in args.rows:
                x = torch.randn(rows, columns, generator=generator)                        # (T, K)
                calls = 32
                ms = interleaved({"cache": lambda: [in_cache(x) for _ in range(calls * 3)],
                                  "memory": lambda: [p(x) for p in from_memory]}, args.reps)
                cache = 2 * rows * 1024 * columns * calls * 3 / (ms["cache"] / 1e3)
                memory = 2 * rows * 3072 * columns * len(large) / (ms["memory"] / 1e3)
                gbs = sum(w.nbytes() for w in large) / (ms["memory"] / 1e3) / 1e9
                diff = (in_cache(x) - x @ small.dequantize().T).abs().max().item()
                print(f"{name:>6} {rows:>4} {cache / 1e9:>13.1f} {memory / 1e9:>14.1f} {gbs:>11.1f} "
                      f"{cache / peak:>8.1%} {diff:>11.1e}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minibatch.bench.experiments.products",
                                     description=__doc__.splitlines()[0])
    what = parser.add_subparsers(dest="what", required=True)
    p = what.add_parser("paths", help="every product path at each row count (layers + LM head)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--products", nargs="+", choices=PRODUCTS, default=list(PRODUCTS),
                   help="which of each layer's products to time (all four by default)")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
    f = what.add_parser("formats", help="float32, q8_0 and q4_1 products against their memory bound")
    f.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    for sub in (p, f):
        sub.add_argument("--model", default="smollm2-135m")
    b = what.add_parser("blocks", help="the q8_0 and q4_1 products, weight in cache and from memory")
    b.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4])
    for sub in (p, f, b):
        sub.add_argument("--reps", type=int, default=7, help="interleaved rounds; medians are printed")
    r = what.add_parser("rates", help="the streamed loop's rate, weight in cache and from memory")
    r.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    for sub in (r, b):
        sub.add_argument("--columns", type=int, default=576, help="the weights' columns (SmolLM2's hidden size)")
    args = parser.parse_args(argv)
    check_positive(parser, "rows", args.rows)
    if args.what in ("rates", "blocks"):
        check_positive(parser, "columns", [args.columns])
    if args.what != "rates":
        check_positive(parser, "reps", [args.reps])
    {"paths": paths, "formats": formats, "rates": rates, "blocks": blocks}[args.what](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
