"""The product of one or two rows by a float32 weight, streamed at memory speed (Numba, CPU).

At batch 1 a decode step is a chain of matrix-vector products: each reads its whole weight once
and does one multiply-add per weight read, so its time is the weight's bytes over the memory
bandwidth. A library GEMM is built for many rows; for one it pays for blocking and packing that a
plain loop does not need. This loop reads each weight row once, in order, and multiplies it into
the one or two rows of the batch while it is in cache:

    out[t, n] = residual[t, n] + sum_k x[t, k] * weight[n, k]      (residual optional)

Threads split the output rows in chunks (`prange`), so each thread streams its own part of the
weight and no two threads write the same output. `fastmath` reassociation lets the compiler sum
each dot product in SIMD lanes, so results equal `F.linear`'s up to the order of the additions.
Measured here with `python scripts/linear_ab.py` (2 threads, the 30 layers' products of
SmolLM2-135M, 425 MB, cold in cache as in a real step; medians of interleaved runs): one row
20.3 ms against 25.1 ms through oneDNN, two rows 21.2 against 27.8; at three and four rows the
two are even, and at eight oneDNN wins (31.7 against 39.6). So `models.linear.Linear` uses this
loop for up to STREAM_ROWS rows only.
Compiled code is cached on disk (`cache=True`).
"""
from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

STREAM_ROWS = 2        # up to this many rows the streamed loop beats a library GEMM (see above)
ROWS_PER_TASK = 32     # weight rows a thread takes at a time


@njit(parallel=True, nogil=True, fastmath={"reassoc", "contract"}, cache=True)
def _stream(x, weight, residual, add_residual, out):
    rows, width = x.shape                                  # x: (T, K), weight: (N, K), residual, out: (T, N)
    num_outputs = weight.shape[0]
    for task in prange((num_outputs + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        for n in range(task * ROWS_PER_TASK, min(num_outputs, (task + 1) * ROWS_PER_TASK)):
            for t in range(rows):
                total = residual[t, n] if add_residual else np.float32(0.0)
                dot = np.float32(0.0)
                for k in range(width):
                    dot += x[t, k] * weight[n, k]
                out[t, n] = total + dot


def streamed_linear(x: torch.Tensor, weight: np.ndarray, residual: torch.Tensor | None = None) -> torch.Tensor:
    """x (T, K) float32 times weight (N, K) transposed, plus residual (T, N) if given: (T, N)."""
    out = x.new_empty(x.shape[0], weight.shape[0])
    add = residual is not None
    _stream(x.contiguous().numpy(), weight, residual.contiguous().numpy() if add else out.numpy(), add, out.numpy())
    return out
