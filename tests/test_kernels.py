"""Paged attention backends agree with each other and with a naive per-token loop.

Each batch packs prefill (nothing cached yet), chunked-prefill (a new chunk after cached ones) and
decode (one new token) sequences, with block tables in shuffled physical order and spare blocks
full of noise that no query may read. The `numba-cuda` kernels run here under the CUDA simulator,
in a child process: the simulator must be switched on before `numba.cuda` is first imported.
"""
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch.engine.kernels import AttentionMetadata, get_backend

# fp32 throughout; the backends differ only in summation order (and the naive loop runs in fp64).
ATOL, RTOL = 1e-5, 1e-4
CUDASIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ["torch", "numba"] + (["numba-cuda"] if torch.cuda.is_available() and not CUDASIM else [])


def make_batch(seqs, block_size, num_kv_heads, group, head_dim, seed=0):
    """seqs: (cached, new) token counts per sequence. Random caches, queries and shuffled block tables."""
    gen = torch.Generator().manual_seed(seed)
    needed = [math.ceil((cached + new) / block_size) for cached, new in seqs]
    num_blocks = sum(needed) + 2                                     # 2 spare blocks of noise
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    tables = [ids[sum(needed[:i]): sum(needed[: i + 1])] for i in range(len(seqs))]
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    num_tokens = sum(new for _, new in seqs)
    return {
        "query": 2 * torch.randn(num_tokens, num_kv_heads * group, head_dim, generator=gen),  # (T, Hq, D)
        "k_cache": torch.randn(shape, generator=gen),                # (N, bs, Hkv, D)
        "v_cache": torch.randn(shape, generator=gen),
        "query_lens": [new for _, new in seqs],
        "context_lens": [cached + new for cached, new in seqs],
        "tables": tables,
    }


def metadata(batch, device="cpu"):
    return AttentionMetadata.build(batch["query_lens"], batch["context_lens"], batch["tables"], device)


