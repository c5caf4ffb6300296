"""What an engine is built from: the model, where its KV tensors live, the runner, the sampler, the clock.

`ModelParts` makes the real ones: the model's weights and its packed forward pass, a `ModelRunner`,
a `Sampler` seeded per request and the wall clock. `LLMEngine` asks its parts for each piece and
never checks which kind it got, so another set with the same methods can stand in: the simulator's
(`minibatch.sim.parts`) keeps the model's shape without its weights and charges time to a
simulated clock. `minibatch.llm.make_engine` picks the set an `EngineConfig` asks for.
"""
from __future__ import annotations

import torch

from minibatch.engine.clock import RealClock
from minibatch.engine.models import LoadedModel, load_model
from minibatch.engine.models.llama import LlamaModel
from minibatch.engine.runner import ModelRunner
from minibatch.engine.sampling import Sampler


class ModelParts:
    """The real model on the real clock."""

    def load(self, name: str) -> LoadedModel:
        """The model's config, tokenizer, stop tokens and weights (fp32; the model casts them)."""
        return load_model(name, dtype=torch.float32)

    def model(self, loaded: LoadedModel, ops, dtype: torch.dtype, device: torch.device, max_model_len: int,
              quantization: str | None = None):
        return LlamaModel(loaded, ops, dtype, device, max_model_len, quantization)

    def kv_device(self, device: torch.device) -> torch.device:
        """Where the KV tensors are allocated."""
        return device

    def runner(self, model, kv_cache, blocks, device):
        return ModelRunner(model, kv_cache, blocks, device)

    def sampler(self, seed: int, eos_token_ids: set[int]):
        return Sampler(seed, eos_token_ids)

    def clock(self, config, model_config):
        return RealClock()
