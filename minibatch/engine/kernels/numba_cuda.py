"""Paged attention on an NVIDIA GPU, written with `numba.cuda`: `attention_backend="numba-cuda"`.

The same algorithm as the CPU kernel (read K/V in place through the block table, online softmax
in one pass over the context), mapped onto the GPU:

- One thread block per (query token, query head): grid `(T, Hq)`. A decode step has one query
  token per sequence, so this is one block per (sequence, head) there, and a prefill chunk gets
  one block per token and head instead of one block looping over hundreds of rows. Each block
  finds its sequence by a binary search over `query_start_loc`.
- The context is walked in tiles of `THREADS` keys. Thread `tid` scores key `tile + tid`, then
  the block agrees on the tile's largest score and on the sum of its weights through two
  shared-memory tree reductions. The running max `m` and sum `l` are updated as in the CPU
  kernel, with one rescale per tile instead of one per key.
- The output is accumulated per head dimension: thread `tid` owns dimensions `tid`,
  `tid + THREADS`, ... and adds `weight[k] * V[k, d]` over the tile's keys, so neighbouring
  threads read neighbouring values (coalesced loads).

It is a teaching kernel: production kernels (vLLM's paged attention, FlashInfer) also split long
contexts across blocks (flash-decoding), let several threads share one key's dot product and
work in bf16. Tensors are handed over zero-copy with `cuda.as_cuda_array`; under the CUDA
simulator (`NUMBA_ENABLE_CUDASIM=1`, for tests without a GPU) they are CPU numpy views.

Shapes: query (T, Hq, D), caches (N, block_size, Hkv, D), output (T, Hq, D). Its speed is not
measured in docs/performance.md, which covers the CPU kernels; the GPU check tests it for correctness.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from numba import config, cuda

from minibatch.engine.kernels.numba_cpu import check_metadata

# Threads per block = keys per tile, a power of two for the tree reductions. The simulator runs
# every thread as a Python thread, so it gets small blocks (which also makes short contexts span
# several tiles in tests).
THREADS = 16 if config.ENABLE_CUDASIM else 128
MAX_HEAD_DIM = 256    # size of the shared query and output vectors
NEG_INF = np.float32(-np.inf)

if not config.ENABLE_CUDASIM and not cuda.is_available():
    raise RuntimeError(
        "attention_backend='numba-cuda' needs an NVIDIA GPU with a working CUDA driver, and none was "
        "found: use attention_backend='numba' (CPU kernels) or 'torch' instead, or set "
        "NUMBA_ENABLE_CUDASIM=1 before numba is imported to run the kernel in the (slow) simulator"
    )


@cuda.jit
def _write_kv(key, value, k_cache, v_cache, slot_mapping):
    """key, value (T, Hkv, D) into the caches (N, bs, Hkv, D): one thread block per (token, KV head)."""
    t, h = cuda.blockIdx.x, cuda.blockIdx.y                   # one block per (token, KV head)
    block_size = k_cache.shape[1]
    block, offset = slot_mapping[t] // block_size, slot_mapping[t] % block_size
    for d in range(cuda.threadIdx.x, key.shape[2], cuda.blockDim.x):
        k_cache[block, offset, h, d] = key[t, h, d]
        v_cache[block, offset, h, d] = value[t, h, d]


@cuda.jit(device=True)
def _block_reduce(buffer, x, take_max):
    """Max (take_max) or sum of `x` over the block's threads, via a shared-memory tree."""
    tid = cuda.threadIdx.x
    buffer[tid] = x
    cuda.syncthreads()
    stride = THREADS // 2
    while stride > 0:                                          # halve the active threads each round
        if tid < stride:
            other = buffer[tid + stride]
            buffer[tid] = max(buffer[tid], other) if take_max else buffer[tid] + other
        cuda.syncthreads()
        stride //= 2
    result = buffer[0]
    cuda.syncthreads()                                         # everyone has read before it is reused
    return result


