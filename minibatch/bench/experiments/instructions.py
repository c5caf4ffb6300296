"""How fast does one core multiply bfloat16, by each instruction it has? Float32 multiply-adds, AVX512-BF16's pairs,
AMX's tiles, each on numbers already in the cache.

Feeds docs/performance.md, section "bfloat16". A decode step of a few dozen rows stops being bound by the
memory when the arithmetic of its products runs slower than the weights arrive, and which instruction does
that arithmetic decides where. Three loops, each on one thread with its operands in the L1 cache and
enough independent sums that no result waits for the one before, print the multiply-adds each makes per
second (a multiply-add is two floating-point operations):

    float32    `vfmadd` on sixteen float32 lanes (`kernels.lanes16`), what the widening loop runs on
    pairs      `vdpbf16ps` (AVX512-BF16, `kernels.pairs_bf16`): 32 bfloat16 products into sixteen sums
    tiles      `tdpbf16ps` (AMX): a tile of 16 rows of 32 bfloat16s by a tile of 32 by 16, into a 16 x 16 tile
               of float32 sums, 8,192 multiply-adds an instruction; four sums tiles, two of each operand loaded
               for every four products (the shape of a step of 32 rows)

The tiles loop is `kernels.tiles_bf16`'s instructions without its memory: one tile product is checked against
numpy's first. A CPU without a loop's instructions prints why it skipped it.

    python -m minibatch.bench.experiments.instructions [--seconds 0.5]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from numba import njit

from minibatch.engine.kernels.lanes import lane
from minibatch.engine.kernels.lanes16 import fma16, fold16, load16, zero16
from minibatch.engine.kernels.pairs_bf16 import PAIRS, pairs
from minibatch.engine.kernels.tiles_bf16 import (TILE_BYTES, TILE_ROWS, TILES, configure, load4, load5, load6, load7,
                                                 pack, product0, product1, product2, product3, release, shapes,
                                                 store0, store1, store2, store3, zero0, zero1, zero2,
                                                 zero3)
from minibatch.engine.numba_target import AVX512


@njit(nogil=True)
def _tiles(config, x, weight, sums, steps, repeats):
    """sums (4 tiles) = x (2 tiles of rows) . weight (2 tiles of columns), over `steps` 32-column steps, `repeats`
    times; x: (32, 32 steps) bfloat16 bits as bytes, weight: (32, 32 steps) laid out by `pack`, as bytes."""
    configure(config)
    x_stride = steps * TILE_BYTES
    second = TILE_ROWS * x_stride                                       # bytes of 16 rows, of x or of the weight
    for _ in range(repeats):
        zero0()
        zero1()
        zero2()
        zero3()
        for k in range(steps):
            load4(x, k * TILE_BYTES, x_stride)                          # rows 0-15, columns 32 k .. 32 k + 31
            load5(x, second + k * TILE_BYTES, x_stride)                 # rows 16-31
            load6(weight, k * TILE_ROWS * TILE_BYTES, TILE_BYTES)         # weight rows 0-15, in pairs
            load7(weight, second + k * TILE_ROWS * TILE_BYTES, TILE_BYTES)  # weight rows 16-31
            product0()
            product1()
            product2()
            product3()
    store0(sums, 0, TILE_BYTES)
    store1(sums, TILE_ROWS * TILE_BYTES, TILE_BYTES)
    store2(sums, 2 * TILE_ROWS * TILE_BYTES, TILE_BYTES)
    store3(sums, 3 * TILE_ROWS * TILE_BYTES, TILE_BYTES)
    release()


@njit(nogil=True)
def _pairs(x, w, repeats):
    """Twelve independent sums of vdpbf16ps over two 32-column steps of four rows of x by three weight rows w."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = s8 = s9 = s10 = s11 = zero16()
    for _ in range(repeats):
        for k in range(0, 64, 32):
            s0, s1, s2 = pairs(s0, x, 0, k, w, 0, k), pairs(s1, x, 0, k, w, 1, k), pairs(s2, x, 0, k, w, 2, k)
            s3, s4, s5 = pairs(s3, x, 1, k, w, 0, k), pairs(s4, x, 1, k, w, 1, k), pairs(s5, x, 1, k, w, 2, k)
            s6, s7, s8 = pairs(s6, x, 2, k, w, 0, k), pairs(s7, x, 2, k, w, 1, k), pairs(s8, x, 2, k, w, 2, k)
            s9, s10, s11 = pairs(s9, x, 3, k, w, 0, k), pairs(s10, x, 3, k, w, 1, k), pairs(s11, x, 3, k, w, 2, k)
    total = (fold16(s0) + fold16(s1) + fold16(s2) + fold16(s3) + fold16(s4) + fold16(s5) + fold16(s6) + fold16(s7)
             + fold16(s8) + fold16(s9) + fold16(s10) + fold16(s11))              # (8,) every sum, so none is dropped
    return lane(total, 0)


