"""KV-cache memory: what one token costs, what a budget holds, and what a run reserved versus used.

Capacity you can work out by hand:

    bytes per token   = 2 (K and V) x layers x KV heads x head dim x bytes per element
    tokens that fit   = budget // bytes per token
    blocks that fit   = budget // (bytes per token x block_size)
    sequences that fit = blocks that fit // blocks per sequence

A sequence of n tokens needs ceil(n / block_size) blocks under the "paged" layout, which
allocates a block when a token needs it; under the "contiguous" layout it holds
ceil(max_model_len / block_size) blocks from the moment it is admitted, whatever it ends up using.

A run's memory report (`memory_report`) reads the per-step records of a `RunReport`: blocks
reserved, tokens stored and which request held which blocks (`StepRecord.block_tables`, filled
by `BlockTableRecorder`). The *waste* is the share of reserved token slots that held no token:
the unused tail of each last block when paged, the unused reservation when contiguous.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minibatch.config import KV_LAYOUTS, ConfigError
from minibatch.engine.kv import blocks_for, kv_bytes_per_token
from minibatch.engine.models import ModelShape, load_model_spec
from minibatch.validate import check_choice, check_int

GIB = 1 << 30


@dataclass(frozen=True)
class KVShape:
    """The numbers of a model that size its KV cache."""

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "float32"       # element type of the cache: "float32", "bfloat16" or "float16"

    def __post_init__(self):
        for field in ("num_layers", "num_kv_heads", "head_dim"):
            check_int("KVShape", field, getattr(self, field), 1)
        check_choice("KVShape", "dtype", self.dtype, ("float32", "bfloat16", "float16"))

    @property
    def bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, getattr(torch, self.dtype))

    @classmethod
    def of_model(cls, model: str, dtype: str = "float32") -> "KVShape":
        """The shape of a registry model (e.g. "smollm2-135m"), read from its config: no weights are loaded."""
        shape = ModelShape(load_model_spec(model).config)
        return cls(model, shape.num_layers, shape.num_kv_heads, shape.head_dim, dtype)


LLAMA2_7B = KVShape("Llama-2-7B", num_layers=32, num_kv_heads=32, head_dim=128, dtype="float16")  # no GQA


def capacity(bytes_per_token: int, budget_bytes: int, block_size: int = 16, tokens_per_seq: int | None = None,
             layout: str = "paged", max_model_len: int | None = None) -> dict:
    """What a KV budget holds: tokens, blocks and, given tokens_per_seq, how many such sequences.

    Contiguous reserves max_model_len tokens per sequence (or tokens_per_seq, if that is larger)."""
    for name, value in (("bytes_per_token", bytes_per_token), ("budget_bytes", budget_bytes), ("block_size", block_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name}={value!r} is not allowed: an integer >= 1")
    if layout not in KV_LAYOUTS:
        raise ConfigError(f"layout={layout!r} is not allowed: choose one of " + ", ".join(map(repr, KV_LAYOUTS)))
    if layout == "contiguous" and max_model_len is None:
        raise ConfigError("max_model_len=None is not allowed with layout='contiguous': it sets the reservation")
    blocks = budget_bytes // (bytes_per_token * block_size)
    out = {"tokens": budget_bytes // bytes_per_token, "blocks": blocks, "block_tokens": blocks * block_size}
    if tokens_per_seq is not None:
        per_seq = blocks_for(tokens_per_seq, block_size)
        if layout == "contiguous":
            per_seq = max(per_seq, blocks_for(max_model_len, block_size))
        out["blocks_per_seq"] = per_seq
        out["max_seqs"] = blocks // per_seq
    return out


@dataclass(frozen=True)
class KVSpec:
    """How an engine's KV cache was set up: what a run's records need to become bytes."""

    bytes_per_token: int
    block_size: int
    num_blocks: int
    layout: str
    max_model_len: int

    @property
    def budget_bytes(self) -> int:
        return self.num_blocks * self.block_size * self.bytes_per_token

    @classmethod
    def of(cls, engine) -> "KVSpec":
        """From an `LLM` or an `LLMEngine`."""
        engine = getattr(engine, "engine", engine)
        blocks = engine.blocks
        return cls(engine.kv_cache.bytes_per_token, blocks.block_size, blocks.num_blocks, blocks.layout,
                   engine.max_model_len)


def memory_report(report, engine) -> dict:
    """Reserved versus used KV bytes over a run, its waste, the most sequences that fit at once,
    and the throughput reached within this memory budget.

    report: a `RunReport`; engine: the `LLM` or `LLMEngine` that ran it, or its `KVSpec`.
    Means and the waste are over steps (a token slot reserved for 10 steps counts 10 times).
    """
    spec = engine if isinstance(engine, KVSpec) else KVSpec.of(engine)
    steps = report.steps
    if not steps:
        raise ConfigError("report has no steps: run a workload first")
    reserved = [s.kv_blocks_used * spec.block_size for s in steps]   # token slots held per step
    stored = [s.kv_tokens_stored for s in steps]                     # tokens in them
    summary = report.summary()
    return {
        "layout": spec.layout,
        "block_size": spec.block_size,
        "bytes_per_token": spec.bytes_per_token,
        "budget_bytes": spec.budget_bytes,
        "peak_reserved_bytes": max(reserved) * spec.bytes_per_token,
        "peak_used_bytes": max(stored) * spec.bytes_per_token,
        "mean_reserved_bytes": sum(reserved) / len(steps) * spec.bytes_per_token,
        "mean_used_bytes": sum(stored) / len(steps) * spec.bytes_per_token,
        "waste_fraction": 1 - sum(stored) / sum(reserved) if sum(reserved) else 0.0,
        "max_concurrent_seqs": max(len(s.block_tables) for s in steps),
        "max_batch_size_seen": max(s.batch_size for s in steps),
        "preemptions": sum(s.num_preempted for s in steps),
        "throughput_tok_s": summary["throughput_tok_s"],
    }
