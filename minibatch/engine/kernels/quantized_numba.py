"""Products with block-quantised weights on the CPU, compiled with Numba (`EngineConfig.quantization`).

The torch reference (`quantized_torch`) expands the whole weight to fp32 and then multiplies. These
kernels never build that matrix: a decode step is bound by reading the weights, so each reads the
weight's bytes once and turns codes into floats in registers or in a buffer that stays in cache.
Each format has two kernels, on two orders of the same bytes (`host_arrays` makes both, once):

- **Many rows** (`_q8_0_many_into`, `_q4_1_many_into`; more than FEW_ROWS rows of x: prefill chunks,
  larger batches). Two rows of the weight at a time, in the file's order: expand their K weights
  into a buffer (6 KB a row for K = 1536), then multiply them into every one of the T rows of x,
  four rows of x at a time (`_dot2x4`: eight sums in registers, each value loaded used four or two
  times). A step of 8 sequences reads the same bytes from memory as a step of 1, and a prefill
  chunk's q4_1 products run as fast as oneDNN's float32 ones.
- **A few rows** (1 to FEW_ROWS rows: a decode step of one or two users) run on a second copy of
  the blocks with rows interleaved, in `quantized_groups_numba`, which says why (with the sums in
  sixteen-lane registers where the CPU has AVX-512, `lanes16.WIDE`).

Work is split over chunks of output rows with `prange`, so no two threads write the same output;
`_q8_0_into` and `_q4_1_into` pick the kernel by the number of rows and write into a given output,
adding a residual if asked, as the compiled decode layer (`layer_cpu`) calls them. Scales and
minimums are fp16, which Numba cannot load, so their bits are turned into fp32 first
(`_halves_to_float`: exact, subnormals included). `fastmath=True` lets the compiler reorder the
sums into SIMD lanes, so results match the reference to rounding, not bit for bit. The block length
is passed in rather than written as the constant 32: a loop of unknown length gets vectorised,
while a constant one is unrolled into scalar code. Compiled code is cached on disk (`cache=True`; compiled again
when a file they compile in changes, `kernels.stale_cache`).

Shapes: x (T, K) float32, a weight of N rows by K columns in blocks of 32 along each row, out and
residual (T, N). Measurements: docs/performance.md, section "Quantised products".
"""
from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from minibatch.engine.kernels import codes16, lanes, lanes16, quantized_groups_numba
from minibatch.engine.kernels.lanes16 import WIDE
from minibatch.engine.kernels.quantized_groups_numba import (
    _halves_to_float,
    _q4_1_few_into,
    _q4_1_lanes_into,
    _q8_0_few_into,
    _q8_0_lanes_into,
    group_blocks,
)
from minibatch.engine.kernels.stale_cache import forget_stale

BLOCK = 32          # weights per block, along a row
ROWS_PER_TASK = 16  # output rows a thread takes at a time: large enough to amortise its scratch buffers
FEW_ROWS = 3        # up to this many rows of x, the products run on row groups (`quantized_groups_numba`)


@njit(inline="always", fastmath=True)
def _dot(w, x_row):
    """w (K,) . x_row (K,): a plain loop over contiguous arrays, which the compiler vectorises."""
    total = np.float32(0.0)
    for k in range(w.shape[0]):
        total += w[k] * x_row[k]
    return total


@njit(inline="always", fastmath=True)
def _dot2x4(w0, w1, x0, x1, x2, x3):
    """Two weight rows (K,) against four rows of x at once: eight sums in registers, so each weight and
    each x value loaded is used in four (or two) products rather than one."""
    a0, a1, a2, a3 = np.float32(0.0), np.float32(0.0), np.float32(0.0), np.float32(0.0)
    b0, b1, b2, b3 = np.float32(0.0), np.float32(0.0), np.float32(0.0), np.float32(0.0)
    for k in range(w0.shape[0]):
        u, v = w0[k], w1[k]
        p0, p1, p2, p3 = x0[k], x1[k], x2[k], x3[k]
        a0 += u * p0
        a1 += u * p1
        a2 += u * p2
        a3 += u * p3
        b0 += v * p0
        b1 += v * p1
        b2 += v * p2
        b3 += v * p3
    return a0, a1, a2, a3, b0, b1, b2, b3


