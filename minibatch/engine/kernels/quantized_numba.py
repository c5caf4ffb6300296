"""Products with block-quantised weights on the CPU, compiled with Numba (`EngineConfig.quantization`).

The torch reference (`quantized_torch`) expands the whole weight to fp32 and then multiplies. These
kernels never build that matrix: a decode step is bound by reading the weights, so each reads a
row's bytes once, expands its K weights into a small buffer that stays in L1 (6 KB for K = 1536),
and multiplies them into every one of the T rows of the batch before moving on to the next row.
A step of 8 sequences therefore reads the same bytes from memory as a step of 1.

Work is split over chunks of output rows with `prange` (each thread owns whole rows, so no two
threads write the same output). Scales and minimums are fp16, which Numba cannot load, so a row's
fp16 bits are turned into fp32 first (`_halves_to_float`: exact, subnormals included).
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


@njit(parallel=True, fastmath=True, cache=True)
def _q8_0_matmul(x, codes, scales, block, out):
    num_rows, num_out = x.shape[0], codes.shape[0]            # x (T, K); codes (N, K) int8
    num_blocks = scales.shape[1]                              # scales (N, K/32) uint16; out (T, N)
    for task in prange((num_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        bits = np.empty(num_blocks, np.uint32)                # a thread's scratch, reused for its rows
        d = np.empty(num_blocks, np.float32)
        w = np.empty(codes.shape[1], np.float32)              # one row of weights, expanded (stays in L1)
        for n in range(task * ROWS_PER_TASK, min(num_out, (task + 1) * ROWS_PER_TASK)):
            _halves_to_float(scales[n], bits, d)
            _expand_q8_0(codes[n], d, block, w)
            for t in range(num_rows):                         # every row of x reuses the expanded weights
                out[t, n] = _dot(w, x[t])


@njit(parallel=True, fastmath=True, cache=True)
def _q4_1_matmul(x, codes, scales, mins, block, out):
    num_rows, num_out = x.shape[0], codes.shape[0]            # x (T, K); codes (N, K/2) uint8
    num_blocks = scales.shape[1]                              # scales, mins (N, K/32) uint16; out (T, N)
    for task in prange((num_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        bits = np.empty(num_blocks, np.uint32)                # a thread's scratch, reused for its rows
        d = np.empty(num_blocks, np.float32)
        m = np.empty(num_blocks, np.float32)
        w = np.empty(2 * codes.shape[1], np.float32)          # one row of weights, expanded (stays in L1)
        for n in range(task * ROWS_PER_TASK, min(num_out, (task + 1) * ROWS_PER_TASK)):
            _halves_to_float(scales[n], bits, d)
            _halves_to_float(mins[n], bits, m)
            _expand_q4_1(codes[n], d, m, block, w)
            for t in range(num_rows):                         # every row of x reuses the expanded weights
                out[t, n] = _dot(w, x[t])


def _check(x: torch.Tensor, codes: torch.Tensor) -> np.ndarray:
    if x.device.type != "cpu" or codes.device.type != "cpu":
        raise ValueError(f"the Numba quantised kernels run on the CPU, but x is on {x.device}: "
                         "use quantization=None on a GPU")
    if x.dtype != torch.float32:
        raise ValueError(f"the Numba quantised kernels take float32 inputs, not {x.dtype}: use dtype='float32'")
    return x.detach().contiguous().numpy()


def q8_0_matmul(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x (T, K) fp32 times the q8_0 weight (N, K) transposed: (T, N)."""
    x_np = _check(x, codes)
    out = torch.empty(x.shape[0], codes.shape[0], dtype=torch.float32)   # (T, N), filled by the kernel
    if x.shape[0]:
        _q8_0_matmul(x_np, codes.numpy(), scales.view(torch.int16).numpy().view(np.uint16), BLOCK, out.numpy())
    return out


def q4_1_matmul(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """x (T, K) fp32 times the q4_1 weight (N, K) transposed: (T, N)."""
    x_np = _check(x, codes)
    out = torch.empty(x.shape[0], codes.shape[0], dtype=torch.float32)   # (T, N), filled by the kernel
    if x.shape[0]:
        _q4_1_matmul(x_np, codes.numpy(), scales.view(torch.int16).numpy().view(np.uint16),
                     mins.view(torch.int16).numpy().view(np.uint16), BLOCK, out.numpy())
    return out
