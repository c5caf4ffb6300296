"""Up to how many rows the streamed loop multiplies a weight, before a library's GEMM takes over.

The streamed loop (`kernels.gemv_cpu`) reads each weight once for all the rows of a step, so up to a few
dozen rows it costs about one read of the weights, and inside a compiled decode layer it saves the calls
between the parts. Above some row count a GEMM that keeps blocks of the weight in cache and multiplies them
into many rows at once is faster. Where that happens depends on the machine, so the crossovers that matter
are measured on it the first time they are needed (a second or two, the two products timed in turns) and
kept in the model cache, keyed by the CPU, the thread count and the weight's kind:

    weight                       crossover
    float32, in a layer          a constant, 64 rows: a layer whose products all stream runs as one
                                 compiled call, which a GEMM's gain at a few dozen rows does not repay
    float32, on its own          measured: the largest of CANDIDATES at which the loop is no slower than
    (the LM head)                oneDNN, on a matrix of the LM head's size (nothing compiled to keep)
    bfloat16                     measured: oneDNN's GEMM wins from a few rows on where it runs on bfloat16
                                 tiles (Intel's AMX), while elsewhere the loop wins up to a few dozen (with
                                 AVX512-BF16's pair-by-pair products, `kernels.pairs_bf16`, up to 64); the
                                 loop keeps the rows while it is no more than MARGIN times slower. (Where
                                 the CPU has the tiles, a weight of whole tiles takes the engine's own tile
                                 loop instead, `kernels.tiles_bf16`, up to 64 rows: nothing to measure.)

Measurements: docs/performance.md, "Products and where each path wins".
"""
from __future__ import annotations

import json
import platform
import time

import torch

from minibatch.engine.kernels.pairs_bf16 import PAIRS

STREAM_ROWS = 64                      # the most rows the streamed loop (and a compiled layer) ever takes
CANDIDATES = (8, 16, 32, STREAM_ROWS)  # crossovers tried, each a row count the loop may stop at
MARGIN = 1.25                         # in a layer, the GEMM must be this much faster to take rows from the loop
                                      # (whose compiled layers save more than the product alone shows)
LAYER_SHAPE = (3072, 576)             # SmolLM2's gate|up: the bfloat16 measurement's matrix
HEAD_SHAPE = (49152, 576)             # SmolLM2's LM head: the float32 one's


def streamed_rows(dtype: torch.dtype, many: str, alone: bool = False) -> int:
    """Up to how many rows a weight of this dtype takes the streamed loop, when `many` takes the rest;
    `alone`: the weight is multiplied on its own, never inside a compiled layer (the LM head)."""
    if many != "onednn" or dtype not in (torch.float32, torch.bfloat16):
        return STREAM_ROWS
    if dtype == torch.bfloat16:
        kind = "bfloat16 pairs" if PAIRS else "bfloat16"       # (the loop that multiplies pair by pair is another)
        return _measured(kind, lambda: measure_crossover(torch.bfloat16, LAYER_SHAPE, MARGIN))
    if alone:
        return _measured("float32 alone", lambda: measure_crossover(torch.float32, HEAD_SHAPE, 1.0))
    return STREAM_ROWS


def _measured(kind: str, measure) -> int:
    """The crossover of this kind for this CPU and thread count: from the cache file, or measured and kept."""
    key = f"{_cpu_name()}|{torch.get_num_threads()} threads|torch {torch.__version__}|{kind}"
    cache = _cache_file()
    known = json.loads(cache.read_text()) if cache.exists() else {}
    if key not in known:
        known[key] = measure()
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(known, indent=1))
    return int(known[key])


def measure_crossover(dtype: torch.dtype, shape: tuple[int, int], margin: float, rounds: int = 5) -> int:
    """The largest of CANDIDATES up to which the streamed loop is no more than `margin` times slower than
    oneDNN's packed GEMM, for a weight of `shape` and `dtype` (best of `rounds` turns each)."""
    from minibatch.engine.ops.products import OneDNNProduct, StreamedProduct
    weight = torch.randn(shape).to(dtype)                                 # (N, K)
    streamed, onednn = StreamedProduct(weight), OneDNNProduct(weight)
    best = CANDIDATES[0]
    for rows in CANDIDATES:
        x = torch.randn(rows, shape[1]).to(dtype)                         # (T, K)
        loop, gemm = _best_time(streamed, x, rounds), _best_time(onednn, x, rounds)
        if loop > margin * gemm:
            break
        best = rows
    return best


def _best_time(product, x, rounds: int) -> float:
    product(x)                                                            # compiled and warm
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        product(x)
        times.append(time.perf_counter() - start)
    return min(times)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def _cache_file():
    from minibatch.engine.models.smollm2 import model_cache_dir
    return model_cache_dir() / "crossovers.json"
