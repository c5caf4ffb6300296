"""Paged attention backends and the metadata that tells them where each sequence's K/V live.

Every backend exposes the same two functions over the paged KV cache, whose tensors are laid
out by block, `(num_blocks, block_size, num_kv_heads, head_dim)`:

- `write_kv(key, value, k_cache, v_cache, slot_mapping)` stores this step's new keys and values,
  token t going to flat slot `slot_mapping[t]` (= block id * block_size + offset in the block);
- `attention(query, k_cache, v_cache, meta, scale)` lets every query token attend, causally, to
  the cached tokens of its own sequence, found through that sequence's block table.

One rule covers prefill, chunked prefill and decode: query row j of sequence i sits at position
`context_lens[i] - query_lens[i] + j` and sees cache positions 0..that position.

Every Numba kernel of the CPU paths (here and in `fused_cpu`, `gemv_cpu`, `quantized_numba`, `quantized_groups_numba`)
is compiled with `nogil=True`: while it runs, other Python threads run too, as they do during torch's
operators. A server's event loop streams tokens while the engine thread computes (measurements:
docs/performance.md, section "Threads"; each kernel's own measurements: the section its module names).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import numpy as np
import torch

from minibatch.config import ATTENTION_BACKENDS, ConfigError

_MODULES = {"torch": "torch_ref", "numba": "numba_cpu", "numba-cuda": "numba_cuda"}


@dataclass
class AttentionMetadata:
    """Where the B sequences of a packed batch are, in the query rows and in the cache."""

    query_start_loc: torch.Tensor   # (B+1,) int64: sequence i owns query rows [start[i], start[i+1])
    context_lens: torch.Tensor      # (B,) int64: tokens of sequence i in the cache after this step's write
    block_tables: torch.Tensor      # (B, max_blocks) int64: physical block ids, padded with 0
    query_start_loc_np: np.ndarray  # the same three, as numpy arrays on the host (for CPU kernels)
    context_lens_np: np.ndarray
    block_tables_np: np.ndarray
    cache: dict = field(default_factory=dict)  # per-step values a backend derives once and reuses in every layer

    @property
    def num_seqs(self) -> int:
        return len(self.context_lens_np)

    @property
    def query_lens_np(self) -> np.ndarray:
        return np.diff(self.query_start_loc_np)

    @classmethod
    def build(cls, query_lens, context_lens, block_tables, device) -> "AttentionMetadata":
        """From per-sequence lists on the host: query lengths, context lengths, block id lists."""
        query_start = np.zeros(len(query_lens) + 1, dtype=np.int64)
        np.cumsum(query_lens, out=query_start[1:])
        width = max((len(t) for t in block_tables), default=0) or 1
        tables = np.zeros((len(block_tables), width), dtype=np.int64)  # (B, max_blocks)
        for row, table in enumerate(block_tables):
            tables[row, : len(table)] = table
        contexts = np.asarray(context_lens, dtype=np.int64)
        return cls(
            query_start_loc=torch.from_numpy(query_start).to(device),
            context_lens=torch.from_numpy(contexts).to(device),
            block_tables=torch.from_numpy(tables).to(device),
            query_start_loc_np=query_start,
            context_lens_np=contexts,
            block_tables_np=tables,
        )


def get_backend(name: str):
    """The backend module for an `EngineConfig.attention_backend` name."""
    if name not in _MODULES:
        raise ConfigError(
            f"EngineConfig.attention_backend={name!r} is not allowed: choose one of "
            + ", ".join(repr(n) for n in ATTENTION_BACKENDS)
        )
    return importlib.import_module(f"minibatch.engine.kernels.{_MODULES[name]}")
