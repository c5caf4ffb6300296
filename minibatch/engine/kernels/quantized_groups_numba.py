"""Quantised products of one to three rows of x, on the weight's blocks with 64 rows interleaved (`quantized_numba`'s
kernels for a decode step of one or two users; that module picks them by the number of rows).

`quantized_numba`'s row-by-row kernels expand a weight row into a buffer and share it among the
rows of x. With one row of x there is nothing to share the buffer with, and writing it then reading
it back, plus summing each row's products across SIMD lanes, cost more than the
multiply-adds. So the weight is kept a second time with ROW_GROUP rows interleaved
(`group_blocks`): byte j of block b of 64 consecutive rows lies side by side, and the loop over
those 64 rows is the one the compiler vectorises: each code becomes a float in a SIMD lane and
is multiplied by the same x, with no sum across lanes until the row ends. Per block of 32 weights:

    sum_k (d q_k + m) x_k = d (sum_k q_k x_k) + m (sum_k x_k)      (q4_1; q8_0 has no m)

so the inner loop multiplies codes by x alone, and d and m are applied once a block. A q4_1 byte
holds q_j (low nibble) and q_j+16 (high): high = (byte - low) / 16, so
low x_j + high x_j+16 = low (x_j - x_j+16 / 16) + byte (x_j+16 / 16), and the loop needs no shift
(Numba widens a shifted byte to 64 bits, which defeats the vector loop). At one row this halves
the time of the row-by-row kernels.

Each thread takes whole row groups (`prange` over groups), so no two threads write the same output.
`_halves_to_float`, which turns fp16 scales and minimums into fp32, serves the row-by-row kernels too.

Shapes: x (T, K) with T from 1 to 3, the weight's N rows in groups of ROW_GROUP, out (T, N).
Measurements: docs/performance.md, section "Quantised products".
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

ROW_GROUP = 64      # rows of a weight interleaved together


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


@njit(inline="always")
def _write_group(acc, g, residual, add_residual, out):
    """out[:, g R : (g + 1) R] = acc (T, R) (+ residual), leaving out the padding rows past N of the last group."""
    group = acc.shape[1]
    for r in range(min(group, out.shape[1] - g * group)):
        n = g * group + r
        for t in range(acc.shape[0]):
            out[t, n] = acc[t, r] + residual[t, n] if add_residual else acc[t, r]


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _q8_0_few_into(x, grouped, group_scales, residual, add_residual, out):
    """The same product for one to a few rows of x, on the weight's blocks interleaved by `group_blocks`."""
    num_groups, num_blocks, block, group = grouped.shape     # grouped (G, K/32, 32, R) int8
    rows = x.shape[0]                                         # x (T, K); group_scales (G, K/32, R) uint16
    for g in prange(num_groups):
        bits = np.empty(group, np.uint32)                     # a thread's scratch, reused for its blocks
        d = np.empty(group, np.float32)
        block_dot = np.empty(group, np.float32)               # q . x over one block, for each of the R rows
        acc = np.zeros((rows, group), np.float32)             # (T, R)
        for b in range(num_blocks):
            _halves_to_float(group_scales[g, b], bits, d)
            for t in range(rows):
                block_dot[:] = 0.0
                for j in range(block):                        # weight j of R blocks
                    x_j = x[t, b * block + j]
                    codes = grouped[g, b, j]                  # (R,)
                    for r in range(group):
                        block_dot[r] += np.float32(codes[r]) * x_j
                for r in range(group):
                    acc[t, r] += d[r] * block_dot[r]
        _write_group(acc, g, residual, add_residual, out)


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _q4_1_few_into(x, grouped, group_scales, group_mins, residual, add_residual, out):
    """The same product for one to a few rows of x, on the weight's blocks interleaved by `group_blocks`."""
    num_groups, num_blocks, half, group = grouped.shape      # grouped (G, K/32, 16, R) uint8
    rows = x.shape[0]                                         # x (T, K); group_scales, _mins (G, K/32, R) uint16
    block_sums = np.empty((rows, num_blocks), np.float32)     # sum of x over each block: what m multiplies
    for t in range(rows):
        for b in range(num_blocks):
            total = np.float32(0.0)
            for k in range(b * 2 * half, (b + 1) * 2 * half):
                total += x[t, k]
            block_sums[t, b] = total
    for g in prange(num_groups):
        bits = np.empty(group, np.uint32)                     # a thread's scratch, reused for its blocks
        d = np.empty(group, np.float32)
        m = np.empty(group, np.float32)
        block_dot = np.empty(group, np.float32)               # q . x over one block, for each of the R rows
        acc = np.zeros((rows, group), np.float32)             # (T, R)
        for b in range(num_blocks):
            _halves_to_float(group_scales[g, b], bits, d)
            _halves_to_float(group_mins[g, b], bits, m)
            for t in range(rows):
                block_dot[:] = 0.0
                for j in range(half):                         # byte j of R blocks: weights j and j + 16 of each
                    x_high_16th = x[t, b * 2 * half + half + j] * np.float32(0.0625)
                    x_low = x[t, b * 2 * half + j] - x_high_16th
                    codes = grouped[g, b, j]                  # (R,)
                    for r in range(group):                    # low x_j + high x_j+16, high = (byte - low) / 16
                        block_dot[r] += np.float32(codes[r] & np.uint8(15)) * x_low + np.float32(codes[r]) * x_high_16th
                for r in range(group):                        # sum of (d q + m) x = d (q . x) + m (sum of x)
                    acc[t, r] += d[r] * block_dot[r] + m[r] * block_sums[t, b]
        _write_group(acc, g, residual, add_residual, out)


def group_blocks(codes: np.ndarray, *per_block: np.ndarray) -> tuple:
    """A weight's blocks interleaved by groups of ROW_GROUP rows, for the few-rows kernels: codes (N, K/32 * B)
    -> grouped (G, K/32, B, R), where grouped[g, b, j, r] is byte j of block b of row g R + r; each of
    per_block (scales, and mins for q4_1; (N, K/32)) -> (G, K/32, R). The same bytes in another order;
    rows past N are zero padding."""
    rows, num_blocks = per_block[0].shape
    groups = -(-rows // ROW_GROUP)
    padded = lambda a: np.concatenate([a, np.zeros((groups * ROW_GROUP - rows,) + a.shape[1:], a.dtype)])
    grouped = padded(codes).reshape(groups, ROW_GROUP, num_blocks, -1).transpose(0, 2, 3, 1)
    by_group = lambda a: padded(a).reshape(groups, ROW_GROUP, num_blocks).transpose(0, 2, 1)
    return tuple(np.ascontiguousarray(a) for a in (grouped, *map(by_group, per_block)))
