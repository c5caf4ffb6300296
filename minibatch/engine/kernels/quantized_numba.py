"""Products with block-quantised weights on the CPU, compiled with Numba (`EngineConfig.quantization`).

The torch reference (`quantized_torch`) expands the whole weight to fp32 and then multiplies. These
kernels never build that matrix: a decode step is bound by reading the weights, so each reads a
row's bytes once, expands its K weights into a small buffer that stays in L1 (6 KB for K = 1536),
and multiplies them into every one of the T rows of the batch before moving on to the next row.
A step of 8 sequences therefore reads the same bytes from memory as a step of 1.

Work is split over chunks of output rows with `prange` (each thread owns whole rows, so no two
threads write the same output); `_q8_0_into` and `_q4_1_into` write into a given output, adding
a residual if asked, as the compiled decode layer (`layer_cpu`) calls them. Scales and minimums
are fp16, which Numba cannot load, so a row's fp16 bits are turned into fp32 first
(`_halves_to_float`: exact, subnormals included).
`fastmath=True` lets the compiler reorder the sums into SIMD lanes (and fuse d * q + m into one
instruction), so results match the reference to rounding, not bit for bit. The block length is
passed in rather than written as the constant 32: a loop of unknown length gets vectorised, while
a constant one is unrolled into scalar code. Compiled code is cached on disk (`cache=True`).
"""
from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

BLOCK = 32        # weights per block, along a row
ROWS_PER_TASK = 16  # output rows a thread takes at a time: large enough to amortise its scratch buffers


@njit(inline="always")
def _halves_to_float(halves, bits, out):
    """fp16 bit patterns (uint16) -> fp32 into out: shift sign, exponent and mantissa into place, then
    rescale the exponent by 2^112 (the bias difference 127 - 15), which also renormalises subnormals."""
    for i in range(halves.shape[0]):
        h = np.uint32(halves[i])
        bits[i] = ((h & np.uint32(0x8000)) << np.uint32(16)) | ((h & np.uint32(0x7FFF)) << np.uint32(13))
    as_float = bits.view(np.float32)
    for i in range(halves.shape[0]):
        out[i] = as_float[i] * np.float32(2.0 ** 112)


@njit(inline="always", fastmath=True)
def _dot(w, x_row):
    """w (K,) . x_row (K,): a plain loop over contiguous arrays, which the compiler vectorises."""
    total = np.float32(0.0)
    for k in range(w.shape[0]):
        total += w[k] * x_row[k]
    return total


@njit(inline="always", fastmath=True)
def _dot4(w, x0, x1, x2, x3):
    """w (K,) against four rows at once: each weight loaded once for four products (batches of 4+)."""
    a0, a1, a2, a3 = np.float32(0.0), np.float32(0.0), np.float32(0.0), np.float32(0.0)
    for k in range(w.shape[0]):
        v = w[k]
        a0 += v * x0[k]
        a1 += v * x1[k]
        a2 += v * x2[k]
        a3 += v * x3[k]
    return a0, a1, a2, a3


@njit(inline="always", fastmath=True)
def _products(w, x, n, out):
    """out[:, n] = x (T, K) times one expanded row of weights w (K,): four rows of x at a time, then the rest."""
    t = 0
    while t + 4 <= x.shape[0]:
        out[t, n], out[t + 1, n], out[t + 2, n], out[t + 3, n] = _dot4(w, x[t], x[t + 1], x[t + 2], x[t + 3])
        t += 4
    while t < x.shape[0]:
        out[t, n] = _dot(w, x[t])
        t += 1


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
def _q8_0_into(x, codes, scales, block, residual, add_residual, out):
    num_out = codes.shape[0]                                  # x (T, K); codes (N, K) int8
    num_blocks = scales.shape[1]                              # scales (N, K/32) uint16; residual, out (T, N)
    for task in prange((num_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        bits = np.empty(num_blocks, np.uint32)                # a thread's scratch, reused for its rows
        d = np.empty(num_blocks, np.float32)
        w = np.empty(codes.shape[1], np.float32)              # one row of weights, expanded (stays in L1)
        for n in range(task * ROWS_PER_TASK, min(num_out, (task + 1) * ROWS_PER_TASK)):
            _halves_to_float(scales[n], bits, d)
            _expand_q8_0(codes[n], d, block, w)
            _products(w, x, n, out)                           # every row of x reuses the expanded weights
            if add_residual:
                for t in range(x.shape[0]):
                    out[t, n] += residual[t, n]


@njit(nogil=True, cache=True)
def _q8_0_matmul(x, codes, scales, block):
    out = np.empty((x.shape[0], codes.shape[0]), np.float32)  # (T, N)
    _q8_0_into(x, codes, scales, block, out, False, out)
    return out


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _q4_1_into(x, codes, scales, mins, block, residual, add_residual, out):
    num_out = codes.shape[0]                                  # x (T, K); codes (N, K/2) uint8
    num_blocks = scales.shape[1]                              # scales, mins (N, K/32) uint16; residual, out (T, N)
    for task in prange((num_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        bits = np.empty(num_blocks, np.uint32)                # a thread's scratch, reused for its rows
        d = np.empty(num_blocks, np.float32)
        m = np.empty(num_blocks, np.float32)
        w = np.empty(2 * codes.shape[1], np.float32)          # one row of weights, expanded (stays in L1)
        for n in range(task * ROWS_PER_TASK, min(num_out, (task + 1) * ROWS_PER_TASK)):
            _halves_to_float(scales[n], bits, d)
            _halves_to_float(mins[n], bits, m)
            _expand_q4_1(codes[n], d, m, block, w)
            _products(w, x, n, out)                           # every row of x reuses the expanded weights
            if add_residual:
                for t in range(x.shape[0]):
                    out[t, n] += residual[t, n]


@njit(nogil=True, cache=True)
def _q4_1_matmul(x, codes, scales, mins, block):
    out = np.empty((x.shape[0], codes.shape[0]), np.float32)  # (T, N)
    _q4_1_into(x, codes, scales, mins, block, out, False, out)
    return out


def host_arrays(codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None = None) -> tuple:
    """A weight's blocks as the kernels take them, made once per weight: zero-copy numpy views of the
    CPU tensors, fp16 scales and minimums as their uint16 bit patterns."""
    if codes.device.type != "cpu":
        raise ValueError(f"the Numba quantised kernels run on the CPU, but the weight is on {codes.device}: "
                         "use quantization=None on a GPU")
    halves = lambda t: t.contiguous().view(torch.int16).numpy().view(np.uint16)
    return (codes.contiguous().numpy(), halves(scales)) + (() if mins is None else (halves(mins),))


def _rows(x: torch.Tensor) -> np.ndarray:
    if x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"the Numba quantised kernels take float32 rows on the CPU, not {x.dtype} on {x.device}: "
                         "use dtype='float32' and device='cpu'")
    return x.detach().contiguous().numpy()


def q8_0_matmul(x: torch.Tensor, codes: np.ndarray, scales: np.ndarray) -> torch.Tensor:
    """x (T, K) fp32 times the q8_0 weight (N, K) transposed: (T, N). codes, scales: from host_arrays."""
    return torch.from_numpy(_q8_0_matmul(_rows(x), codes, scales, BLOCK))


def q4_1_matmul(x: torch.Tensor, codes: np.ndarray, scales: np.ndarray, mins: np.ndarray) -> torch.Tensor:
    """x (T, K) fp32 times the q4_1 weight (N, K) transposed: (T, N). codes, scales, mins: from host_arrays."""
    return torch.from_numpy(_q4_1_matmul(_rows(x), codes, scales, mins, BLOCK))
