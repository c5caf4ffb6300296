"""Is the streamed product bound by the memory or by its arithmetic? Its rate, weight in cache and from memory.

For each row count, `gemv_cpu`'s loop (called as the compiled decode layer calls it, with no torch wrapper)
multiplies the rows by weights of the model's most common width (576 columns):

    cache     one 1024-row weight (2.4 MB: half of it per thread, inside each core's second-level cache),
              multiplied again and again: the loop's arithmetic alone
    memory    64 weights of 3072 rows (7 MB each, 453 MB in all) in turn: every weight read from memory,
              as in a decode step

and prints multiply-adds per second and the weight's bytes read per second. Where the two rates are
close, the arithmetic sets the pace (more rows cost more); where `memory` is far below `cache`, the
memory does. Blocks of four rows by four weight rows with their operands in the first-level cache
(`--l1`) show what the loop's arithmetic does when nothing waits for the second-level cache.

    python scripts/stream_rates.py [--rows 1 4 8 16 32 64] [--l1]
"""
import argparse
import time

import numpy as np
import torch
from numba import njit, prange

from minibatch.engine.kernels.gemv_blocks_cpu import _block_sums
from minibatch.engine.kernels.gemv_cpu import _stream
from minibatch.engine.kernels.lanes import sum8

COLUMNS = 576


def rate(rows: int, num_outputs: int, calls: int, num_weights: int) -> float:
    """Multiply-adds per second of `calls` products of `rows` rows, taking num_weights weights in turn; best of 3."""
    generator = np.random.default_rng(0)
    weights = [generator.random((num_outputs, COLUMNS), np.float32) for _ in range(num_weights)]  # (N, K) each
    x = generator.random((rows, COLUMNS), np.float32)                                            # (T, K)
    out = np.empty((rows, num_outputs), np.float32)                                              # (T, N)
    _stream(x, weights[0], out, False, out)
    if not np.allclose(out, x @ weights[0].T, rtol=1e-4, atol=1e-3):
        raise AssertionError("the streamed product differs from numpy's")

    def calls_in_turn():
        for call in range(calls):
            _stream(x, weights[call % num_weights], out, False, out)
    return rows * num_outputs * COLUMNS * calls / best_seconds(calls_in_turn)


def best_seconds(run) -> float:
    """The shortest of three timings of run()."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


@njit(parallel=True)
def _l1_blocks(weight, x, repeats, out):
    """Blocks of four rows by four weight rows, their operands (8, K) in the first-level cache, on every thread;
    each repeat takes other rows, so the compiler cannot compute a block once for all repeats."""
    for thread in prange(out.shape[0]):
        total = np.float32(0.0)
        for repeat in range(repeats):
            rows01, rows23 = _block_sums(weight, x, 4 * (repeat % 2), 4 * (repeat % 3 % 2), 0, 0, 0, weight.shape[1])
            total += sum8(rows01 + rows23)
        out[thread] = total


def l1_rate(repeats: int = 200_000) -> float:
    generator = np.random.default_rng(0)
    weight, x = generator.random((8, COLUMNS), np.float32), generator.random((8, COLUMNS), np.float32)
    out = np.zeros(torch.get_num_threads(), np.float32)
    _l1_blocks(weight, x, 10, out)
    return len(out) * repeats * 16 * COLUMNS / best_seconds(lambda: _l1_blocks(weight, x, repeats, out))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="*", default=[1, 4, 8, 16, 32, 64])
    parser.add_argument("--l1", action="store_true", help="also the block with its operands in the first-level cache")
    args = parser.parse_args()
    print(f"streamed product, float32, {COLUMNS} columns, {torch.get_num_threads()} threads; best of 3")
    print(f"{'rows':>5} {'cache GFMA/s':>13} {'GB/s':>6} {'memory GFMA/s':>14} {'GB/s':>6}")
    for rows in args.rows:
        cache, memory = rate(rows, 1024, 2000, 1), rate(rows, 3072, 300, 64)
        print(f"{rows:>5} {cache / 1e9:>13.1f} {cache * 4 / rows / 1e9:>6.1f} "
              f"{memory / 1e9:>14.1f} {memory * 4 / rows / 1e9:>6.1f}")
    if args.l1:
        print(f"a block of 4 x 4 in the first-level cache: {l1_rate() / 1e9:.1f} GFMA/s")


if __name__ == "__main__":
    main()
