"""The product of a few rows by a float32 or bfloat16 weight, streamed at memory speed (Numba, CPU).

    out[t, n] = residual[t, n] + sum_k x[t, k] * weight[n, k]      (residual optional)
    x (T, K), weight (N, K), residual and out (T, N); public entry: `streamed_linear`

At batch 1 a decode step is a chain of matrix-vector products: each reads its whole weight once
and does one multiply-add per weight read, so its time is the weight's bytes over the memory
bandwidth. Up to the knee of the roofline a few more rows should cost almost nothing more: the
weight is read once whatever the number of rows. A library GEMM is built for many rows; for a few
it pays for blocking and packing that a plain loop does not need. The one idea here: read each
weight row once, in order, and multiply it into every row of the batch while it is in a register.

The rows of x are taken eight at a time, then four (`_rows8`, `_rows4`), and the loop is written
in eight-float vectors (`kernels.lanes`): eight weights are loaded into a register once and
multiplied into eight (or four) running sums, one per row, so the loop does eight vector
multiply-adds per weight vector it loads. The last rows % 4 rows (all of them at batch 1) go the
other way round: one row of x against four weight rows side by side (`_row1_outputs4`), so four
streams from memory are in flight at once rather than one. Three rows left over (three rows, or seven
below blocks) would go that way three times, so x gets its last row again and they go as four, the
copy's products dropped. At the end the sums are reduced together (`sums8`), and the last K % 8
columns, if any, one by one. Threads split the output rows in tasks of ROWS_PER_TASK (`prange`), so
each thread streams its own part of the weight and no two threads write the same output; a task is a
compiled function of its own (`_task`), so the code the disk cache keeps for it is the code compiled for
it (`_task` says why). Results equal `F.linear`'s up to the order of the additions.

With several rows the loop computes as well as reads, and while it computes, the memory must
already be fetching the weights it reads next, or the two add up instead of overlapping. The
CPU's own prefetcher guesses that for a plain stream, but not always early enough; so each loop
also asks for the weight row PREFETCH_AHEAD rows ahead (`prefetch`: once per 64-byte cache line,
into the second-level cache, `prefetcht1`; a hint that reaches the first-level cache evicts the rows
of x too early).

Eight rows of x are read again for every weight row, so they must stay in the first-level cache
(32 KB on many CPUs). For SmolLM2's down projection (1536 columns) eight rows are 48 KB, so for rows
longer than K_CHUNK (768) columns, eight rows at a time are multiplied a chunk of columns at a time
(`_rows8_in_chunks`: 24 KB of x), by all the weight rows of a thread's task, the sums kept in float32
from one chunk to the next.

Above BLOCK_ROWS rows the rows go in blocks of four rows by six or four weight rows
(`kernels.gemv_blocks_cpu`, which says why and holds the constants both use: PREFETCH_AHEAD, LINE,
K_CHUNK). The fast path's table (`engine.ops.products`) uses this loop for up to STREAM_ROWS rows, and
oneDNN's packed GEMM above (in bfloat16, above a crossover measured on the machine, `engine.ops.crossover`).

In bfloat16 the same loop reads the weight's bits (`kernels.bfloat16`): each eight 2-byte weights are
loaded at once and widened to floats in the register (a shift of each lane by 16 bits), x is widened
once per call, the sums are float32 (the product of two bfloat16s is exact in float32) and each
output is rounded to bfloat16 as it is stored, then again after the residual is added, as
transformers rounds `residual + product`: half the bytes read for the same arithmetic. Past a few rows that
arithmetic is the limit, so where the CPU multiplies bfloat16 pairs in one instruction (AVX512-BF16), four rows
or more go to `kernels.pairs_bf16` instead, which does the same products in half the instructions.
Compiled code is cached on disk (`cache=True`), and dropped when a file it compiles in changes (`kernels.stale_cache`).

Measurements: docs/performance.md, sections "Streamed products" and "bfloat16".
"""
from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from minibatch.engine.kernels import bfloat16, gemv_blocks_cpu, lanes, lanes16, pairs_bf16
from minibatch.engine.kernels.bfloat16 import as_float32, get, host_view, put
from minibatch.engine.kernels.gemv_blocks_cpu import (BLOCK_ROWS, K_CHUNK, LINE, PREFETCH_AHEAD, _rest,
                                                     blocks_in_chunks, blocks_of, chunks_columns)
