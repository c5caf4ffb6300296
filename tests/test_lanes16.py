"""Sixteen-lane vectors (`engine.kernels.lanes16`) against numpy, the block loop of the streamed product in both
lane widths, and what `engine.numba_target` asks Numba to compile for."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from numba import njit

from minibatch.engine.kernels.bfloat16 import host_view
from minibatch.engine.kernels.lanes import LANES, lane
from minibatch.engine.kernels.codes16 import bytes16, halves16, nibbles16, signed16, splat16, store16
from minibatch.engine.kernels.lanes16 import LANES16, WIDE, fma16, fold16, load16, zero16


@njit
def _folded(a, b, c, i, j):
    """fold16(a[i, j:j+16] * b[i, j:j+16] + c[i, j:j+16]) and fold16(zero16()), as arrays."""
    v = fold16(fma16(load16(a, i, j), load16(b, i, j), load16(c, i, j)))
    z = fold16(zero16())
    return (np.array([lane(v, k) for k in range(LANES)], dtype=np.float32),
            np.array([lane(z, k) for k in range(LANES)], dtype=np.float32))


@pytest.mark.parametrize("offset", [0, 3, 16])
def test_load_fma_and_fold_of_sixteen_lanes_match_numpy(offset):
    rng = np.random.default_rng(offset)
    a, b, c = (rng.standard_normal((3, 40)).astype(np.float32) for _ in range(3))
    folded, zeros = _folded(a, b, c, 2, offset)
    products = a[2, offset:offset + LANES16] * b[2, offset:offset + LANES16] + c[2, offset:offset + LANES16]
    np.testing.assert_allclose(folded, products[:LANES] + products[LANES:], rtol=1e-6, atol=1e-6)
    assert not zeros.any()


def test_sixteen_bfloat16_lanes_are_widened_exactly():
    values = torch.randn(2, 32).bfloat16()
    bits, ones = host_view(values), np.ones((2, 32), np.float32)
    folded, _ = _folded(bits, ones, np.zeros((2, 32), np.float32), 1, 16)
    wide = values[1, 16:32].float().numpy()
    np.testing.assert_array_equal(folded, wide[:LANES] + wide[LANES:])


_OTHER_WIDTH = """
import json, sys
import torch, torch.nn.functional as F
import minibatch.engine.kernels.lanes16 as lanes16
lanes16.WIDE = not lanes16.WIDE                   # before gemv_blocks_cpu picks its block loop's width
from minibatch.engine.kernels import gemv_blocks_cpu, gemv_cpu
errors = []
for rows, k in ((3, 77), (6, 77), (7, 77), (8, 77), (9, 77), (13, 77), (30, 77), (8, 1600), (12, 1600), (7, 1600),
                (14, 1600)):
    g = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, k, generator=g), torch.randn(45, k, generator=g)
    errors.append(float((gemv_cpu.streamed_linear(x, w.numpy()) - F.linear(x, w)).abs().max()))
print(json.dumps({"lanes": gemv_blocks_cpu.BLOCK_LANES, "errors": errors}))
"""


def test_the_block_loop_in_the_other_lane_width_matches_f_linear(tmp_path):
    """This machine runs one lane width of the block loop (sixteen with AVX-512, else eight); the other is compiled
    in a process of its own (its own Numba cache) and must give the same products."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", _OTHER_WIDTH], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["lanes"] == (LANES if WIDE else LANES16)
    assert max(result["errors"]) < 1e-4


_TARGET = """
import json
import minibatch.engine
from numba.core import config
from minibatch.engine.numba_target import WIDE_VECTORS
from minibatch.engine.kernels.lanes16 import WIDE
print(json.dumps({"features": config.CPU_FEATURES, "wide": WIDE_VECTORS, "sixteen_lanes": WIDE}))
"""


def _target(env) -> dict:
    done = subprocess.run([sys.executable, "-c", _TARGET], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_numba_compiles_without_the_narrow_vector_preference_on_avx512_only():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CPU_FEATURES"}
    seen = _target(env)
    assert seen["wide"] == seen["sixteen_lanes"] == WIDE
    if WIDE:
        assert seen["features"].endswith(",-prefer-256-bit") and "+avx512f" in seen["features"]
    else:
        assert seen["features"] is None


def test_a_numba_cpu_features_set_by_the_user_is_left_alone():
    seen = _target(dict(os.environ, NUMBA_CPU_FEATURES="+avx2,+fma"))
    assert seen == {"features": "+avx2,+fma", "wide": False, "sixteen_lanes": False}


@njit
def _codes(unsigned, signed, halves, i, j):
    """bytes16, nibbles16, signed16 and halves16 of row i from column j, then splat16(2.5) times the first, as rows."""
    out = np.zeros((5, LANES16), np.float32)
    store16(out, 0, 0, bytes16(unsigned, i, j))
    store16(out, 1, 0, nibbles16(unsigned, i, j))
    store16(out, 2, 0, signed16(signed, i, j))
    store16(out, 3, 0, halves16(halves, i, j))
    store16(out, 4, 0, fma16(splat16(2.5), bytes16(unsigned, i, j), zero16()))
    return out


def test_codes_and_fp16_bits_become_sixteen_exact_float_lanes():
    unsigned = np.arange(512, dtype=np.int64).reshape(2, 256).astype(np.uint8)          # every byte value
    signed = unsigned.view(np.int8)
    halves = np.random.default_rng(0).integers(0, 0x7C00, (2, 256)).astype(np.uint16)  # finite, subnormals too
    halves[1, 16:20] = [1, 0x3FF, 0x8001, 0x8000]                                       # 2^-24, 1023 2^-24, -2^-24, -0
    for j in range(0, 256 - LANES16 + 1, 16):
        out = _codes(unsigned, signed, halves, 1, j)
        np.testing.assert_array_equal(out[0], unsigned[1, j:j + 16].astype(np.float32))
        np.testing.assert_array_equal(out[1], (unsigned[1, j:j + 16] & 15).astype(np.float32))
        np.testing.assert_array_equal(out[2], signed[1, j:j + 16].astype(np.float32))
        np.testing.assert_array_equal(out[3], halves[1, j:j + 16].view(np.float16).astype(np.float32))
        np.testing.assert_array_equal(out[4], 2.5 * unsigned[1, j:j + 16].astype(np.float32))