@cuda.jit
def _paged_attention(query, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale, out):
    """out (T, Hq, D): one thread block per (query row, head), the context walked a tile of THREADS keys at a
    time with an online softmax."""
    row, head, tid = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
    head_dim, block_size = query.shape[2], k_cache.shape[1]
    kv_head = head // (query.shape[1] // k_cache.shape[2])     # GQA: query head -> KV head
    lo, hi = 0, query_start_loc.shape[0] - 1                   # find seq with start[seq] <= row < start[seq+1]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if query_start_loc[mid] <= row:
            lo = mid
        else:
            hi = mid
    seq = lo
    position = context_lens[seq] - query_start_loc[seq + 1] + row   # = context - query_len + j
    num_keys = position + 1                                    # causal: keys 0..position

    reduce_buffer = cuda.shared.array(THREADS, dtype=np.float32)
    weights = cuda.shared.array(THREADS, dtype=np.float32)    # this tile's exp(score - m)
    q = cuda.shared.array(MAX_HEAD_DIM, dtype=np.float32)     # (D,) the query row, read once
    acc = cuda.shared.array(MAX_HEAD_DIM, dtype=np.float32)   # (D,) running sum of weight * value
    for d in range(tid, head_dim, THREADS):
        q[d] = query[row, head, d]
        acc[d] = 0.0
    cuda.syncthreads()
    m, l = NEG_INF, np.float32(0.0)                            # running max and sum (same in all threads)

    for tile in range(0, num_keys, THREADS):
        pos = tile + tid
        score = NEG_INF
        if pos < num_keys:
            block, offset = block_tables[seq, pos // block_size], pos % block_size
            score = np.float32(0.0)
            for d in range(head_dim):
                score += q[d] * k_cache[block, offset, kv_head, d]
            score *= scale
        new_m = max(m, _block_reduce(reduce_buffer, score, True))
        weight = math.exp(score - new_m) if pos < num_keys else np.float32(0.0)
        weights[tid] = weight
        correction = math.exp(m - new_m)                       # 0 on the first tile (m = -inf)
        l = l * correction + _block_reduce(reduce_buffer, weight, False)  # also syncs `weights`
        m = new_m
        for d in range(tid, head_dim, THREADS):                # this thread's output dimensions
            total = acc[d] * correction
            for k in range(min(THREADS, num_keys - tile)):
                p = tile + k
                total += weights[k] * v_cache[block_tables[seq, p // block_size], p % block_size, kv_head, d]
            acc[d] = total
        cuda.syncthreads()                                     # `weights` is rewritten by the next tile

    for d in range(tid, head_dim, THREADS):
        out[row, head, d] = acc[d] / l


def _device_view(tensor: torch.Tensor, name: str):
    """Zero-copy view for a kernel: a device array on a GPU, a numpy view in the simulator."""
    if tensor.is_floating_point() and tensor.dtype != torch.float32:
        raise ValueError(
            f"attention_backend='numba-cuda' supports float32 only, but {name} is {tensor.dtype}: "
            "use dtype='float32' or attention_backend='torch'"
        )
    tensor = tensor.detach()
    if config.ENABLE_CUDASIM:
        return tensor.cpu().numpy()
    return cuda.as_cuda_array(tensor, sync=False)              # we launch on torch's stream instead


def _launch_stream():
    """Torch's current stream, so the kernels queue behind torch's work without a host sync."""
    if config.ENABLE_CUDASIM:
        return 0
    return cuda.external_stream(torch.cuda.current_stream().cuda_stream)


def write_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    """Store key, value (T, Hkv, D) into the flat slots `slot_mapping` (T,) of the (N, bs, Hkv, D) caches."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    slots = slot_mapping.to(key.device)
    _write_kv[(num_tokens, num_kv_heads), min(head_dim, THREADS), _launch_stream()](
        _device_view(key.contiguous(), "key"), _device_view(value.contiguous(), "value"),
        _device_view(k_cache, "k_cache"), _device_view(v_cache, "v_cache"), _device_view(slots, "slot_mapping"))


def attention(query, k_cache, v_cache, meta, scale):
    """Causal attention of packed queries (T, Hq, D) over each sequence's paged K/V; returns (T, Hq, D)."""
    num_tokens, num_heads, head_dim = query.shape
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim={head_dim} is not supported by attention_backend='numba-cuda' "
                         f"(at most {MAX_HEAD_DIM}): use attention_backend='torch'")
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)  # (T, Hq, D)
    if num_tokens == 0:
        return out
    if "numba_cuda" not in meta.cache:                         # once per step, reused by every layer
        check_metadata(meta, k_cache)
        meta.cache["numba_cuda"] = [_device_view(getattr(meta, name).to(query.device), name)
                                    for name in ("block_tables", "query_start_loc", "context_lens")]
    tables, starts, contexts = meta.cache["numba_cuda"]
    _paged_attention[(num_tokens, num_heads), THREADS, _launch_stream()](
        _device_view(query.contiguous(), "query"), _device_view(k_cache, "k_cache"),
        _device_view(v_cache, "v_cache"), tables, starts, contexts, np.float32(scale), _device_view(out, "out"))
    return out
