"""The product of a few rows by a float32 weight, streamed at memory speed (Numba, CPU).

At batch 1 a decode step is a chain of matrix-vector products: each reads its whole weight once
and does one multiply-add per weight read, so its time is the weight's bytes over the memory
bandwidth. Up to the knee of the roofline a few more rows should cost almost nothing more: the
weight is read once whatever the number of rows. A library GEMM is built for many rows; for a few
it pays for blocking and packing that a plain loop does not need. This loop reads each weight row
once, in order, and multiplies it into every row of the batch while it is in cache:

    out[t, n] = residual[t, n] + sum_k x[t, k] * weight[n, k]      (residual optional)

The rows of x are taken eight at a time, then four, then one (`_rows8`, `_rows4`, `_row1`), and
the loop is written in eight-float vectors (`kernels.lanes`): eight weights are loaded into a
register once and multiplied into eight (or four) running sums, one per row, so the loop does
eight vector multiply-adds per weight vector it loads. At the end the eight sums are reduced
together (`sums8`), and the last K % 8 columns, if any, one by one. Threads split the output rows
in chunks (`prange`), so each thread streams its own part of the weight and no two threads write
the same output. Results equal `F.linear`'s up to the order of the additions.

With several rows the loop computes as well as reads, and while it computes, the memory must
already be fetching the weights it reads next, or the two add up instead of overlapping. The
CPU's own prefetcher guesses that for a plain stream; here each loop also asks for the weight row
PREFETCH_AHEAD rows ahead (`prefetch`). With one row the hint names the row being read: asking
12 rows ahead made one row slower. Against the loop this file held before (the same order, in
scalar Numba that the compiler vectorised by itself, no prefetching; in the history at 681825b),
a step's products at eight rows took 0.78-0.93x the time in 9 interleaved comparisons on a 2-core
AVX2 CPU, and one row 0.96-1.04x: from one row to eight, 1.22-1.29x instead of 1.29-1.44x.

Measured here with `python scripts/linear_ab.py --rows 1 2 4 6 8 12 16 --reps 5` (2 threads, the
30 layers' products of SmolLM2-135M, 425 MB, cold in cache as in a real step; medians of
interleaved runs), against oneDNN with the weight prepacked:

    rows          1        2        4        6        8       12       16
    oneDNN     27.0 ms  28.8 ms  33.0 ms  33.4 ms  35.8 ms  43.4 ms  51.4 ms
    streamed   22.2 ms  24.1 ms  23.1 ms  27.9 ms  24.5 ms  35.0 ms  45.9 ms

So `models.linear.Linear` uses this loop for up to STREAM_ROWS rows, and oneDNN above.
Compiled code is cached on disk (`cache=True`).
"""
from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from minibatch.engine.kernels.lanes import LANES, fma8, lane, load8, prefetch, sum8, sums8, zero8

STREAM_ROWS = 12       # up to this many rows the streamed loop beats a library GEMM (see above)
ROWS_PER_TASK = 32     # weight rows a thread takes at a time
PREFETCH_AHEAD = 12    # with several rows, the weight row asked for while this one is multiplied


@njit(inline="always")
def _rest(weight, x, n, t, start):
    """x[t, start:] . weight[n, start:]: the last K % 8 products, one by one (none when 8 divides K)."""
    total = np.float32(0.0)
    for k in range(start, weight.shape[1]):
        total += x[t, k] * weight[n, k]
    return total


