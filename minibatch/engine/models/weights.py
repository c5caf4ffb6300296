"""How each weight matrix of the model is stored, from `EngineConfig.quantization`.

`weight_builder` returns the function the Llama model calls once per matrix it multiplies by (given the
Hugging Face names of the weights it stacks, e.g. q|k|v): the stacked tensor, cast and moved, with
quantization=None; blocks otherwise (`models.quantized.QuantizedWeight`). With "q4_1" the blocks are the
model's GGUF file's own (`models.gguf_blocks`); a stack whose parts the file does not hold in one block
format stays a plain tensor. The model then asks the path's `ops.product` how to multiply by it.
"""
from __future__ import annotations

import torch

from minibatch.engine.models import LoadedModel
from minibatch.engine.models.gguf_blocks import gguf_file, read_blocks
from minibatch.engine.models.quantized import QuantizedWeight, quantize_q8_0


def weight_builder(loaded: LoadedModel, quantization: str | None, put):
    """A function names -> those weights stacked along rows (put: cast and move a tensor), or their blocks."""
    state_dict = loaded.state_dict

    def plain(names: list[str]) -> torch.Tensor:
        return put(torch.cat([state_dict[n] for n in names]))

    if quantization is None:
        return plain
    if quantization == "q8_0":
        return lambda names: quantize_q8_0(torch.cat([state_dict[n] for n in names]))
    blocks = read_blocks(gguf_file(loaded.name))

    def from_file(names: list[str]) -> torch.Tensor | QuantizedWeight:
        parts = [blocks.get(n) for n in names]
        if any(p is None for p in parts) or len({p.format for p in parts}) != 1:
            return plain(names)                    # not all in one block format in the file: fp32
        return QuantizedWeight.cat(parts)

    return from_file
