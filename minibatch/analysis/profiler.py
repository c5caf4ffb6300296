"""Where a step's time goes: scheduling, input preparation, each kind of model work, sampling, the rest.

With `EngineConfig(profile_steps=True)` the engine wraps the runner's input preparation and the
model's parts (norms, attention, MLP, LM head) in timers, on the path it runs, and each step's record
carries the seconds of every part in `phase_times`; where the fast path ran a step's layers as whole
compiled calls, their parts are timed apart on the same kernels (`engine/timing.py`). On CUDA a timer
synchronises the device before and after, so a part is charged for its kernels rather than their
launch; that slows the profiled run down, so profile to understand and benchmark with the flag off.
With the flag off nothing is wrapped and steps run as before.

The parts of a step, and which of them are overhead (work that does not grow with the model):

    schedule   the scheduler, KV block bookkeeping and the step record         overhead
    propose    draft tokens (speculative decoding only)                         draft
    prepare    packing ids, positions, slots and metadata into tensors         overhead
    norm       RMSNorms                                                        model
    attention  q|k|v and output products, rotary, KV write, paged attention   model
    mlp        SwiGLU MLP                                                      model
    lm_head    the vocabulary projection of the sampling rows                  model
    other      the rest of the forward pass: the embedding lookup, Python between overhead
               layers
    sample     logits to tokens                                                overhead
    update     appending tokens, stop checks, freeing finished requests        overhead

Profiling a real engine (`python -m minibatch profile`) is `minibatch.tools.profile`.
"""
from __future__ import annotations

import numpy as np

from minibatch.engine.timing import MODEL_PARTS

OVERHEAD_PARTS = ("schedule", "prepare", "other", "sample", "update")
PARTS = ("schedule", "propose", "prepare") + MODEL_PARTS + ("other", "sample", "update")  # drawing order


def breakdown(phase_times: dict) -> dict:
    """Seconds per part (PARTS) of one profiled step, from its record's phase_times."""
    t = phase_times
    inside = t["prepare"] + sum(t[p] for p in MODEL_PARTS)
    parts = {"schedule": t["schedule"], "propose": t.get("propose", 0.0), "prepare": t["prepare"],
             **{p: t[p] for p in MODEL_PARTS}, "other": max(0.0, t["model"] - inside),
             "sample": t["sample"], "update": t["update"]}
    return parts


def overhead_share(parts: dict) -> float:
    """The share of a step's time spent outside the model's arithmetic (and outside drafting)."""
    return sum(parts[p] for p in OVERHEAD_PARTS) / sum(parts.values())


def profile_summary(steps, decode_only: bool = True) -> dict:
    """Median seconds per part over profiled steps (decode-only steps by default), their total, and
    the overhead share; {} if no step was profiled."""
    steps = [s for s in steps if "prepare" in s.phase_times and not (decode_only and s.num_prefill_tokens)]
    if not steps:
        return {}
    rows = [breakdown(s.phase_times) for s in steps]
    parts = {p: float(np.median([r[p] for r in rows])) for p in PARTS}
    return {"parts": parts, "step_s": sum(parts.values()), "overhead_share": overhead_share(parts),
            "steps": len(steps), "batch_size": float(np.mean([s.batch_size for s in steps]))}
