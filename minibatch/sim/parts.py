"""The simulator's engine parts: the real model on the simulated clock, or no model at all.

`EngineConfig(clock="simulated")` serves with `SimulatedClockParts`: the model runs for real and
every step is charged what the cost model says. With `sim_skip_model=True` as well, `ShapeOnlyParts`
replace the model by its `ModelShape`, the runner and the sampler by the stand-ins of
`minibatch.sim.stand_ins`, and keep
the KV tensors on PyTorch's "meta" device (sizes without memory).
"""
from __future__ import annotations

import torch

from minibatch.engine.models import ModelShape, load_model_spec
from minibatch.engine.parts import ModelParts
from minibatch.sim.clock import SimulatedClock
from minibatch.sim.costmodel import cost_model
from minibatch.sim.stand_ins import PlaceholderRunner, PlaceholderSampler


class SimulatedClockParts(ModelParts):
    """The real model; time from the cost model of `EngineConfig.sim_profile`."""

    def clock(self, config, model_config):
        return SimulatedClock(cost_model(config.sim_profile, model_config))


class ShapeOnlyParts(SimulatedClockParts):
    """Shapes and tokenizer only: no weights are read and no step computes anything."""

    def load(self, name: str):
        return load_model_spec(name)

    def model(self, loaded, ops, dtype, device, max_model_len, quantization=None):
        return ModelShape(loaded.config)        # the model's sizes, without weights

    def kv_device(self, device: torch.device) -> torch.device:
        return torch.device("meta")

    def runner(self, model, kv_cache, blocks, device):
        return PlaceholderRunner()

    def sampler(self, seed: int, eos_token_ids: set[int]):
        return PlaceholderSampler(eos_token_ids)


def simulated_parts(config) -> SimulatedClockParts:
    """The parts for an EngineConfig with clock="simulated"."""
    return ShapeOnlyParts() if config.sim_skip_model else SimulatedClockParts()
