"""The configuration resolved once: which device, dtype, path, attention backend and weight format run.

`EngineConfig` checks each field alone when it is built; `resolve` decides what "auto" stands for on this
machine and refuses the combinations that cannot run, before any weight is read, each with the field,
the value and what is allowed:

    device     "auto": CUDA when torch sees a GPU, else the CPU
    dtype      "auto": bfloat16 on CUDA, float32 on the CPU
    kernels    "auto": "fast" on a CPU in float32 or bfloat16 (the compiled kernels), else "reference"
    attention  "auto": the Numba kernel on the fast path, the torch reference on the reference path
    quantization   blocks are multiplied on the CPU, in float32; q4_1 needs the model's GGUF file
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minibatch.config import QUANTIZATIONS, ConfigError, EngineConfig
from minibatch.engine.models.gguf_blocks import gguf_file

COMPILED_DTYPES = (torch.float32, torch.bfloat16)   # what the fast path's and the Numba attention's kernels compute in


@dataclass(frozen=True)
class Resolved:
    """What an EngineConfig stands for on this machine."""

    device: torch.device
    dtype: torch.dtype
    kernels: str                  # "reference" or "fast"
    attention_backend: str        # "torch", "numba" or "numba-cuda"
    quantization: str | None      # None, "q8_0" or "q4_1"


def resolve(config: EngineConfig) -> Resolved:
    """Resolve every "auto" of `config` and check the fields together; raises ConfigError."""
    device, dtype = _device_dtype(config)
    kernels = _kernels(config.kernels, device, dtype)
    attention = _attention(config.attention_backend, kernels, dtype)
    check_quantization(config.quantization, config.model, device, dtype)
    return Resolved(device, dtype, kernels, attention, config.quantization)


def _device_dtype(config: EngineConfig) -> tuple[torch.device, torch.dtype]:
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("EngineConfig.device='cuda' is not allowed here: torch sees no GPU; use 'cpu' or 'auto'")
    use_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    name = config.dtype if config.dtype != "auto" else ("bfloat16" if use_cuda else "float32")
    return torch.device("cuda" if use_cuda else "cpu"), getattr(torch, name)


def _kernels(kernels: str, device: torch.device, dtype: torch.dtype) -> str:
    compiled = device.type == "cpu" and dtype in COMPILED_DTYPES
    if kernels == "auto":
        return "fast" if compiled else "reference"
    if kernels == "fast" and not compiled:
        raise ConfigError(f"EngineConfig.kernels='fast' is not allowed on device={device.type!r} with "
                          f"dtype={str(dtype)[6:]!r}: the fast kernels are compiled for the CPU in 'float32' or "
                          "'bfloat16'; use kernels='reference' (or 'auto')")
    return kernels


def _attention(name: str, kernels: str, dtype: torch.dtype) -> str:
    if name == "auto":
        return "numba" if kernels == "fast" else "torch"
    if name == "numba-cuda" and dtype != torch.float32:
        raise ConfigError(f"EngineConfig.dtype={str(dtype)[6:]!r} is not allowed with attention_backend="
                          "'numba-cuda': the Numba CUDA kernels compute in 'float32'")
    if name == "numba" and dtype not in COMPILED_DTYPES:
        raise ConfigError(f"EngineConfig.dtype={str(dtype)[6:]!r} is not allowed with attention_backend='numba': "
                          "the Numba CPU kernels compute in 'float32' or 'bfloat16'")
    return name


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
