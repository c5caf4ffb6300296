"""The operations a forward pass is made of, and the two paths that implement them.

`LlamaModel` (engine/models/llama.py) reads the same whichever path runs; it calls:

    ops.product(weight, alone)   at load: the weight's `Product` (ops/products.py: one table, by rows;
                                 alone: multiplied outside the layers, as the LM head is)
    ops.rms_norm(x, w, eps)      x (T, C) to unit root-mean-square, times w (C,)
    ops.rotary_write_kv(...)     rotate q and k of the fused q|k|v rows, store k and v in the paged cache
    ops.attention(q, ...)        paged attention of each query over its sequence's cached K/V
    ops.silu_mul(gate_up)        SwiGLU's silu(gate) * up
    ops.decoder_layers(...)      the layers of one step, one after another

Two implementations, chosen by `EngineConfig.kernels` (engine/resolve.py resolves "auto"):

- `reference` (ops/reference.py): plain torch, short, any device and dtype. Read it first.
- `fast` (ops/fast.py): the compiled CPU kernels (engine/kernels/), float32 or bfloat16 on a CPU. The same
  operations, each a compiled loop, and a decode step's layers each one compiled call.

Both give the same tokens (tests/test_paths.py checks them against each other and against transformers).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minibatch.engine.kernels import AttentionMetadata
from minibatch.engine.ops.fast import FastOps
from minibatch.engine.ops.reference import ReferenceOps

PATHS = {"reference": ReferenceOps, "fast": FastOps}


@dataclass
class StepInputs:
    """What every layer of one step reads besides its weights: where the T packed tokens sit."""

    positions: torch.Tensor        # (T,) int64: each token's position in its sequence
    cos: torch.Tensor              # (P, D): rotary cosines of every position the model serves
    signed_sin: torch.Tensor       # (P, D): rotary sines, first half negated (rotate_half's sign)
    slot_mapping: torch.Tensor     # (T,) int64: the KV cache slot each token's K/V is written to
    meta: AttentionMetadata        # where each sequence's queries and cached K/V are


def make_ops(kernels: str, attention_backend) -> ReferenceOps:
    """The operations of path `kernels` ("reference" or "fast", resolved), attending with `attention_backend`."""
    return PATHS[kernels](attention_backend)


__all__ = ["FastOps", "PATHS", "ReferenceOps", "StepInputs", "make_ops"]