def naive_attention(batch, scale):
    """Token by token in numpy float64: find each visible key by the slot rule, then softmax."""
    query, k_cache, v_cache = (batch[k].double().numpy() for k in ("query", "k_cache", "v_cache"))
    block_size, num_kv_heads, head_dim = k_cache.shape[1:]
    group = query.shape[1] // num_kv_heads
    k_flat, v_flat = k_cache.reshape(-1, num_kv_heads, head_dim), v_cache.reshape(-1, num_kv_heads, head_dim)
    out, row = np.zeros_like(query), 0
    for table, query_len, context_len in zip(batch["tables"], batch["query_lens"], batch["context_lens"]):
        for j in range(query_len):
            position = context_len - query_len + j
            slots = [table[p // block_size] * block_size + p % block_size for p in range(position + 1)]
            k = np.repeat(k_flat[slots], group, axis=1)                # (L, Hq, D): head h reads KV head h // group
            v = np.repeat(v_flat[slots], group, axis=1)
            scores = np.einsum("hd,lhd->hl", query[row], k) * scale     # (Hq, L)
            weights = np.exp(scores - scores.max(axis=1, keepdims=True))
            out[row] = np.einsum("hl,lhd->hd", weights / weights.sum(axis=1, keepdims=True), v)
            row += 1
    return torch.from_numpy(out).float()


def run_attention(name, batch, device="cpu"):
    on = {k: batch[k].to(device) for k in ("query", "k_cache", "v_cache")}
    scale = batch["query"].shape[-1] ** -0.5
    out = get_backend(name).attention(on["query"], on["k_cache"], on["v_cache"], metadata(batch, device), scale)
    return out.cpu()


def check_backend(name, batch, device="cpu"):
    expected = naive_attention(batch, batch["query"].shape[-1] ** -0.5)
    torch.testing.assert_close(run_attention(name, batch, device), expected, atol=ATOL, rtol=RTOL)


def check_write_kv(name, seqs, block_size, num_kv_heads, head_dim, device="cpu"):
    """Write this step's new K/V through the backend; compare with a per-token assignment."""
    batch = make_batch(seqs, block_size, num_kv_heads, 1, head_dim, seed=1)
    slots = torch.tensor([table[p // block_size] * block_size + p % block_size
                          for table, (cached, new) in zip(batch["tables"], seqs)
                          for p in range(cached, cached + new)], dtype=torch.int64)  # (T,)
    key, value = torch.randn(2, len(slots), num_kv_heads, head_dim)  # (T, Hkv, D) each
    expected_k, expected_v = batch["k_cache"].clone(), batch["v_cache"].clone()
    for t, slot in enumerate(slots.tolist()):
        expected_k[slot // block_size, slot % block_size] = key[t]
        expected_v[slot // block_size, slot % block_size] = value[t]
    k_cache, v_cache = batch["k_cache"].to(device), batch["v_cache"].to(device)
    get_backend(name).write_kv(key.to(device), value.to(device), k_cache, v_cache, slots.to(device))
    assert torch.equal(k_cache.cpu(), expected_k) and torch.equal(v_cache.cpu(), expected_v)


def device_of(name):
    return "cuda" if name == "numba-cuda" else "cpu"


# prefill, chunked prefill, two decodes; contexts 7, 21, 30, 45 end mid-block for block sizes 8, 16, 32
MIXED = [(0, 7), (13, 8), (29, 1), (44, 1)]


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("block_size", [1, 8, 12, 16, 32])
@pytest.mark.parametrize("head_dim", [32, 36, 64, 128])
@pytest.mark.parametrize("group", [1, 3, 4])
def test_mixed_batch_matches_naive_loop(name, block_size, head_dim, group):
    check_backend(name, make_batch(MIXED, block_size, 2, group, head_dim), device_of(name))


@pytest.mark.parametrize("name", BACKENDS)
@settings(max_examples=25, deadline=None)
@given(
    seqs=st.lists(st.tuples(st.integers(0, 70), st.integers(1, 12)), min_size=1, max_size=5),
    block_size=st.sampled_from([1, 8, 12, 16, 32]),
    num_kv_heads=st.integers(1, 3),
    group=st.sampled_from([1, 3, 4]),
    head_dim=st.sampled_from([20, 32, 64, 128]),
    seed=st.integers(0, 2**16),
)
def test_random_batches_match_naive_loop(name, seqs, block_size, num_kv_heads, group, head_dim, seed):
    check_backend(name, make_batch(seqs, block_size, num_kv_heads, group, head_dim, seed), device_of(name))


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("seqs", [[(0, 1)], [(37, 1)]], ids=["first-token", "single-decode"])
def test_single_token(name, seqs):
    check_backend(name, make_batch(seqs, 16, 3, 3, 64), device_of(name))


@pytest.mark.parametrize("name", BACKENDS)
def test_empty_batch(name):
    batch = make_batch([], 16, 3, 3, 64)
    assert run_attention(name, batch, device_of(name)).shape == (0, 9, 64)
    check_write_kv(name, [], 16, 3, 64, device_of(name))


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("block_size", [1, 8, 16])
def test_write_kv_fills_the_slots(name, block_size):
    check_write_kv(name, MIXED, block_size, 3, 32, device_of(name))


def test_numba_refuses_bad_input():
    numba = get_backend("numba")
    batch = make_batch([(5, 3)], 8, 1, 1, 32)
    key = torch.zeros(1, 1, 32)
    with pytest.raises(ValueError, match="slot_mapping"):
        numba.write_kv(key, key, batch["k_cache"], batch["v_cache"], torch.tensor([10**6]))
    batch["context_lens"] = [100]                                    # more tokens than its 1 block holds
    with pytest.raises(ValueError, match="context_lens"):
        run_attention("numba", batch)
    batch["context_lens"], batch["query"] = [8], batch["query"].half()
    with pytest.raises(ValueError, match="float32 and bfloat16"):
        run_attention("numba", batch)


@pytest.mark.parametrize("block_size", [1, 8, 16])
@pytest.mark.parametrize("group", [1, 3])
def test_numba_in_bfloat16_reads_the_cache_bits_and_rounds_only_its_output(block_size, group):
    """bfloat16 queries and caches, read as bits and widened: the scores, softmax and sums are float32, so the
    output is the float32 attention of the same bfloat16 values, rounded once (within one bfloat16 step)."""
    batch = make_batch(MIXED, block_size, 2, group, 64, seed=3)
    rounded = {**batch, **{k: batch[k].bfloat16() for k in ("query", "k_cache", "v_cache")}}
    out = run_attention("numba", rounded)
    assert out.dtype == torch.bfloat16
    expected = naive_attention({**rounded, **{k: rounded[k].float() for k in ("query", "k_cache", "v_cache")}},
                               64 ** -0.5)
    torch.testing.assert_close(out.float(), expected, atol=1e-5, rtol=2 ** -8)


def _gpu_visible_to_numba():
    from numba import cuda
    return cuda.is_available()


@pytest.mark.skipif(CUDASIM or _gpu_visible_to_numba(), reason="needs a machine without a GPU")
def test_numba_cuda_without_gpu_says_what_to_use():
    with pytest.raises(RuntimeError, match="use attention_backend='numba' .* or 'torch'"):
        get_backend("numba-cuda")


# Small on purpose: the simulator runs every GPU thread as a Python thread.
SIMULATED = [  # (seqs, block_size, num_kv_heads, group, head_dim)
    ([(0, 3), (9, 2), (20, 1)], 8, 1, 3, 32),                       # prefill + chunk + decode; 21 keys = 2 tiles
    ([(17, 1), (0, 2)], 1, 1, 4, 64),                                # block size 1, GQA 4
    ([(30, 1)], 16, 2, 1, 128),                                      # context ends mid-block
]


@pytest.mark.skipif(not CUDASIM, reason="runs in a child process started by test_numba_cuda_in_simulator")
@pytest.mark.parametrize("case", SIMULATED)
def test_numba_cuda_simulated(case):
    seqs, block_size, num_kv_heads, group, head_dim = case
    check_backend("numba-cuda", make_batch(seqs, block_size, num_kv_heads, group, head_dim))
    check_write_kv("numba-cuda", seqs, block_size, num_kv_heads, head_dim)
    assert run_attention("numba-cuda", make_batch([], 16, 1, 1, 32)).shape == (0, 1, 32)


@pytest.mark.slow
@pytest.mark.skipif(CUDASIM, reason="the simulated cases run in this process already")
def test_numba_cuda_in_simulator():
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # no plugins: faster start
    test_id = f"{__file__}::test_numba_cuda_simulated"
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", test_id], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"{len(SIMULATED)} passed" in result.stdout
