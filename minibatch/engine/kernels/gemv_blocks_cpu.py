"""The streamed product's blocks: a dozen rows and more by a weight, four rows by four weight rows (Numba, CPU).

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
start above four rows (BLOCK_ROWS). On a 2-core Xeon with AVX-512 (`python scripts/linear_ab.py`, layers
and head), the products at 8 / 12 / 16 / 32 / 64 rows took 22.6 / 27.3 / 33.9 / 55.7 / 94.5 ms against
26.7 / 33.1 / 39.9 / 62.8 / 107.9 ms in eight lanes with blocks above eight rows; one row 19.8 ms. Two or
three rows left over go in a block that overlaps the one before: six / seven rows 25.2 / 25.6 ms, not 28.8 / 33.5.

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
"""
from __future__ import annotations

import numpy as np
from numba import njit

from minibatch.engine.kernels.bfloat16 import get, put
from minibatch.engine.kernels.lanes import LANES, fma8, lane, load8, prefetch, sums8, zero8
from minibatch.engine.kernels.lanes16 import LANES16, WIDE, fma16, fold16, load16, zero16

PREFETCH_AHEAD = 4     # the weight row asked for while this one is multiplied (`kernels.gemv_cpu` says why)
LINE = 16              # float32 values in a 64-byte cache line
BLOCK_ROWS = 4 if WIDE else 8   # above this many rows, blocks of four rows by four weight rows
K_CHUNK = 768          # weight rows longer than this go a chunk of columns at a time (`gemv_cpu`'s eight rows:
                       # chunks of at most 768, 8 x 768 float32 = 24 KB)
BLOCK_K_CHUNK = 384    # the blocks' chunks: about this many columns
CHUNKED_ROWS = 32      # the blocks chunk up to this many rows (more: the sums cost more than the cache saves)


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
    """Ask the memory for weight[ahead:ahead + asked, k:k+16] (asked: 0 to 4), one cache line per row."""
    if asked > 0:
        prefetch(weight, ahead, k)
        if asked > 1:
            prefetch(weight, ahead + 1, k)
            if asked > 2:
                prefetch(weight, ahead + 2, k)
                if asked > 3:
                    prefetch(weight, ahead + 3, k)


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
def spread(block, blocks):
    """Which of the four weight rows ahead block number `block` of `blocks` asks the memory for: (first, stop)."""
    return 4 * block // blocks, 4 * (block + 1) // blocks


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
                first_asked, stop_asked = spread(block, blocks)
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
