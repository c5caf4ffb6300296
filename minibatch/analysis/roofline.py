"""The roofline's arithmetic: what a decode step must cost at least, and where batching stops being free.

A step's time under a roofline cost model (`minibatch.sim.costmodel.RooflineCostModel`) is its fixed
overhead plus the larger of its memory time (bytes moved / bandwidth) and its compute time (FLOPs /
peak FLOP/s). From it: the parts of one decode step (`step_parts`), the bounds a measured step is set
against (`bounds`), the batch at which decode tokens/s reach half of what any batch could
(`saturating_batch`, and at several overheads `saturation_by_overhead`), what sets a model's serving
speed on a machine (`balance`) and its KV bytes against its weight bytes (`kv_against_weights`). The
peaks themselves are measured by `minibatch.bench.roofline`.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from minibatch.engine.kv import kv_bytes_per_token
from minibatch.engine.models.shape import ModelShape
from minibatch.sim.costmodel import ModelSize, RooflineCostModel, StepShape


def step_parts(cost: RooflineCostModel, batch: int, context: int) -> dict:
    """Seconds of a decode step of `batch` sequences holding `context` tokens each: its fixed overhead,
    its memory time and compute time (at the model's efficiency) and the step the cost model charges."""
    shape = StepShape(decode_seqs=batch, kv_tokens_read=batch * context, attention_pairs=batch * context,
                      sampled_rows=batch)                      # each new token reads and attends to its whole context
    memory = replace(cost, peak_flops=float("inf"), overhead_s=0.0).step_time(shape)
    compute = replace(cost, memory_bandwidth=float("inf"), overhead_s=0.0).step_time(shape)
    return {"overhead_s": cost.overhead_s, "memory_s": memory, "compute_s": compute, "step_s": cost.step_time(shape)}


def saturating_batch(cost: RooflineCostModel, context: int, limit: int = 1 << 16) -> int:
    """The batch at which decode tokens/s reach half of what any batch could (the knee of the curve):
    past it, the fixed costs of a step (overhead, reading the weights) are shared so widely that each
    sequence's own costs (its arithmetic, reading its KV cache) set the pace."""
    tok_s = lambda batch: batch / step_parts(cost, batch, context)["step_s"]  # noqa: E731
    ceiling = tok_s(limit)                                                    # tokens/s rise towards this
    low, high = 1, limit
    while low < high:                                                         # tokens/s grow with the batch
        mid = (low + high) // 2
        low, high = (low, mid) if tok_s(mid) >= ceiling / 2 else (mid + 1, high)
    return low


def balance(cost: RooflineCostModel, context: int) -> dict:
    """What sets a model's serving speed on a machine: per-token work, bytes, the saturating batch and
    the share of a step that is overhead, at batch 1 and at the saturating batch."""
    size, value = cost.size, cost.bytes_per_value
    one, batch = step_parts(cost, 1, context), saturating_batch(cost, context)
    full = step_parts(cost, batch, context)
    return {"weight_bytes": (size.body_params + size.lm_head_params) * value,
            "flops_per_token": 2 * (size.body_params + size.lm_head_params),
            "kv_bytes_per_token": size.kv_values_per_token * value, "step_batch1_s": one["step_s"],
            "saturating_batch": batch, "overhead_share_batch1": one["overhead_s"] / one["step_s"],
            "overhead_share_saturated": full["overhead_s"] / full["step_s"]}


def bounds(size: ModelSize, bytes_per_value: int, flops: float, bandwidth: float, batch: int, context: int) -> dict:
    """Seconds a decode step of `batch` sequences holding `context` cached tokens in all needs, at least."""
    parts = step_parts(RooflineCostModel(flops, bandwidth, 0.0, bytes_per_value, 1.0, size), batch, context // batch)
    return {"memory_bound_s": parts["memory_s"], "compute_bound_s": parts["compute_s"],
            "bound_s": max(parts["memory_s"], parts["compute_s"])}


def kv_against_weights(config, dtype: torch.dtype = torch.bfloat16) -> dict:
    """A model's KV bytes per token against the weight bytes a decode step reads, from its Hugging Face config
    with the engine's own arithmetic; `match_tokens`: the cached tokens of a whole batch (batch x context) whose
    KV reads take as long as reading the weights once. Past it, a step's bytes are mostly KV cache."""
    shape, size = ModelShape(config), ModelSize.of(config)
    kv = kv_bytes_per_token(shape.num_layers, shape.num_kv_heads, shape.head_dim, dtype)
    weights = (size.body_params + size.lm_head_params) * torch.empty((), dtype=dtype).element_size()
    return {"weight_bytes": weights, "kv_bytes_per_token": kv, "kv_per_weight_byte": kv / weights,
            "match_tokens": weights / kv}


def saturation_by_overhead(costs: dict, context: int, overheads_s=(0.0, 0.5e-3, 2e-3)) -> dict:
    """{overhead_s: {label: saturating batch}}: each cost model's saturating batch with its overhead replaced."""
    return {o: {label: saturating_batch(replace(cost, overhead_s=o), context) for label, cost in costs.items()}
            for o in overheads_s}
