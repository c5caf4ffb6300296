"""Weight-only quantisation: the block formats q8_0 and q4_1, and `QuantizedWeight`, a matrix in blocks.

`EngineConfig(quantization=...)` stores every weight matrix a decode step reads in blocks of 32
weights along a row (the formats of GGUF / llama.cpp; `minibatch.engine.kernels.quantized_torch`
spells them out), and multiplies without expanding the matrix to fp32:

    format   bytes per 32 weights            bytes per weight   where the blocks come from
    None     128 (fp32)                      4
    q8_0     2 (fp16 d) + 32 (int8 q)        1.0625             quantised here from the loaded weights
    q4_1     2 (d) + 2 (fp16 m) + 16 (4-bit) 0.625              the shipped GGUF file's own blocks

q8_0 rounds each weight to one of 255 steps of d = max|w| / 127 over its block, so its tokens are
those of a model with slightly different weights (its reference is transformers running on the
dequantised weights). q4_1 quantises nothing: it reads the blocks the GGUF file holds, which are
exactly the weights transformers dequantised when it converted the file (`models.gguf_blocks`),
so greedy tokens equal the fp32 reference's.

Only weights go through blocks: activations, norms, the embedding lookup, attention and the KV
cache stay fp32. The fast path multiplies by the blocks with the Numba kernels; the reference path
dequantises and multiplies (`ops.products`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minibatch.engine.kernels import quantized_torch
from minibatch.engine.kernels.quantized_torch import BLOCK

BLOCK_BYTES = {"q8_0": 2 + BLOCK, "q4_1": 2 + 2 + BLOCK // 2}  # bytes per block of 32 weights


@dataclass
class QuantizedWeight:
    """A weight matrix (N, K) in blocks of 32 weights along each row."""

    format: str                        # "q8_0" or "q4_1"
    codes: torch.Tensor                # q8_0: (N, K) int8; q4_1: (N, K/2) uint8, two 4-bit codes a byte
    scales: torch.Tensor               # (N, K/32) fp16: d of each block
    mins: torch.Tensor | None = None   # q4_1: (N, K/32) fp16, m of each block; q8_0: None

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape[0], self.scales.shape[1] * BLOCK

    def nbytes(self) -> int:
        """Bytes a product reads: BLOCK_BYTES per block of 32 weights."""
        return self.scales.numel() * BLOCK_BYTES[self.format]

    def dequantize(self) -> torch.Tensor:
        """The weights (N, K) in fp32: d * q (q8_0) or d * q + m (q4_1)."""
        if self.format == "q8_0":
            return quantized_torch.dequantize_q8_0(self.codes, self.scales)
        return quantized_torch.dequantize_q4_1(self.codes, self.scales, self.mins)

    def rows(self, index: torch.Tensor) -> "QuantizedWeight":
        """The same weight with its rows reordered (or picked) by index: blocks lie within rows."""
        return QuantizedWeight(self.format, self.codes[index], self.scales[index],
                               None if self.mins is None else self.mins[index])

    @staticmethod
    def cat(parts: list["QuantizedWeight"]) -> "QuantizedWeight":
        """Weights of one format stacked along rows (fused projections: q|k|v, gate|up)."""
        formats = {p.format for p in parts}
        if len(formats) != 1:
            raise ValueError(f"cannot stack weights of formats {sorted(formats)} into one matrix")
        mins = None if parts[0].mins is None else torch.cat([p.mins for p in parts])
        return QuantizedWeight(parts[0].format, torch.cat([p.codes for p in parts]),
                               torch.cat([p.scales for p in parts]), mins)


def _blocks(weight: torch.Tensor) -> torch.Tensor:
    rows, cols = weight.shape
    if cols % BLOCK:
        raise ValueError(f"a weight of shape {tuple(weight.shape)} cannot be split into blocks of {BLOCK}: "
                         f"its rows must have a multiple of {BLOCK} weights")
    return weight.detach().float().reshape(rows, cols // BLOCK, BLOCK)   # (N, K/32, 32)


def quantize_q8_0(weight: torch.Tensor) -> QuantizedWeight:
    """(N, K) -> q8_0, as ggml does: d = max|w| / 127 per block, q = round(w / d); d is stored in fp16."""
    blocks = _blocks(weight)
    d = blocks.abs().amax(dim=-1) / 127                                  # (N, K/32)
    inverse = torch.where(d > 0, 1 / d, torch.zeros_like(d))              # an all-zero block keeps q = 0
    q = torch.round(blocks * inverse[..., None]).clamp(-127, 127)
    return QuantizedWeight("q8_0", q.to(torch.int8).reshape(weight.shape), d.half())


def quantize_q4_1(weight: torch.Tensor) -> QuantizedWeight:
    """(N, K) -> q4_1, as ggml does: m = min, d = (max - min) / 15, q = round((w - m) / d) in [0, 15].

    The engine never requantises a model (its q4_1 weights are a GGUF file's own blocks); this makes
    blocks for tests and for anyone curious what 4 bits keep of a weight.
    """
    blocks = _blocks(weight)
    low, high = blocks.amin(dim=-1), blocks.amax(dim=-1)                  # (N, K/32) each
    d = (high - low) / 15
    inverse = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    q = torch.round((blocks - low[..., None]) * inverse[..., None]).clamp(0, 15).to(torch.uint8)
    packed = q[..., :BLOCK // 2] | (q[..., BLOCK // 2:] << 4)             # (N, K/32, 16): j low, j + 16 high
    return QuantizedWeight("q4_1", packed.reshape(weight.shape[0], -1), d.half(), low.half())
