"""The product of a few rows by a float32 weight, streamed at memory speed (Numba, CPU).

At batch 1 a decode step is a chain of matrix-vector products: each reads its whole weight once
and does one multiply-add per weight read, so its time is the weight's bytes over the memory
bandwidth. Up to the knee of the roofline a few more rows should cost almost nothing more: the
weight is read once whatever the number of rows. A library GEMM is built for many rows; for a few
it pays for blocking and packing that a plain loop does not need. This loop reads each weight row
once, in order, and multiplies it into every row of the batch while it is in cache:

    out[t, n] = residual[t, n] + sum_k x[t, k] * weight[n, k]      (residual optional)

The rows of x are taken eight at a time, then four, then one (`_dot8`, `_dot4`, `_dot1`): each
weight is loaded into a register once and multiplied into eight (or four) running sums, so the
loop does eight multiply-adds per weight it loads instead of one. Threads split the output rows
in chunks (`prange`), so each thread streams its own part of the weight and no two threads write
the same output. `fastmath` reassociation lets the compiler sum each dot product in SIMD lanes,
so results equal `F.linear`'s up to the order of the additions.

Measured here with `python scripts/linear_ab.py --rows 1 2 4 6 8 12 16 --reps 5` (2 threads, the
30 layers' products of SmolLM2-135M, 425 MB, cold in cache as in a real step; medians of
interleaved runs), against oneDNN with the weight prepacked:

    rows          1        2        4        6        8       12       16
    oneDNN     24.3 ms  25.7 ms  32.1 ms  32.5 ms  40.6 ms  44.2 ms  48.1 ms
    streamed   18.1 ms  20.2 ms  21.5 ms  25.2 ms  28.3 ms  35.0 ms  48.6 ms

So `models.linear.Linear` uses this loop for up to STREAM_ROWS rows, and oneDNN above.
Compiled code is cached on disk (`cache=True`).
"""
from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

STREAM_ROWS = 12       # up to this many rows the streamed loop beats a library GEMM (see above)
ROWS_PER_TASK = 32     # weight rows a thread takes at a time


@njit(inline="always", fastmath={"reassoc", "contract"})
def _dot8(w, x, t, n, out):
    """out[t:t+8, n] = x[t:t+8] . w: each weight loaded once for eight products, eight sums in registers."""
    s0, s1, s2, s3 = np.float32(0.0), np.float32(0.0), np.float32(0.0), np.float32(0.0)
    s4, s5, s6, s7 = np.float32(0.0), np.float32(0.0), np.float32(0.0), np.float32(0.0)
    for k in range(w.shape[0]):
        v = w[k]
        s0 += x[t, k] * v
        s1 += x[t + 1, k] * v
        s2 += x[t + 2, k] * v
        s3 += x[t + 3, k] * v
        s4 += x[t + 4, k] * v
        s5 += x[t + 5, k] * v
        s6 += x[t + 6, k] * v
        s7 += x[t + 7, k] * v
    out[t, n], out[t + 1, n], out[t + 2, n], out[t + 3, n] = s0, s1, s2, s3
    out[t + 4, n], out[t + 5, n], out[t + 6, n], out[t + 7, n] = s4, s5, s6, s7


@njit(inline="always", fastmath={"reassoc", "contract"})
def _dot4(w, x, t, n, out):
    """out[t:t+4, n] = x[t:t+4] . w: each weight loaded once for four products."""
    s0, s1, s2, s3 = np.float32(0.0), np.float32(0.0), np.float32(0.0), np.float32(0.0)
    for k in range(w.shape[0]):
        v = w[k]
        s0 += x[t, k] * v
        s1 += x[t + 1, k] * v
        s2 += x[t + 2, k] * v
        s3 += x[t + 3, k] * v
    out[t, n], out[t + 1, n], out[t + 2, n], out[t + 3, n] = s0, s1, s2, s3


@njit(inline="always", fastmath={"reassoc", "contract"})
def _dot1(w, x, t, n, out):
    total = np.float32(0.0)
    for k in range(w.shape[0]):
        total += x[t, k] * w[k]
    out[t, n] = total


@njit(parallel=True, nogil=True, fastmath={"reassoc", "contract"}, cache=True)
def _stream(x, weight, residual, add_residual, out):
    rows = x.shape[0]                                      # x: (T, K), weight: (N, K), residual, out: (T, N)
    num_outputs = weight.shape[0]
    for task in prange((num_outputs + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        for n in range(task * ROWS_PER_TASK, min(num_outputs, (task + 1) * ROWS_PER_TASK)):
            w = weight[n]                                  # (K,): from memory once, then from cache
            t = 0
            while t + 8 <= rows:
                _dot8(w, x, t, n, out)
                t += 8
            while t + 4 <= rows:
                _dot4(w, x, t, n, out)
                t += 4
            while t < rows:
                _dot1(w, x, t, n, out)
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