@njit(inline="always", fastmath=True)
def _products(w, pair, x, n, residual, add_residual, out):
    """out[:, n : n + pair] = x (T, K) times `pair` (1 or 2) expanded rows of weights w (2, K), (+ residual):
    two weight rows by four rows of x at a time, then the rest one by one."""
    t = 0
    if pair == 2:
        while t + 4 <= x.shape[0]:
            (out[t, n], out[t + 1, n], out[t + 2, n], out[t + 3, n], out[t, n + 1], out[t + 1, n + 1],
             out[t + 2, n + 1], out[t + 3, n + 1]) = _dot2x4(w[0], w[1], x[t], x[t + 1], x[t + 2], x[t + 3])
            t += 4
    for i in range(pair):
        for u in range(t, x.shape[0]):
            out[u, n + i] = _dot(w[i], x[u])
        if add_residual:
            for u in range(x.shape[0]):
                out[u, n + i] += residual[u, n + i]


@njit(inline="always", fastmath=True)
def _expand_q8_0(codes, d, block, w):
    """One row's int8 codes (K,) and fp32 scales (K/32,) -> its weights w (K,) = d * q."""
    for b in range(d.shape[0]):
        q, out, scale = codes[b * block:(b + 1) * block], w[b * block:(b + 1) * block], d[b]
        for j in range(block):
            out[j] = scale * np.float32(q[j])


