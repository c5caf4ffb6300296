"""The streamed product's blocks: four rows of x by six or four weight rows at a time (Numba, CPU).

    out[t, n] = sum_k x[t, k] * weight[n, k]      x (T, K), weight (N, K), out (T, N), T > BLOCK_ROWS

`kernels.gemv_cpu` streams a weight through a few rows of x: eight or four rows against one weight
row, or one row against four weight rows. With more rows the weight row's reuse is the limit, not the
memory: eight rows of x are read again for each weight vector, and a few dozen rows of x no longer fit
the first-level cache. So above BLOCK_ROWS rows the rows go in blocks, the one idea of this module:

- **Four rows by four weight rows** (`_rows4_outputs4`): sixteen running sums, eight vectors loaded for
  sixteen multiply-adds, the four weight rows read from memory once and from the cache for every other
  block of rows. Past a few dozen rows a step is bound by these multiply-adds, not by the memory, as the
  roofline says; so where the CPU has 512-bit registers the blocks run in sixteen lanes
  (`kernels.lanes16`; eight elsewhere) and start at four rows (BLOCK_ROWS 3: three rows are padded to
  four by `gemv_cpu`).
- **Four rows by six weight rows** (`_rows4_outputs6`, sixteen lanes only): twenty-four running sums in
  24 of AVX-512's 32 registers, ten vectors loaded for twenty-four multiply-adds, so each vector of x
  brought from the second-level cache feeds six multiply-adds, not four. A thread's task is
  `gemv_cpu.ROWS_PER_TASK` weight rows, whole sixes and fours; the fours and single rows take the rest.
- **Overlap**: two or three rows left over go in a block that overlaps the one before (the same sums
  written twice), cheaper than streaming the weight again for each row.
- **Chunks of columns** (`blocks_in_chunks`): a block reads its four rows of x again for every weight
  rows it takes, so all the rows of x should stay in the first-level cache. For weight rows longer than
  K_CHUNK columns (SmolLM2's down projection: 1536) and up to CHUNKED_ROWS rows, the blocks take the
  columns about BLOCK_K_CHUNK at a time, their sums added to a float32 total per output.
- **Prefetch**: while a weight's rows are multiplied, the rows PREFETCH_AHEAD fours ahead are asked for,
  one cache line at a time, each block of rows asking for its share (`spread`), so every line is asked
  for once, evenly through the blocks' time.

Measurements: docs/performance.md, section "Blocks of rows".
"""
from __future__ import annotations

import numpy as np
from numba import njit

from minibatch.engine.kernels.bfloat16 import get, put
from minibatch.engine.kernels.lanes import LANES, fma8, lane, load8, prefetch, sums8, zero8
from minibatch.engine.kernels.lanes16 import LANES16, WIDE, fma16, fold16, load16, zero16

PREFETCH_AHEAD = 4     # the weight row asked for while this one is multiplied (`kernels.gemv_cpu` says why)
LINE = 16              # float32 values in a 64-byte cache line
BLOCK_ROWS = 3 if WIDE else 8   # above this many rows, blocks of four rows by six or four weight rows
K_CHUNK = 768          # weight rows longer than this go a chunk of columns at a time (`gemv_cpu`'s eight rows:
                       # chunks of at most 768, 8 x 768 float32 = 24 KB)
BLOCK_K_CHUNK = 384    # the blocks' chunks: about this many columns
CHUNKED_ROWS = 16 if WIDE else 32   # the blocks chunk up to this many rows (more: the sums cost more than the
                                     # cache saves, and in sixteen lanes four by six blocks do better unchunked)


@njit(inline="always")
def _rest(weight, x, n, t, start):
    """x[t, start:] . weight[n, start:]: the last columns past the whole vectors, one by one (none when the
    vectors cover K); x float32, or bfloat16 bits (`kernels.pairs_bf16`)."""
    total = np.float32(0.0)
    for k in range(start, weight.shape[1]):
        total += get(x, (t, k)) * get(weight, (n, k))
    return total


@njit(inline="always")
def _same(v):
    return v


# The block loop's vectors: sixteen lanes where the CPU has 512-bit registers (`kernels.lanes16`), else eight
BLOCK_LANES, _zero, _load, _fma, _fold = (LANES16, zero16, load16, fma16, fold16) if WIDE else (
    LANES, zero8, load8, fma8, _same)


@njit(inline="always")
def _ask(weight, ahead, asked, k):
    """Ask the memory for weight[ahead:ahead + asked, k:k+16] (asked: 0 to 6), one cache line per row."""
    if asked > 0:
        prefetch(weight, ahead, k)
        if asked > 1:
            prefetch(weight, ahead + 1, k)
            if asked > 2:
                prefetch(weight, ahead + 2, k)
                if asked > 3:
                    prefetch(weight, ahead + 3, k)
                    if asked > 4:
                        prefetch(weight, ahead + 4, k)
                        if asked > 5:
                            prefetch(weight, ahead + 5, k)


