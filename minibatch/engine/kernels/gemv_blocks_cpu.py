"""The streamed product's blocks: a dozen rows and more by a weight, four rows by six or four weight rows (Numba, CPU).

`kernels.gemv_cpu` streams a weight through a few rows of x: eight or four rows against one weight
row, or one row against four weight rows. Above BLOCK_ROWS rows the weight row's reuse is the limit,
not the memory: eight rows of x are read for each weight vector, and thirty-two rows of x (73 KB at
576 columns) no longer fit the first-level cache. So there the rows go in blocks of four rows by
four weight rows (`_rows4_outputs4`): sixteen running sums, eight vectors loaded for sixteen
multiply-adds, the four weight rows read from memory once and from the cache for every other block
of rows. On a 2-core AVX-512 EPYC (`python scripts/linear_ab.py --rows 9 12 16 24 32 48 64 96`, the
30 layers' products and the LM head):

    rows          9       12       16       24       32       48       64       96
    oneDNN     34.4 ms  37.3 ms  37.6 ms  44.0 ms  56.5 ms  93.2 ms   116 ms   142 ms
    streamed   29.0 ms  28.6 ms  36.6 ms  40.0 ms  53.3 ms  83.8 ms   104 ms   167 ms

At 32 rows that is 8.6 GFLOP in 53 ms, 162 GFLOP/s, near the 150-196 GFLOP/s a large GEMM reaches
there: past a few dozen rows a step is compute-bound, as the roofline says.

A block loads half a vector per multiply-add where eight rows against one weight row load more than
one, so on a CPU with AVX-512 blocks run in sixteen lanes (`kernels.lanes16`; eight elsewhere) and
started above four rows (from four now, see below). On a 2-core Xeon with AVX-512 (`python scripts/linear_ab.py`, layers
and head), the products at 8 / 12 / 16 / 32 / 64 rows took 22.6 / 27.3 / 33.9 / 55.7 / 94.5 ms against
26.7 / 33.1 / 39.9 / 62.8 / 107.9 ms in eight lanes with blocks above eight rows; one row 19.8 ms. Two or
three rows left over go in a block that overlaps the one before: six / seven rows 25.2 / 25.6 ms, not 28.8 / 33.5.
In sixteen lanes blocks now start at four rows (BLOCK_ROWS 3; three rows are padded to four, `gemv_cpu`): four
weight rows read side by side rather than one at a time, as one row does (`gemv_cpu._row1_outputs4`). On the Xeon,
`python scripts/linear_ab.py --rows 1 3 4 5 --reps 5`, three runs each way, four rows' products took 2.0-2.6 ms
more than one row's where they took 3.3-4.5 ms more one weight row at a time (bfloat16, `--dtype bfloat16`:
12.5-12.8 + 1.9-2.4 ms against 13.7-14.7 + 2.8-2.9); whole decode steps of three / four sequences (`layer_ab.py
--batch-sizes 1 3 4 8 --rounds 3`, two runs each way) 25.7-26.2 / 25.3-25.9 ms against 26.7-27.3 / 26.2-26.9.

A block's four rows of x are read again for every four weight rows, so all the rows of x should stay
in the first-level cache. For SmolLM2's down projection (1536 columns) eight rows are 48 KB, more
than many CPUs' 32-48 KB. So for weight rows longer than K_CHUNK (768) columns, and
up to CHUNKED_ROWS rows, the blocks take the columns a chunk of about BLOCK_K_CHUNK (384) at a time
(`blocks_in_chunks`): every block of the thread's task over one chunk, its sums added to a float32
total per output, then the next chunk; x's chunk (16 rows: 24 KB) stays in the cache for all of them.
On that Xeon (`python scripts/linear_ab.py --products down --rows 1 8 12 16 32 64`, two runs each way), the
30 down projections at 8 / 12 / 16 / 32 rows took 4.3-4.4 / 5.0-5.1 / 6.3-6.4 / 10.9 ms against 5.0 / 5.7-5.9 /
7.0 / 11.2 (one row 3.7-3.9). With CHUNKED_ROWS or K_CHUNK changed, chunks were slower at 64 rows, and for the
576-column weights at every row count, so they stop there.

While a weight's four rows are multiplied, the four rows PREFETCH_AHEAD fours ahead are asked for
(`prefetch`, one cache line at a time). Every block of rows used to ask for all four, so at sixteen
rows each line was asked for four times; now each block asks for its share (`spread`: of four blocks,
one row each; of two, two), so the requests go out once, evenly through the blocks' time. On the Xeon,
`python scripts/linear_ab.py --rows 1 8 12 16 24 32 --reps 5`, two runs each way, layers + head:
12 / 16 / 24 / 32 rows 23.2-23.4 + 4.6 / 26.9-27.0 + 6.2-6.3 / 34.4-34.6 + 8.5 / 40.3-40.4 + 10.3-10.4 ms
against 24.2 + 5.2-5.5 / 28.7-28.9 + 7.1 / 36.5-36.7 + 9.4-9.5 / 44.7-45.0 + 11.7-11.8; one and eight rows the
same. A block asks for its rows unrolled (`_ask`), not in a loop of `asked` turns inside the block's loop: the
layers' products at 16 / 24 / 32 rows 33.3 / 41.5 / 49.1 ms against 34.1 / 43.1 / 49.9 (means of three runs
each way, 2-4%, at the edge of the noise).

From 16 rows on, the loop is bound by its own arithmetic, not by the memory: `python scripts/stream_rates.py`
times it with the weight in the second-level cache and read from memory, and at 32 rows the two rates are
close (72-101 and 67-82 billion multiply-adds a second on the Xeon, three runs), where at 8 rows the memory
rate is about half the cache rate (36-42 against 73-74).

So in sixteen lanes the blocks are four rows by six weight rows (`_rows4_outputs6`): twenty-four running
sums in 24 of AVX-512's 32 registers, ten vectors loaded for twenty-four multiply-adds, and each vector of x
brought from the second-level cache feeds six multiply-adds, not four (a task's weight rows stay in the
first-level cache while the blocks of rows go by). A task is `gemv_cpu.ROWS_PER_TASK` (24) weight rows, whole sixes
and fours; the fours and single rows take what is left. On the Xeon, `python scripts/stream_rates.py --rows
8 16 24 32 64`, against four by four: in cache 99-107 GFMA/s from 16 rows (70 before), from memory 61.5 /
78.6 / 88.1 / 91.3 at 16 / 24 / 32 / 64 rows (55.6 / 60.8 / 63.8 / 67.5), 8 rows the same; `python
scripts/layer_ab.py --batch-sizes 1 8 16 32 48 --rounds 3`, two runs each way, whole decode steps of 32 / 48
sequences 64.6-65.6 / 90.1-90.8 ms against 67.7-69.9 / 95.8-97.2, up to 16 the same. Tasks of 48 weight rows
were slower up to 16 rows (8 / 16 rows 27.3-27.8 / 33.6-34.7 ms against 26.2 / 31.9-32.3, `linear_ab.py`).
The down projection's long rows still go in chunks up to CHUNKED_ROWS (16 in sixteen lanes) rows, where four
by four chunked is the faster; above it, by six unchunked: at 32 rows 12.8-13.3 ms against 13.8-14.0
(`linear_ab.py --products down`).
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
    vectors cover K)."""
    total = np.float32(0.0)
    for k in range(start, weight.shape[1]):
        total += x[t, k] * get(weight, (n, k))
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
