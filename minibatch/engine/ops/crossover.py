"""Up to how many rows the streamed loop multiplies a weight, before a library's GEMM takes over.

The streamed loop (`kernels.gemv_cpu`) reads each weight once for all the rows of a step, so up to a few
dozen rows it costs about one read of the weights, and inside a compiled decode layer it saves the calls
between the parts. Above some row count a GEMM that keeps blocks of the weight in cache and multiplies them
into many rows at once is faster. In float32 that crossover sat at 64 rows or more on every CPU measured,
so it is a constant. In bfloat16 it depends on the machine: a CPU with bfloat16 tiles (Intel's AMX)
multiplies so fast that oneDNN wins from a few rows on, while elsewhere the loop wins up to 64. So the
bfloat16 crossover is measured on the machine the first time it is needed (a second or two, the two
products timed in turns on a matrix of SmolLM2's size) and kept in the model cache, keyed by the CPU and
the thread count. Measurements: docs/performance.md, "Products and where each path wins".
"""
from __future__ import annotations

import json
import platform
import time

import torch

STREAM_ROWS = 64                      # the most rows the streamed loop (and a compiled layer) ever takes
CANDIDATES = (8, 16, 32, STREAM_ROWS)  # bfloat16 crossovers tried, each a row count the loop may stop at
MARGIN = 1.25                         # the GEMM must be this much faster to take rows from the loop (whose
                                      # compiled layers save more than the product alone shows)


def streamed_rows(dtype: torch.dtype, many: str) -> int:
    """Up to how many rows a weight of this dtype takes the streamed loop, when `many` takes the rest."""
    if dtype == torch.float32 or many != "onednn":
        return STREAM_ROWS
    key = f"{_cpu_name()}|{torch.get_num_threads()} threads|torch {torch.__version__}|bfloat16"
    cache = _cache_file()
    known = json.loads(cache.read_text()) if cache.exists() else {}
    if key not in known:
        known[key] = measure_bfloat16_crossover()
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(known, indent=1))
    return int(known[key])


def measure_bfloat16_crossover(shape: tuple[int, int] = (3072, 576), rounds: int = 5) -> int:
    """The largest of CANDIDATES up to which the streamed loop is no more than MARGIN times slower than
    oneDNN's packed GEMM, for a bfloat16 weight of `shape` (best of `rounds` turns each)."""
    from minibatch.engine.ops.products import OneDNNProduct, StreamedProduct
    weight = torch.randn(shape).to(torch.bfloat16)                        # (N, K)
    streamed, onednn = StreamedProduct(weight), OneDNNProduct(weight)
    best = CANDIDATES[0]
    for rows in CANDIDATES:
        x = torch.randn(rows, shape[1]).to(torch.bfloat16)                # (T, K)
        loop, gemm = _best_time(streamed, x, rounds), _best_time(onednn, x, rounds)
        if loop > MARGIN * gemm:
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
