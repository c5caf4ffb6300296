"""Products with block-quantised weights on the CPU, compiled with Numba (`EngineConfig.quantization`).

The torch reference (`quantized_torch`) expands the whole weight to fp32 and then multiplies. These
kernels never build that matrix: a decode step is bound by reading the weights, so each reads the
weight's bytes once and turns codes into floats in registers or in a buffer that stays in cache.
Each format has two kernels, on two orders of the same bytes (`host_arrays` makes both, once):

- **Many rows** (`_q8_0_many_into`, `_q4_1_many_into`; more than FEW_ROWS rows of x: prefill chunks,
  larger batches). Two rows of the weight at a time, in the file's order: expand their K weights
  into a buffer (6 KB a row for K = 1536), then multiply them into every one of the T rows of x,
  four rows of x at a time (`_dot2x4`: eight sums in registers, each value loaded used four or two
  times). A step of 8 sequences reads the same bytes from memory as a step of 1. Measured with
  `python scripts/quant_ab.py --skip engine --rows 8 32`: the 30 layers' q4_1 at 32 rows (a
  prefill chunk) 88-90 -> 60 ms, as fast as oneDNN's float32 (61-65 ms); at 8 rows 26-27 -> 23 ms.
- **A few rows** (`_q8_0_few_into`, `_q4_1_few_into`; 1 to FEW_ROWS rows: a decode step of one or
  two users). With one row of x there is nothing to share the expanded buffer with, and writing it
  then reading it back, plus summing each row's products across SIMD lanes, cost more than the
  multiply-adds. So the weight is kept a second time with ROW_GROUP rows interleaved
  (`group_blocks`): byte j of block b of 64 consecutive rows lies side by side, and the loop over
  those 64 rows is the one the compiler vectorises: each code becomes a float in a SIMD lane and
  is multiplied by the same x, with no sum across lanes until the row ends. Per block of 32 weights:

      sum_k (d q_k + m) x_k = d (sum_k q_k x_k) + m (sum_k x_k)      (q4_1; q8_0 has no m)

  so the inner loop multiplies codes by x alone, and d and m are applied once a block. A q4_1 byte
  holds q_j (low nibble) and q_j+16 (high): high = (byte - low) / 16, so
  low x_j + high x_j+16 = low (x_j - x_j+16 / 16) + byte (x_j+16 / 16), and the loop needs no shift
  (Numba widens a shifted byte to 64 bits, which defeats the vector loop).
  Measured on a 2-core AVX2 CPU with `python scripts/quant_ab.py --skip engine` (SmolLM2-135M's
  products at one row): the 30 layers' q4_1 14.0 -> 6.9 ms, q8_0 10.5 -> 7.0 ms; the q8_0 LM head
  2.6 -> 1.4 ms.

Work is split over chunks of output rows (or row groups) with `prange`, so no two threads write the
same output; `_q8_0_into` and `_q4_1_into` pick the kernel by the number of rows and write into a
given output, adding a residual if asked, as the compiled decode layer (`layer_cpu`) calls them.
Scales and minimums are fp16, which Numba cannot load, so their bits are turned into fp32 first
(`_halves_to_float`: exact, subnormals included). `fastmath=True` lets the compiler reorder the
sums into SIMD lanes, so results match the reference to rounding, not bit for bit. The block length
is passed in rather than written as the constant 32: a loop of unknown length gets vectorised,
while a constant one is unrolled into scalar code. Compiled code is cached on disk (`cache=True`).
"""
from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

BLOCK = 32          # weights per block, along a row
ROWS_PER_TASK = 16  # output rows a thread takes at a time: large enough to amortise its scratch buffers
FEW_ROWS = 3        # up to this many rows of x, the products run on row groups (`_q8_0_few_into`, `_q4_1_few_into`)
ROW_GROUP = 64      # rows of a weight interleaved together for those kernels


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


@njit(inline="always")
def _write_group(acc, g, residual, add_residual, out):
    """out[:, g R : (g + 1) R] = acc (T, R) (+ residual), leaving out the padding rows past N of the last group."""
    group = acc.shape[1]
    for r in range(min(group, out.shape[1] - g * group)):
        n = g * group + r
        for t in range(acc.shape[0]):
            out[t, n] = acc[t, r] + residual[t, n] if add_residual else acc[t, r]


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _q8_0_many_into(x, codes, scales, block, residual, add_residual, out):
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


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _q8_0_few_into(x, grouped, group_scales, residual, add_residual, out):
    """The same product for one to FEW_ROWS rows of x, on the weight's blocks interleaved by `group_blocks`."""
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


@njit(nogil=True, cache=True)
def _q8_0_into(x, codes, scales, block, grouped, group_scales, residual, add_residual, out):
    """out (T, N) = x (T, K) times the q8_0 weight (+ residual): interleaved groups for a few rows, else row by row."""
    if x.shape[0] <= FEW_ROWS:
        _q8_0_few_into(x, grouped, group_scales, residual, add_residual, out)
    else:
        _q8_0_many_into(x, codes, scales, block, residual, add_residual, out)


@njit(nogil=True, cache=True)
def _q8_0_matmul(x, codes, scales, block, grouped, group_scales):
    out = np.empty((x.shape[0], codes.shape[0]), np.float32)  # (T, N)
    _q8_0_into(x, codes, scales, block, grouped, group_scales, out, False, out)
    return out


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _q4_1_many_into(x, codes, scales, mins, block, residual, add_residual, out):
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


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _q4_1_few_into(x, grouped, group_scales, group_mins, residual, add_residual, out):
    """The same product for one to FEW_ROWS rows of x, on the weight's blocks interleaved by `group_blocks`."""
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


@njit(nogil=True, cache=True)
def _q4_1_into(x, codes, scales, mins, block, grouped, group_scales, group_mins, residual, add_residual, out):
    """out (T, N) = x (T, K) times the q4_1 weight (+ residual): interleaved groups for a few rows, else row by row."""
    if x.shape[0] <= FEW_ROWS:
        _q4_1_few_into(x, grouped, group_scales, group_mins, residual, add_residual, out)
    else:
        _q4_1_many_into(x, codes, scales, mins, block, residual, add_residual, out)


@njit(nogil=True, cache=True)
def _q4_1_matmul(x, codes, scales, mins, block, grouped, group_scales, group_mins):
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


def _rows(x: torch.Tensor) -> np.ndarray:
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