@njit(inline="always")
def _block_sums(weight, x, n, t, ahead, asked, start, stop):
    """x[t:t+4] . weight[n:n+4] over columns start:stop (whole vectors), as two float32x8: lane 4 i + j of the
    first is row t + i against weight row n + j, of the second row t + 2 + i. Sixteen running sums, eight
    vectors loaded for sixteen multiply-adds; weight rows ahead to ahead + asked are asked for meanwhile."""
    s00, s01, s02, s03 = _zero(), _zero(), _zero(), _zero()    # s<i><j>: row t + i against weight row n + j
    s10, s11, s12, s13 = _zero(), _zero(), _zero(), _zero()
    s20, s21, s22, s23 = _zero(), _zero(), _zero(), _zero()
    s30, s31, s32, s33 = _zero(), _zero(), _zero(), _zero()
    for k in range(start, stop, BLOCK_LANES):
        if k % LINE == 0:                                        # (every vector, in sixteen lanes)
            _ask(weight, ahead, asked, k)
        w0, w1, w2, w3 = _load(weight, n, k), _load(weight, n + 1, k), _load(weight, n + 2, k), _load(weight, n + 3, k)
        v = _load(x, t, k)
        s00, s01, s02, s03 = _fma(v, w0, s00), _fma(v, w1, s01), _fma(v, w2, s02), _fma(v, w3, s03)
        v = _load(x, t + 1, k)
        s10, s11, s12, s13 = _fma(v, w0, s10), _fma(v, w1, s11), _fma(v, w2, s12), _fma(v, w3, s13)
        v = _load(x, t + 2, k)
        s20, s21, s22, s23 = _fma(v, w0, s20), _fma(v, w1, s21), _fma(v, w2, s22), _fma(v, w3, s23)
        v = _load(x, t + 3, k)
        s30, s31, s32, s33 = _fma(v, w0, s30), _fma(v, w1, s31), _fma(v, w2, s32), _fma(v, w3, s33)
    rows01 = sums8(_fold(s00), _fold(s01), _fold(s02), _fold(s03), _fold(s10), _fold(s11), _fold(s12), _fold(s13))
    rows23 = sums8(_fold(s20), _fold(s21), _fold(s22), _fold(s23), _fold(s30), _fold(s31), _fold(s32), _fold(s33))
    return rows01, rows23


@njit(inline="always")
def _rows4_outputs4(weight, x, n, t, ahead, asked, out):
    """out[t:t+4, n:n+4] = x[t:t+4] . weight[n:n+4]: a block of four rows by four weight rows."""
    last = weight.shape[1] - weight.shape[1] % BLOCK_LANES
    rows01, rows23 = _block_sums(weight, x, n, t, ahead, asked, 0, last)
    for i in range(2):                                           # lane 4 i + j: row t + i, weight row n + j
        for j in range(4):
            put(out, (t + i, n + j), lane(rows01, 4 * i + j) + _rest(weight, x, n + j, t + i, last))
            put(out, (t + 2 + i, n + j), lane(rows23, 4 * i + j) + _rest(weight, x, n + j, t + 2 + i, last))


@njit(inline="always")
def _block6_sums(weight, x, n, t, ahead, asked, last):
    """x[t:t+4] . weight[n:n+6] over the whole vectors of the columns (sixteen lanes), as four float32x8: lane j
    of the i-th is row t + i against weight row n + j (lanes 6 and 7 zero). Twenty-four running sums, ten vectors
    loaded for twenty-four multiply-adds; weight rows ahead to ahead + asked are asked for meanwhile."""
    s00, s01, s02, s03, s04, s05 = zero16(), zero16(), zero16(), zero16(), zero16(), zero16()
    s10, s11, s12, s13, s14, s15 = zero16(), zero16(), zero16(), zero16(), zero16(), zero16()
    s20, s21, s22, s23, s24, s25 = zero16(), zero16(), zero16(), zero16(), zero16(), zero16()
    s30, s31, s32, s33, s34, s35 = zero16(), zero16(), zero16(), zero16(), zero16(), zero16()
    for k in range(0, last, LANES16):
        _ask(weight, ahead, asked, k)                            # (a cache line is sixteen lanes)
        x0, x1, x2, x3 = load16(x, t, k), load16(x, t + 1, k), load16(x, t + 2, k), load16(x, t + 3, k)
        w = load16(weight, n, k)
        s00, s10, s20, s30 = fma16(x0, w, s00), fma16(x1, w, s10), fma16(x2, w, s20), fma16(x3, w, s30)
        w = load16(weight, n + 1, k)
        s01, s11, s21, s31 = fma16(x0, w, s01), fma16(x1, w, s11), fma16(x2, w, s21), fma16(x3, w, s31)
        w = load16(weight, n + 2, k)
        s02, s12, s22, s32 = fma16(x0, w, s02), fma16(x1, w, s12), fma16(x2, w, s22), fma16(x3, w, s32)
        w = load16(weight, n + 3, k)
        s03, s13, s23, s33 = fma16(x0, w, s03), fma16(x1, w, s13), fma16(x2, w, s23), fma16(x3, w, s33)
        w = load16(weight, n + 4, k)
        s04, s14, s24, s34 = fma16(x0, w, s04), fma16(x1, w, s14), fma16(x2, w, s24), fma16(x3, w, s34)
        w = load16(weight, n + 5, k)
        s05, s15, s25, s35 = fma16(x0, w, s05), fma16(x1, w, s15), fma16(x2, w, s25), fma16(x3, w, s35)
    return (sums8(fold16(s00), fold16(s01), fold16(s02), fold16(s03), fold16(s04), fold16(s05), zero8(), zero8()),
            sums8(fold16(s10), fold16(s11), fold16(s12), fold16(s13), fold16(s14), fold16(s15), zero8(), zero8()),
            sums8(fold16(s20), fold16(s21), fold16(s22), fold16(s23), fold16(s24), fold16(s25), zero8(), zero8()),
            sums8(fold16(s30), fold16(s31), fold16(s32), fold16(s33), fold16(s34), fold16(s35), zero8(), zero8()))


