"""How each weight matrix of the model is stored and multiplied, from `EngineConfig.quantization`.

`linear_builder` returns the function the Llama model calls once per matrix it multiplies by
(given the Hugging Face names of the weights it stacks, e.g. q|k|v): a plain `Linear` with
quantization=None, a `QuantizedLinear` over blocks otherwise (`models.quantized`). With "q4_1" the
blocks are the model's GGUF file's own (`models.gguf_blocks`); a stack whose parts the file does
not hold in one block format stays a plain `Linear`.

`check_quantization` refuses, before any weight is read, what cannot run: a format the model
cannot provide, a device or dtype the kernels do not compute in.
"""
from __future__ import annotations

import torch

from minibatch.config import QUANTIZATIONS, ConfigError
from minibatch.engine.models import LoadedModel
from minibatch.engine.models.gguf_blocks import gguf_file, read_blocks
from minibatch.engine.models.linear import Linear
from minibatch.engine.models.quantized import QuantizedLinear, QuantizedWeight, quantize_q8_0


def check_quantization(quantization: str | None, model: str, device: torch.device, dtype: torch.dtype) -> None:
    """Raise ConfigError unless this model can be served with this quantization on this device and dtype."""
    if quantization not in QUANTIZATIONS:
        raise ConfigError(f"EngineConfig.quantization={quantization!r} is not allowed: choose one of "
                          + ", ".join(map(repr, QUANTIZATIONS)))
    if quantization is None:
        return
    if device.type != "cpu":
        raise ConfigError(f"EngineConfig.quantization={quantization!r} is not allowed on device={device.type!r}: "
                          "the quantised kernels run on the CPU; use device='cpu', or quantization=None on a GPU")
    if dtype != torch.float32:
        raise ConfigError(f"EngineConfig.quantization={quantization!r} is not allowed with dtype={str(dtype)[6:]!r}: "
                          "the quantised kernels compute in 'float32'; use dtype='float32' (or 'auto' on a CPU)")
    if quantization == "q4_1" and gguf_file(model) is None:
        raise ConfigError(f"EngineConfig.quantization='q4_1' is not allowed for model={model!r}: q4_1 reads the "
                          "4-bit blocks of the GGUF file a model was converted from, and only 'smollm2-135m' "
                          "ships one; for this model choose None or 'q8_0' (quantised from its weights)")


def linear_builder(loaded: LoadedModel, quantization: str | None, put):
    """A function names -> the product by those weights stacked along rows (put: cast and move a tensor)."""
    state_dict = loaded.state_dict

    def plain(names: list[str]) -> Linear:
        return Linear(put(torch.cat([state_dict[n] for n in names])))

    if quantization is None:
        return plain
    if quantization == "q8_0":
        return lambda names: QuantizedLinear(quantize_q8_0(torch.cat([state_dict[n] for n in names])))
    blocks = read_blocks(gguf_file(loaded.name))

    def from_file(names: list[str]) -> Linear | QuantizedLinear:
        parts = [blocks.get(n) for n in names]
        if any(p is None for p in parts) or len({p.format for p in parts}) != 1:
            return plain(names)                    # not all in one block format in the file: fp32
        return QuantizedLinear(QuantizedWeight.cat(parts))

    return from_file
