"""CUDA graphs for decode steps: launch a whole step's kernels with one call.

A decode step of a small model launches hundreds of small kernels (about a dozen per layer), and
on a GPU the CPU time spent launching them can exceed the GPU time spent running them. A CUDA
graph records the launches once and replays them with a single call. A graph replays fixed
shapes at fixed addresses, so the runner keeps static input buffers and captures one graph per
batch-size bucket (1, 2, 4, 8, ... up to max_batch_size). A step of B sequences is padded to the
next bucket by repeating its first sequence: the copies compute the same key and value and write
them to the same slot, so the cache is unchanged; the first B rows of the logits are read.

Only steps in which every sequence computes one token and samples (decode) replay a graph;
prefill steps and steps with draft tokens run as usual. Inside the graph, attention is
`decode_attention` below, a fixed-shape torch computation over all max_model_len positions a
sequence may hold (masked past its context), whatever attention backend is configured: keep
max_model_len modest with graphs. On the CPU there are no kernel launches to record, so the flag
is a no-op with a warning.
"""
from __future__ import annotations

import copy
import warnings
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F

from minibatch.engine.kernels import torch_ref
from minibatch.engine.kv import blocks_for
from minibatch.engine.ops import ReferenceOps


def decode_attention(query, k_cache, v_cache, meta, scale):
    """Attention of one query per sequence, query (B, Hq, D), over its cached K/V, from device tensors
    only: meta.block_tables (B, max_blocks) and meta.context_lens (B,). Returns (B, Hq, D)."""
    B, Hq, D = query.shape
    block_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    pos = torch.arange(meta.block_tables.shape[1] * block_size, device=query.device)   # (L,)
    slots = meta.block_tables[:, pos // block_size] * block_size + pos % block_size    # (B, L)
    k = k_cache.view(-1, Hkv, D)[slots].transpose(1, 2)                                # (B, Hkv, L, D)
    v = v_cache.view(-1, Hkv, D)[slots].transpose(1, 2)                                # (B, Hkv, L, D)
    q = query.view(B, Hkv, Hq // Hkv, D)                                               # (B, Hkv, group, D)
    mask = (pos[None, :] < meta.context_lens[:, None])[:, None, None, :]               # (B, 1, 1, L)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)         # (B, Hkv, group, D)
    return out.reshape(B, Hq, D)


DECODE_BACKEND = SimpleNamespace(write_kv=torch_ref.write_kv, attention=decode_attention)


class CudaGraphRunner:
    """A ModelRunner whose decode steps replay CUDA graphs captured per batch-size bucket.

    use_graphs=False runs the same padded, fixed-shape step eagerly (to check it without a GPU).
    """

    def __init__(self, runner, max_batch_size: int, max_model_len: int, use_graphs: bool = True):
        self.runner, self.blocks = runner, runner.blocks
        self.model = copy.copy(runner.model)           # the same weights, attending with DECODE_BACKEND
        self.model.ops = ReferenceOps(DECODE_BACKEND)
        self.buckets = sorted({min(2 ** i, max_batch_size) for i in range(max_batch_size.bit_length() + 1)})
        B, device = self.buckets[-1], runner.device
        width = blocks_for(max_model_len, self.blocks.block_size)
        self.input_ids = torch.zeros(B, dtype=torch.int64, device=device)       # (B,) static inputs
        self.positions = torch.zeros_like(self.input_ids)                        # (B,)
        self.slot_mapping = torch.zeros_like(self.input_ids)                     # (B,)
        self.block_tables = torch.zeros(B, width, dtype=torch.int64, device=device)  # (B, max_blocks)
        self.context_lens = torch.ones_like(self.input_ids)                      # (B,)
        self.rows = torch.arange(B, device=device)                               # (B,) every row samples
        self.graphs, self.logits = {}, {}                                        # bucket -> graph, its output
        if use_graphs:
            self._capture()

    def _forward(self, b: int) -> torch.Tensor:
        meta = SimpleNamespace(block_tables=self.block_tables[:b], context_lens=self.context_lens[:b])
        return self.model.forward(self.input_ids[:b], self.positions[:b], self.slot_mapping[:b], meta,
                                  self.runner.kv_cache, self.rows[:b])  # (b, V)

    @torch.inference_mode()
    def _capture(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        for b in reversed(self.buckets):           # largest first: the smaller graphs reuse its memory
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):          # one eager run first, so lazy initialisation stays out
                self._forward(b)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[b] = self._forward(b)
            self.graphs[b] = graph
        torch.cuda.synchronize()

    def _fill(self, seqs, b: int) -> None:
        """Copy the step's inputs into the static buffers; rows len(seqs)..b-1 repeat row 0."""
        ids, pos, slots = (np.empty(b, dtype=np.int64) for _ in range(3))
        tables = np.zeros((b, self.block_tables.shape[1]), dtype=np.int64)
        for i, seq in enumerate(seqs):
            r, p = seq.request, seq.start
            prompt_len = len(r.prompt_token_ids)
            ids[i] = r.prompt_token_ids[p] if p < prompt_len else r.output_token_ids[p - prompt_len]
            table = self.blocks.block_tables[r.request_id]
            pos[i], slots[i] = p, self.blocks.slot(r.request_id, p)
            tables[i, :len(table)] = table
        n = len(seqs)
        for a in (ids, pos, slots, tables):
            a[n:] = a[0]
        for buffer, a in ((self.input_ids, ids), (self.positions, pos), (self.slot_mapping, slots),
                          (self.context_lens, pos + 1), (self.block_tables, tables)):
            buffer[:b].copy_(torch.from_numpy(a))

    @torch.inference_mode()
    def execute(self, plan) -> torch.Tensor:
        """Logits (S, V) of the sampling sequences, as ModelRunner.execute returns them."""
        seqs = plan.seqs
        if len(seqs) > self.buckets[-1] or any(s.num_new_tokens != 1 or s.draft_token_ids or not s.samples
                                               for s in seqs):
            return self.runner.execute(plan)
        b = next(size for size in self.buckets if size >= len(seqs))
        self._fill(seqs, b)
        if not self.graphs:
            return self._forward(b)[:len(seqs)]
        self.graphs[b].replay()
        return self.logits[b][:len(seqs)]


def with_cuda_graphs(runner, max_batch_size: int, max_model_len: int):
    """The runner wrapped in a CudaGraphRunner on CUDA; on the CPU, the runner itself and a warning."""
    if runner.device.type != "cuda":
        warnings.warn("EngineConfig.cuda_graphs=True has no effect on the CPU: CUDA graphs replay recorded GPU "
                      "kernel launches, and the CPU has none; decode steps run as usual", stacklevel=3)
        return runner
    return CudaGraphRunner(runner, max_batch_size, max_model_len)