@njit(inline="always")
def _rows4_outputs6(weight, x, n, t, ahead, asked, out):
    """out[t:t+4, n:n+6] = x[t:t+4] . weight[n:n+6]: a block of four rows by six weight rows (sixteen lanes only:
    twenty-four sums need 24 of the 32 vector registers AVX-512 has)."""
    last = weight.shape[1] - weight.shape[1] % LANES16
    sums = _block6_sums(weight, x, n, t, ahead, asked, last)
    for i in range(4):
        for j in range(6):
            put(out, (t + i, n + j), lane(sums[i], j) + _rest(weight, x, n + j, t + i, last))


@njit(inline="always")
def spread(block, blocks, width):
    """Which of the `width` weight rows ahead block number `block` of `blocks` asks the memory for: (first, stop)."""
    return width * block // blocks, width * (block + 1) // blocks


@njit(inline="always")
def blocks_of(weight, x, n, end, width, overlap, out):
    """out[:, n:m] for the whole `width`s (six or four) of weight rows from n to end (m returned, the first not
    done): every block of four rows of x (and, if `overlap`, one at the last four rows) by each `width` weight
    rows in turn, while the weight rows 4 PREFETCH_AHEAD further on are asked for, each block its share."""
    rows, num_outputs = x.shape[0], weight.shape[0]
    blocks = rows // 4 + (1 if overlap else 0)
    while n + width <= end:
        ahead = min(n + 4 * PREFETCH_AHEAD, num_outputs - width)
        for block in range(blocks):
            first_asked, stop_asked = spread(block, blocks, width)
            t = min(4 * block, rows - 4)                         # the overlapping block: the last four rows
            if width == 6:
                _rows4_outputs6(weight, x, n, t, ahead + first_asked, stop_asked - first_asked, out)
            else:
                _rows4_outputs4(weight, x, n, t, ahead + first_asked, stop_asked - first_asked, out)
        n += width
    return n


@njit(inline="always")
def chunks_columns(weight, rows):
    """Whether the blocks of `rows` rows take the weight's columns a chunk at a time (see above)."""
    return weight.shape[1] > K_CHUNK and rows <= CHUNKED_ROWS


@njit(inline="always")
def blocks_in_chunks(weight, x, first, end, overlap, out):
    """out[:, first:n] for the whole fours of weight rows from first (n returned, the first not done): the blocks
    of every four rows of x (and, if `overlap`, one at the last four rows, of which only the rows past the
    whole fours count) over one chunk of columns after another; the sums kept in float32 until the last chunk."""
    rows, num_outputs = x.shape[0], weight.shape[0]
    last = weight.shape[1] - weight.shape[1] % BLOCK_LANES
    width = (last // ((last + BLOCK_K_CHUNK - 1) // BLOCK_K_CHUNK) + LINE - 1) // LINE * LINE   # whole cache lines
    whole_fours, stop_n = rows - rows % 4, first + (end - first) // 4 * 4
    total = np.zeros((rows, stop_n - first), np.float32)         # (T, the task's whole fours) sums so far
    for start in range(0, last, width):
        stop = min(start + width, last)
        for n in range(first, stop_n, 4):
            ahead = min(n + 4 * PREFETCH_AHEAD, num_outputs - 4)
            blocks = whole_fours // 4 + (1 if overlap else 0)
            for block in range(blocks):
                t = min(4 * block, rows - 4)                     # the overlapping block: the last four rows
                counted = whole_fours if t + 4 > whole_fours else t   # of which those below whole_fours are summed
                first_asked, stop_asked = spread(block, blocks, 4)
                rows01, rows23 = _block_sums(weight, x, n, t, ahead + first_asked, stop_asked - first_asked,
                                             start, stop)
                for i in range(2):
                    for j in range(4):
                        if t + i >= counted:
                            total[t + i, n - first + j] += lane(rows01, 4 * i + j)
                        if t + 2 + i >= counted:
                            total[t + 2 + i, n - first + j] += lane(rows23, 4 * i + j)
    for n in range(first, stop_n):
        for t in range(rows if overlap else whole_fours):
            put(out, (t, n), total[t, n - first] + _rest(weight, x, n, t, last))
    return stop_n