from minibatch.engine.kernels.lanes import LANES, fma8, lane, load8, prefetch, sum8, sums8, zero8
from minibatch.engine.kernels.lanes16 import WIDE
from minibatch.engine.kernels.pairs_bf16 import pairs_product, takes_pairs
from minibatch.engine.kernels.stale_cache import forget_stale

STREAM_ROWS = 64       # up to this many rows this loop beats oneDNN's packed GEMM (see above)
ROWS_PER_TASK = 24     # weight rows a thread takes at a time (whole sixes and fours of blocks)


@njit(inline="always")
def _rows8_sums(weight, x, n, t, ahead, start, stop):
    """[x[t] . weight[n], ..., x[t+7] . weight[n]] over columns start:stop (whole vectors): eight weights loaded
    at once, each multiplied into eight rows."""
    s0, s1, s2, s3, s4, s5, s6, s7 = zero8(), zero8(), zero8(), zero8(), zero8(), zero8(), zero8(), zero8()
    for k in range(start, stop, LANES):
        if k % LINE == 0:
            prefetch(weight, ahead, k)                          # weight[ahead, k:k+16], one cache line
        w = load8(weight, n, k)                                 # weight[n, k:k+8]
        s0, s1 = fma8(w, load8(x, t, k), s0), fma8(w, load8(x, t + 1, k), s1)
        s2, s3 = fma8(w, load8(x, t + 2, k), s2), fma8(w, load8(x, t + 3, k), s3)
        s4, s5 = fma8(w, load8(x, t + 4, k), s4), fma8(w, load8(x, t + 5, k), s5)
        s6, s7 = fma8(w, load8(x, t + 6, k), s6), fma8(w, load8(x, t + 7, k), s7)
    return sums8(s0, s1, s2, s3, s4, s5, s6, s7)


@njit(inline="always")
def _rows8(weight, x, n, t, ahead, out):
    """out[t:t+8, n] = x[t:t+8] . weight[n]."""
    last = weight.shape[1] - weight.shape[1] % LANES
    sums = _rows8_sums(weight, x, n, t, ahead, 0, last)
    for i in range(8):
        put(out, (t + i, n), lane(sums, i) + _rest(weight, x, n, t + i, last))