@njit(nogil=True)
def _float32(x, repeats):
    """Twelve independent sums of sixteen-lane multiply-adds over rows of x."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = s8 = s9 = s10 = s11 = zero16()
    for _ in range(repeats):
        for c in range(0, 32, 16):
            a, b, d = load16(x, 0, c), load16(x, 1, c), load16(x, 2, c)
            s0, s1, s2, s3 = fma16(a, b, s0), fma16(a, d, s1), fma16(b, d, s2), fma16(a, a, s3)
            s4, s5, s6, s7 = fma16(b, b, s4), fma16(d, d, s5), fma16(b, a, s6), fma16(d, a, s7)
            s8, s9, s10, s11 = fma16(d, b, s8), fma16(a, b, s9), fma16(a, d, s10), fma16(b, d, s11)
    total = (fold16(s0) + fold16(s1) + fold16(s2) + fold16(s3) + fold16(s4) + fold16(s5) + fold16(s6) + fold16(s7)
             + fold16(s8) + fold16(s9) + fold16(s10) + fold16(s11))              # (8,) every sum, so none is dropped
    return lane(total, 0)


def bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """float32 values truncated to bfloat16, as their 16 bits."""
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def widened(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits back to float32."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def tiles_product(x_bits: np.ndarray, weight_bits: np.ndarray, repeats: int = 1) -> np.ndarray:
    """x (32, K) times weight (32, K) transposed, bfloat16 bits in, float32 (32, 32) out, on the tiles."""
    steps = x_bits.shape[1] // 32
    sums = np.zeros((4, TILE_ROWS, TILE_ROWS), np.float32)            # the four sums tiles
    config = np.empty(64, np.uint8)
    shapes(config, TILE_ROWS, TILE_ROWS)                               # every tile 16 rows of 64 bytes
    _tiles(config, np.ascontiguousarray(x_bits).reshape(-1).view(np.uint8),
           pack(weight_bits).reshape(-1).view(np.uint8), sums.reshape(-1).view(np.uint8), steps, repeats)
    return np.block([[sums[0], sums[1]], [sums[2], sums[3]]])         # (32, 32)


def _rate(run, multiply_adds_per_repeat: int, seconds: float) -> float:
    """Multiply-adds per second of run(repeats), repeats grown until one call takes `seconds`, best of three."""
    run(1)                                                             # compiled and warm
    repeats = 1000
    while True:
        start = time.perf_counter()
        run(repeats)
        if time.perf_counter() - start >= seconds / 4:
            break
        repeats *= 4
    best = min(_timed(run, repeats) for _ in range(3))
    return repeats * multiply_adds_per_repeat / best


def _timed(run, repeats: int) -> float:
    start = time.perf_counter()
    run(repeats)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minibatch.bench.experiments.instructions",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="about how long a timed call takes (default 0.5)")
    args = parser.parse_args(argv)
    if not args.seconds > 0:
        parser.error(f"--seconds {args.seconds}: must be more than 0")
    rng = np.random.default_rng(0)
    print("one core, operands in the L1 cache: multiply-adds per second (two operations each)")
    if not AVX512:
        print("float32, pairs, tiles: skipped, the compiled code has no 512-bit registers")
        return 0
    x32 = rng.standard_normal((4, 64)).astype(np.float32)
    rates = {"float32 (vfmadd, 16 lanes)": _rate(lambda n: _float32(x32, n), 12 * 2 * 16, args.seconds)}
    if PAIRS:
        x, weight = bfloat16_bits(rng.standard_normal((4, 64))), bfloat16_bits(rng.standard_normal((3, 64)))
        rates["pairs (vdpbf16ps, AVX512-BF16)"] = _rate(lambda n: _pairs(x, weight, n), 12 * 2 * 32, args.seconds)
    else:
        print("pairs: skipped, the compiled code has no AVX512-BF16")
    if TILES:
        steps = 18                                                     # K = 576, SmolLM2's width
        x, weight = bfloat16_bits(rng.standard_normal((32, 32 * steps))), bfloat16_bits(
            rng.standard_normal((32, 32 * steps)))
        reference = widened(x) @ widened(weight).T                     # (32, 32) float32
        error = np.abs(tiles_product(x, weight) - reference).max()
        if not error <= 1e-4 * np.abs(reference).max():               # a wrong product's rate means nothing
            raise SystemExit(f"tiles: the product differs from numpy's by {error:.1e}; not timed")
        print(f"tiles: one product of 32 x {32 * steps} by {32 * steps} x 32 against numpy's, largest difference "
              f"{error:.1e} (the order of the additions)")
        rates["tiles (tdpbf16ps, AMX)"] = _rate(lambda n: tiles_product(x, weight, n), steps * 4 * 16 * 16 * 32,
                                                args.seconds)
    else:
        print("tiles: skipped, no AMX bfloat16 tiles on this CPU (or Linux refused them to this process)")
    for name, rate in rates.items():
        print(f"{name:32s} {rate / 1e9:7.1f} G multiply-adds/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
