"""The readable reference for products with block-quantised weights, in plain torch.

A weight matrix (N, K) is stored in blocks of 32 consecutive weights along K (one row's inputs).
Each block keeps an fp16 scale `d` and small integer codes `q`; q4_1 also keeps an fp16 minimum `m`:

    q8_0   w = d * q          q: int8 in [-127, 127], one byte per weight (34 bytes per block)
    q4_1   w = d * q + m      q: 4 bits in [0, 15], two per byte (20 bytes per block)

In a q4_1 byte of block b, the low nibble holds weight j of the block and the high nibble weight
j + 16 (j = 0..15): GGUF's (ggml's) layout, so the shipped file's bytes are used as they are.

The reference expands the whole matrix to fp32, then multiplies: easy to check, but it writes and
reads the fp32 matrix (4 bytes a weight) every time. The Numba kernels (`quantized_numba`) compute
the same product reading only the blocks (measurements: docs/performance.md, section "Quantised
products").
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

BLOCK = 32  # weights per block, along a row


def unpack_q4_1(codes: torch.Tensor) -> torch.Tensor:
    """codes (N, K/2) uint8 -> q (N, K) uint8 in [0, 15]: per block of 16 bytes, low nibbles then high ones."""
    rows = codes.shape[0]
    blocks = codes.reshape(rows, -1, BLOCK // 2)                            # (N, K/32, 16)
    return torch.cat((blocks & 0x0F, blocks >> 4), dim=-1).reshape(rows, -1)  # (N, K)


def dequantize_q8_0(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """codes (N, K) int8, scales (N, K/32) fp16 -> weights (N, K) fp32: w = d * q."""
    rows = codes.shape[0]
    d = scales.float()[:, :, None]                                          # (N, K/32, 1)
    return (d * codes.reshape(rows, -1, BLOCK).float()).reshape(rows, -1)


def dequantize_q4_1(codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """codes (N, K/2) uint8, scales and mins (N, K/32) fp16 -> weights (N, K) fp32: w = d * q + m."""
    rows = codes.shape[0]
    q = unpack_q4_1(codes).reshape(rows, -1, BLOCK).float()                # (N, K/32, 32)
    d, m = scales.float()[:, :, None], mins.float()[:, :, None]            # (N, K/32, 1) each
    return (d * q + m).reshape(rows, -1)


def q8_0_matmul(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x (T, K) fp32 times the q8_0 weight (N, K) transposed: (T, N)."""
    return F.linear(x, dequantize_q8_0(codes, scales))


def q4_1_matmul(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """x (T, K) fp32 times the q4_1 weight (N, K) transposed: (T, N)."""
    return F.linear(x, dequantize_q4_1(codes, scales, mins))