@njit(inline="always")
def _rows8_in_chunks(weight, x, first, end, t, out):
    """out[t:t+8, first:end] for a weight whose rows are longer than K_CHUNK: the columns in equal chunks of at
    most K_CHUNK, each multiplied by all the task's weight rows while its eight rows of x stay in the first-level
    cache; the sums kept in float32 until the last chunk."""
    num_outputs, last = weight.shape[0], weight.shape[1] - weight.shape[1] % LANES
    chunks = (last + K_CHUNK - 1) // K_CHUNK
    width = (last // chunks + LINE - 1) // LINE * LINE          # whole cache lines of float32
    partial = np.zeros((8, end - first), np.float32)            # (8, the task's rows) sums so far
    for start in range(0, last, width):
        stop = min(start + width, last)
        for n in range(first, end):
            sums = _rows8_sums(weight, x, n, t, min(n + PREFETCH_AHEAD, num_outputs - 1), start, stop)
            for i in range(8):
                partial[i, n - first] += lane(sums, i)
    for n in range(first, end):
        for i in range(8):
            put(out, (t + i, n), partial[i, n - first] + _rest(weight, x, n, t + i, last))


@njit(inline="always")
def _rows4(weight, x, n, t, ahead, out):
    """out[t:t+4, n] = x[t:t+4] . weight[n]: eight weights loaded at once, each multiplied into four rows."""
    s0, s1, s2, s3 = zero8(), zero8(), zero8(), zero8()
    last = weight.shape[1] - weight.shape[1] % LANES
    for k in range(0, last, LANES):
        if k % LINE == 0:
            prefetch(weight, ahead, k)
        w = load8(weight, n, k)
        s0, s1 = fma8(w, load8(x, t, k), s0), fma8(w, load8(x, t + 1, k), s1)
        s2, s3 = fma8(w, load8(x, t + 2, k), s2), fma8(w, load8(x, t + 3, k), s3)
    sums = sums8(s0, s1, s2, s3, zero8(), zero8(), zero8(), zero8())
    for i in range(4):
        put(out, (t + i, n), lane(sums, i) + _rest(weight, x, n, t + i, last))


@njit(inline="always")
def _row1(weight, x, n, t, ahead, out):
    """out[t, n] = x[t] . weight[n]: two running sums, so one addition need not wait for the one before."""
    s0, s1 = zero8(), zero8()
    last = weight.shape[1] - weight.shape[1] % LANES
    k = 0
    while k + 2 * LANES <= last:                           # (2 * LANES = LINE: one prefetch a cache line)
        prefetch(weight, ahead, k)
        s0 = fma8(load8(weight, n, k), load8(x, t, k), s0)
        s1 = fma8(load8(weight, n, k + LANES), load8(x, t, k + LANES), s1)
        k += 2 * LANES
    if k < last:
        s0 = fma8(load8(weight, n, k), load8(x, t, k), s0)
    put(out, (t, n), sum8(s0) + sum8(s1) + _rest(weight, x, n, t, last))


@njit(inline="always")
def _row1_outputs4(weight, x, n, t, ahead, out):
    """out[t, n:n+4] = x[t] . weight[n:n+4]: four weight rows read side by side, four running sums."""
    s0, s1, s2, s3 = zero8(), zero8(), zero8(), zero8()
    last = weight.shape[1] - weight.shape[1] % LANES
    for k in range(0, last, LANES):
        if k % LINE == 0:
            for i in range(4):
                prefetch(weight, ahead + i, k)
        v = load8(x, t, k)                                       # x[t, k:k+8], loaded once for four rows
        s0, s1 = fma8(load8(weight, n, k), v, s0), fma8(load8(weight, n + 1, k), v, s1)
        s2, s3 = fma8(load8(weight, n + 2, k), v, s2), fma8(load8(weight, n + 3, k), v, s3)
    sums = sums8(s0, s1, s2, s3, zero8(), zero8(), zero8(), zero8())
    for i in range(4):
        put(out, (t, n + i), lane(sums, i) + _rest(weight, x, n + i, t, last))


@njit(nogil=True, cache=True)
def _task(x, weight, residual, add_residual, products, out, first, end):
    """out[:, first:end] = x (T, K) . weight[first:end]^T, plus residual[:, first:end] if add_residual: one thread's
    task, multiplied into every row of x (blocks, eights, fours, then single rows) into products (out, or out with
    rows padded below). A function compiled and cached on its own, not inlined into `_stream`'s parallel loop:
    Numba caches a parallel function with its loop optimised again inside it, and that copy, loaded from the
    disk cache, ran up to a third slower than the loop compiled alone (docs/performance.md, section "Blocks
    of rows", its part on fresh compiles against the disk cache)."""
    rows, num_outputs = x.shape[0], weight.shape[0]
    whole_fours = rows - rows % 4                      # rows taken eight or four at a time
    done = 0                                           # rows already multiplied
    if rows > BLOCK_ROWS:                              # many rows: blocks of four rows by six or four weight rows;
        overlap = rows % 4 >= 2                        # two or three rows left: in a block overlapping the
        done = rows if overlap else whole_fours        # one before (the same sums written twice), cheaper
        n = first                                      # than streaming the weight again for each
        if chunks_columns(weight, rows):               # long weight rows: their columns a chunk at a time
            n = blocks_in_chunks(weight, x, first, end, overlap, products)
        if WIDE:                                       # six weight rows a block where registers allow
            n = blocks_of(weight, x, n, end, 6, overlap, products)
        n = blocks_of(weight, x, n, end, 4, overlap, products)
        for n in range(n, end):                        # the task's last weight rows, if fewer than four
            for t in range(0, whole_fours, 4):
                _rows4(weight, x, n, t, min(n + PREFETCH_AHEAD, num_outputs - 1), products)
            if overlap:
                _rows4(weight, x, n, rows - 4, min(n + PREFETCH_AHEAD, num_outputs - 1), products)
    while weight.shape[1] > K_CHUNK and done + 8 <= whole_fours:  # long rows: eight at a time, in chunks
        _rows8_in_chunks(weight, x, first, end, done, products)
        done += 8
    for n in range(first, end if done < whole_fours else first):  # weight row by weight row
        ahead = min(n + PREFETCH_AHEAD, num_outputs - 1)
        t = done
        while t + 8 <= whole_fours:
            _rows8(weight, x, n, t, ahead, products)
            t += 8
        if t < whole_fours:
            _rows4(weight, x, n, t, ahead, products)
    for t in range(max(done, whole_fours), rows):      # the last rows % 4 rows, four weight rows at a time
        n = first
        while n + 4 <= end:
            _row1_outputs4(weight, x, n, t, min(n + 4 * PREFETCH_AHEAD, num_outputs - 4), products)
            n += 4
        for n in range(n, end):
            _row1(weight, x, n, t, min(n + PREFETCH_AHEAD, num_outputs - 1), products)
    if add_residual:
        for n in range(first, end):
            for t in range(out.shape[0]):              # the product rounded, then its sum with the residual
                put(out, (t, n), get(products, (t, n)) + get(residual, (t, n)))
    elif rows > out.shape[0]:
        out[:, first:end] = products[:out.shape[0], first:end]


@njit(parallel=True, nogil=True, cache=True)
def _stream(x_stored, weight, residual, add_residual, out):
    """out (T, N) = x (T, K) . weight (N, K)^T, plus residual (T, N) if add_residual: each thread takes tasks of
    ROWS_PER_TASK weight rows (`_task`)."""
    if takes_pairs(x_stored, weight):                      # bfloat16, four rows or more: pair by pair (see above)
        pairs_product(x_stored, weight, residual, add_residual, out)
        return
    x = as_float32(x_stored)                               # x: (T, K), weight: (N, K), residual, out: (T, N)
    products = out                                         # (T, N), or (T + 1, N) when x gains a row below
    if x.shape[0] % 4 == 3 and x.shape[0] <= BLOCK_ROWS:   # three rows left over (see above)
        padded = np.empty((x.shape[0] + 1, x.shape[1]), np.float32)   # (T + 1, K): the last row twice, so they
        padded[:-1] = x                                    # go four at a time, in one pass; its products are
        padded[-1] = x[-1]                                 # dropped
        x = padded
        products = np.empty((x.shape[0], out.shape[1]), out.dtype)
    num_outputs = weight.shape[0]
    for task in prange((num_outputs + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        _task(x, weight, residual, add_residual, products, out, task * ROWS_PER_TASK,
              min(num_outputs, (task + 1) * ROWS_PER_TASK))


forget_stale(_task, (bfloat16, gemv_blocks_cpu, lanes, lanes16))                    # the files each compiles in
forget_stale(_stream, (bfloat16, gemv_blocks_cpu, lanes, lanes16, pairs_bf16))


def streamed_linear(x: torch.Tensor, weight: np.ndarray, residual: torch.Tensor | None = None) -> torch.Tensor:
    """x (T, K) times weight (N, K) transposed (float32, or bfloat16 as bits), plus residual (T, N) if given:
    (T, N), in x's dtype."""
    out = x.new_empty(x.shape[0], weight.shape[0])
    add = residual is not None
    _stream(host_view(x.contiguous()), weight, host_view(residual.contiguous()) if add else host_view(out), add,
            host_view(out))
    return out