@njit(inline="always", fastmath=True)
def _expand_q4_1(codes, d, m, block, w):
    """One row's packed codes (K/2,), fp32 scales and minimums (K/32,) -> its weights w (K,) = d * q + m."""
    half = block // 2
    for b in range(d.shape[0]):
        q, out, scale, low = codes[b * half:(b + 1) * half], w[b * block:(b + 1) * block], d[b], m[b]
        for j in range(half):                                 # byte j: weight j (low nibble), j + 16 (high)
            out[j] = scale * np.float32(q[j] & 15) + low
            out[j + half] = scale * np.float32(q[j] >> 4) + low


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _q8_0_many_into(x, codes, scales, block, residual, add_residual, out):
    """out (T, N) = x (T, K) times the q8_0 weight (N, K) transposed (+ residual): two weight rows expanded at a
    time, each multiplied into four rows of x at once."""
    num_out = codes.shape[0]                                  # x (T, K); codes (N, K) int8
    num_blocks = scales.shape[1]                              # scales (N, K/32) uint16; residual, out (T, N)
    for task in prange((num_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        bits = np.empty(num_blocks, np.uint32)                # a thread's scratch, reused for its rows
        d = np.empty(num_blocks, np.float32)
        w = np.empty((2, codes.shape[1]), np.float32)         # two rows of weights, expanded (stay in L1)
        end = min(num_out, (task + 1) * ROWS_PER_TASK)
        for n in range(task * ROWS_PER_TASK, end, 2):
            pair = min(2, end - n)
            for i in range(pair):
                _halves_to_float(scales[n + i], bits, d)
                _expand_q8_0(codes[n + i], d, block, w[i])
            _products(w, pair, x, n, residual, add_residual, out)   # every row of x reuses the expanded weights


@njit(nogil=True, cache=True)
def _q8_0_into(x, codes, scales, block, grouped, group_scales, residual, add_residual, out):
    """out (T, N) = x (T, K) times the q8_0 weight (+ residual): interleaved groups for a few rows, else row by row."""
    if x.shape[0] > FEW_ROWS:
        _q8_0_many_into(x, codes, scales, block, residual, add_residual, out)
    elif WIDE:                                                # fixed for this CPU when the module loads
        _q8_0_lanes_into(x, grouped, group_scales, residual, add_residual, out)
    else:
        _q8_0_few_into(x, grouped, group_scales, residual, add_residual, out)


@njit(nogil=True, cache=True)
def _q8_0_matmul(x, codes, scales, block, grouped, group_scales):
    """x (T, K) times the q8_0 weight transposed: a new (T, N) float32 array."""
    out = np.empty((x.shape[0], codes.shape[0]), np.float32)  # (T, N)
    _q8_0_into(x, codes, scales, block, grouped, group_scales, out, False, out)
    return out


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _q4_1_many_into(x, codes, scales, mins, block, residual, add_residual, out):
    """out (T, N) = x (T, K) times the q4_1 weight (N, K) transposed (+ residual): two weight rows expanded at a
    time, each multiplied into four rows of x at once."""
    num_out = codes.shape[0]                                  # x (T, K); codes (N, K/2) uint8
    num_blocks = scales.shape[1]                              # scales, mins (N, K/32) uint16; residual, out (T, N)
    for task in prange((num_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        bits = np.empty(num_blocks, np.uint32)                # a thread's scratch, reused for its rows
        d = np.empty(num_blocks, np.float32)
        m = np.empty(num_blocks, np.float32)
        w = np.empty((2, 2 * codes.shape[1]), np.float32)     # two rows of weights, expanded (stay in L1)
        end = min(num_out, (task + 1) * ROWS_PER_TASK)
        for n in range(task * ROWS_PER_TASK, end, 2):
            pair = min(2, end - n)
            for i in range(pair):
                _halves_to_float(scales[n + i], bits, d)
                _halves_to_float(mins[n + i], bits, m)
                _expand_q4_1(codes[n + i], d, m, block, w[i])
            _products(w, pair, x, n, residual, add_residual, out)   # every row of x reuses the expanded weights


@njit(nogil=True, cache=True)
def _q4_1_into(x, codes, scales, mins, block, grouped, group_scales, group_mins, residual, add_residual, out):
    """out (T, N) = x (T, K) times the q4_1 weight (+ residual): interleaved groups for a few rows, else row by row."""
    if x.shape[0] > FEW_ROWS:
        _q4_1_many_into(x, codes, scales, mins, block, residual, add_residual, out)
    elif WIDE:                                                # fixed for this CPU when the module loads
        _q4_1_lanes_into(x, grouped, group_scales, group_mins, residual, add_residual, out)
    else:
        _q4_1_few_into(x, grouped, group_scales, group_mins, residual, add_residual, out)


@njit(nogil=True, cache=True)
def _q4_1_matmul(x, codes, scales, mins, block, grouped, group_scales, group_mins):
    """x (T, K) times the q4_1 weight transposed: a new (T, N) float32 array."""
    out = np.empty((x.shape[0], codes.shape[0]), np.float32)  # (T, N)
    _q4_1_into(x, codes, scales, mins, block, grouped, group_scales, group_mins, out, False, out)
    return out


def host_arrays(codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None = None) -> tuple:
    """A weight's blocks as the kernels take them, made once per weight: zero-copy numpy views of the
    CPU tensors, fp16 scales and minimums as their uint16 bit patterns."""
    if codes.device.type != "cpu":
        raise ValueError(f"the Numba quantised kernels run on the CPU, but the weight is on {codes.device}: "
                         "use quantization=None on a GPU")
    halves = lambda t: t.contiguous().view(torch.int16).numpy().view(np.uint16)
    blocks = (codes.contiguous().numpy(), halves(scales)) + (() if mins is None else (halves(mins),))
    return blocks + group_blocks(*blocks)                      # (codes, scales[, mins]) in both layouts


def _rows(x: torch.Tensor) -> np.ndarray:
    """x (T, K) as the float32 numpy array the kernels take; a clear error for any other dtype or device."""
    if x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"the Numba quantised kernels take float32 rows on the CPU, not {x.dtype} on {x.device}: "
                         "use dtype='float32' and device='cpu'")
    return x.detach().contiguous().numpy()


def q8_0_matmul(x: torch.Tensor, codes: np.ndarray, scales: np.ndarray, grouped: np.ndarray,
                group_scales: np.ndarray) -> torch.Tensor:
    """x (T, K) fp32 times the q8_0 weight (N, K) transposed: (T, N). The blocks, as host_arrays gives them."""
    return torch.from_numpy(_q8_0_matmul(_rows(x), codes, scales, BLOCK, grouped, group_scales))


def q4_1_matmul(x: torch.Tensor, codes: np.ndarray, scales: np.ndarray, mins: np.ndarray, grouped: np.ndarray,
                group_scales: np.ndarray, group_mins: np.ndarray) -> torch.Tensor:
    """x (T, K) fp32 times the q4_1 weight (N, K) transposed: (T, N). The blocks, as host_arrays gives them."""
    return torch.from_numpy(_q4_1_matmul(_rows(x), codes, scales, mins, BLOCK, grouped, group_scales, group_mins))


for _kernel in (_q8_0_many_into, _q8_0_into, _q8_0_matmul, _q4_1_many_into, _q4_1_into, _q4_1_matmul):
    forget_stale(_kernel, (codes16, lanes, lanes16, quantized_groups_numba))   # the files they compile in
