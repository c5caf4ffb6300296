"""Timers for a step's model work, part by part, when `EngineConfig(profile_steps=True)`.

`StepProfiler.instrument` wraps, on these instances, the runner's input preparation, the path's operations
(`engine/ops`) and every weight's product, so each call adds its seconds to its part: norm, attention
(q|k|v and output products, rotary + KV write, paged attention), mlp (gate|up and down products, SwiGLU)
and lm_head. The path that runs is never changed. Where the fast path runs a step's layers as whole
compiled calls there are no parts inside to time: the profiler times the layers as they ran, then times
one layer's parts apart, on the same kernels at the step's shapes (norm and products on stand-in rows,
attention over the step's own cache, rotary + KV write into a scratch cache), and shares the layers'
measured time out in those proportions. `describe()` says which happened.
On CUDA a timer synchronises the device before and after, so a part is charged for its kernels.
"""
from __future__ import annotations

import time

import torch

MODEL_PARTS = ("norm", "attention", "mlp", "lm_head")
PRODUCT_PARTS = {"qkv": "attention", "o": "attention", "gate_up": "mlp", "down": "mlp"}
OPS_PARTS = {"rms_norm": "norm", "rotary_write_kv": "attention", "attention": "attention", "silu_mul": "mlp"}


class TimedProduct:
    """A weight's product whose calls are timed as `part`; the compiled layer still reads its operands."""

    def __init__(self, product, timed):
        self.product, self.timed = product, timed

    def __call__(self, x, residual=None):
        return self.timed(self.product, x, residual)

    def __getattr__(self, name):                   # operands, shape, nbytes, ...: the product's own
        return getattr(self.product, name)


class StepProfiler:
    """Timers around the runner's input preparation and the model's parts, summed per step."""

    def __init__(self, device: torch.device):
        self.times = dict.fromkeys(("prepare",) + MODEL_PARTS, 0.0)
        self.sync = torch.cuda.synchronize if device.type == "cuda" else None
        self.kernels = None
        self.whole_layer_steps = 0                  # forward passes whose layers ran as whole compiled calls
        self.part_by_part_steps = 0                 # ... and part by part
        self.measuring_apart = 0.0                  # seconds spent timing parts apart: not the step's own

    def _run(self, part: str, fn, *args, **kwargs):
        if self.sync:
            self.sync()
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        if self.sync:
            self.sync()
        self.times[part] += time.perf_counter() - start
        return out

    def timed(self, part: str, fn):
        """fn, wrapped so that its time (its kernels' time, on CUDA) is added to `part`."""
        return lambda *args, **kwargs: self._run(part, fn, *args, **kwargs)

    def instrument(self, model, runner) -> None:
        """Wrap runner.prepare, the model's operations and its products on these instances (classes untouched)."""
        runner.prepare = self.timed("prepare", runner.prepare)
        ops = model.ops
        self.kernels = ops.name
        for method, part in OPS_PARTS.items():
            setattr(ops, method, self.timed(part, getattr(ops, method)))
        layers_of = ops.decoder_layers
        ops.decoder_layers = lambda *args: self._layers(layers_of, *args)
        for layer in model.layers:
            for name, part in PRODUCT_PARTS.items():
                layer[name] = TimedProduct(layer[name], self.timed(part, lambda p, x, r: p(x, r)))
        model.lm_head = TimedProduct(model.lm_head, self.timed("lm_head", lambda p, x, r: p(x, r)))

    def _layers(self, decoder_layers, model, x, layers, kv_cache, step):
        """The layers as the path runs them; their parts timed apart when none were timed inside."""
        before = dict(self.times)
        start = time.perf_counter()
        out = decoder_layers(model, x, layers, kv_cache, step)
        if self.sync:
            self.sync()
        elapsed = time.perf_counter() - start
        if self.times == before and layers:         # whole compiled layers: nothing inside was timed
            self.whole_layer_steps += 1
            start = time.perf_counter()
            apart = self._parts_apart(model, x, layers[0], kv_cache, step)
            self.measuring_apart += time.perf_counter() - start
            self.times = before
            total = sum(apart.values())
            for part, seconds in apart.items():
                self.times[part] += elapsed * seconds / total
        elif layers:
            self.part_by_part_steps += 1
        return out

    def _parts_apart(self, model, x, layer, kv_cache, step) -> dict:
        """One layer's parts timed one by one on the path's own operations, at this step's shapes."""
        saved, self.times = self.times, dict.fromkeys(self.times, 0.0)
        ops, T = model.ops, x.shape[0]
        blocks = -(-T // kv_cache.k[0].shape[1])
        scratch_k = kv_cache.k[0].new_empty((blocks,) + tuple(kv_cache.k[0].shape[1:]))   # (b, bs, Hkv, D)
        scratch_v = torch.empty_like(scratch_k)
        slots = torch.arange(T, device=x.device)                    # the scratch cache's slots, never the real ones
        h = ops.rms_norm(x, layer["attn_norm"], model.eps)
        q = ops.rotary_write_kv(layer["qkv"](h), step.positions, step.cos, step.signed_sin, scratch_k, scratch_v,
                                slots, model.num_heads)            # (T, Hq, D)
        attn = ops.attention(q, kv_cache.k[0], kv_cache.v[0], step.meta, model.scale)   # reads the real cache
        y = layer["o"](attn.reshape(T, -1), residual=x)
        h = ops.rms_norm(y, layer["mlp_norm"], model.eps)
        layer["down"](ops.silu_mul(layer["gate_up"](h)), residual=y)
        apart, self.times = self.times, saved
        return {part: apart[part] for part in ("norm", "attention", "mlp")}

    def describe(self) -> dict:
        """What the profiled engine ran: its path, and whether layers ran whole (their parts timed apart)."""
        return {"kernels": self.kernels, "whole_layer_steps": self.whole_layer_steps,
                "part_by_part_steps": self.part_by_part_steps,
                "parts": ("timed apart on the same kernels, sharing out the whole layers' measured time"
                          if self.whole_layer_steps else "timed in place")}

    def collect(self) -> tuple[dict, float]:
        """The seconds gathered since the last call, per part, and the seconds spent timing parts apart (to
        leave out of the step's model phase); the counters restart from zero."""
        times, apart = dict(self.times), self.measuring_apart
        self.times, self.measuring_apart = dict.fromkeys(self.times, 0.0), 0.0
        return times, apart