@njit(inline="always")
def _rows8(weight, x, n, t, ahead, out):
    """out[t:t+8, n] = x[t:t+8] . weight[n]: eight weights loaded at once, each multiplied into eight rows."""
    s0, s1, s2, s3, s4, s5, s6, s7 = zero8(), zero8(), zero8(), zero8(), zero8(), zero8(), zero8(), zero8()
    last = weight.shape[1] - weight.shape[1] % LANES
    for k in range(0, last, LANES):
        prefetch(weight, ahead, k)
        w = load8(weight, n, k)                                 # weight[n, k:k+8]
        s0, s1 = fma8(w, load8(x, t, k), s0), fma8(w, load8(x, t + 1, k), s1)
        s2, s3 = fma8(w, load8(x, t + 2, k), s2), fma8(w, load8(x, t + 3, k), s3)
        s4, s5 = fma8(w, load8(x, t + 4, k), s4), fma8(w, load8(x, t + 5, k), s5)
        s6, s7 = fma8(w, load8(x, t + 6, k), s6), fma8(w, load8(x, t + 7, k), s7)
    sums = sums8(s0, s1, s2, s3, s4, s5, s6, s7)                # [x[t] . weight[n], ..., x[t+7] . weight[n]]
    for i in range(8):
        out[t + i, n] = lane(sums, i) + _rest(weight, x, n, t + i, last)


@njit(inline="always")
def _rows4(weight, x, n, t, ahead, out):
    """out[t:t+4, n] = x[t:t+4] . weight[n]: eight weights loaded at once, each multiplied into four rows."""
    s0, s1, s2, s3 = zero8(), zero8(), zero8(), zero8()
    last = weight.shape[1] - weight.shape[1] % LANES
    for k in range(0, last, LANES):
        prefetch(weight, ahead, k)
        w = load8(weight, n, k)
        s0, s1 = fma8(w, load8(x, t, k), s0), fma8(w, load8(x, t + 1, k), s1)
        s2, s3 = fma8(w, load8(x, t + 2, k), s2), fma8(w, load8(x, t + 3, k), s3)
    sums = sums8(s0, s1, s2, s3, zero8(), zero8(), zero8(), zero8())
    for i in range(4):
        out[t + i, n] = lane(sums, i) + _rest(weight, x, n, t + i, last)


@njit(inline="always")
def _row1(weight, x, n, t, ahead, out):
    """out[t, n] = x[t] . weight[n]: two running sums, so one addition need not wait for the one before."""
    s0, s1 = zero8(), zero8()
    last = weight.shape[1] - weight.shape[1] % LANES
    k = 0
    while k + 2 * LANES <= last:
        prefetch(weight, ahead, k)
        s0 = fma8(load8(weight, n, k), load8(x, t, k), s0)
        s1 = fma8(load8(weight, n, k + LANES), load8(x, t, k + LANES), s1)
        k += 2 * LANES
    if k < last:
        s0 = fma8(load8(weight, n, k), load8(x, t, k), s0)
    out[t, n] = sum8(s0) + sum8(s1) + _rest(weight, x, n, t, last)


@njit(parallel=True, nogil=True, cache=True)
def _stream(x, weight, residual, add_residual, out):
    rows = x.shape[0]                                      # x: (T, K), weight: (N, K), residual, out: (T, N)
    num_outputs = weight.shape[0]
    # one row: the hint names the row being read (asking ahead measured slower there)
    ahead_by = PREFETCH_AHEAD if rows > 1 else 0
    for task in prange((num_outputs + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        for n in range(task * ROWS_PER_TASK, min(num_outputs, (task + 1) * ROWS_PER_TASK)):
            ahead = min(n + ahead_by, num_outputs - 1)
            t = 0
            while t + 8 <= rows:
                _rows8(weight, x, n, t, ahead, out)
                t += 8
            while t + 4 <= rows:
                _rows4(weight, x, n, t, ahead, out)
                t += 4
            while t < rows:
                _row1(weight, x, n, t, ahead, out)
                t += 1
            if add_residual:
                for t in range(rows):
                    out[t, n] += residual[t, n]


def streamed_linear(x: torch.Tensor, weight: np.ndarray, residual: torch.Tensor | None = None) -> torch.Tensor:
    """x (T, K) float32 times weight (N, K) transposed, plus residual (T, N) if given: (T, N)."""
    out = x.new_empty(x.shape[0], weight.shape[0])
    add = residual is not None
    _stream(x.contiguous().numpy(), weight, residual.contiguous().numpy() if add else out.numpy(), add, out.numpy())
    return out
