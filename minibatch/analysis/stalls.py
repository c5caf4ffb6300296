"""How a long prompt's prefill shares its steps with the requests already decoding (chapter 05).

Every sequence in a step waits for the whole step. So what a decoding request pays for someone
else's long prompt is set by the steps that computed that prompt: one step carrying the whole
prompt (no chunking), or many steps of at most the token budget, each also carrying a token of every
request that is decoding (chunked prefill). `prefill_sharing` counts those steps from a run's step
records, so the answer is the same on any machine: counts, not times.
"""
from __future__ import annotations

from collections.abc import Sequence

from minibatch.engine.records import StepRecord


def prefill_sharing(steps: Sequence[StepRecord], request_id: int) -> dict:
    """The steps that computed request `request_id`'s prompt, and what the other requests got in them.

    A request counts as decoding at a step when it decoded at an earlier step and at this one or a
    later one (it had started and not yet finished). Returns:
    `prefill_steps`: steps that computed part of the prompt; `largest_step_tokens`: the most tokens
    one of them carried (prefill and decode together); `shared_steps`: those in which at least one
    other request decoded a token; `stalled`: (step, request) pairs in which a request that was
    decoding got no token."""
    decode_steps: dict[int, list[int]] = {}
    for s in steps:
        for rid, kind in s.slots.values():
            if kind == "decode" and rid != request_id:
                decode_steps.setdefault(rid, []).append(s.step)
    prefilling = [s for s in steps if (request_id, "prefill") in s.slots.values()]
    if not prefilling:
        raise ValueError(f"request_id={request_id}: no step of this run prefilled that request")
    shared, stalled = 0, 0
    for s in prefilling:
        decoded = {rid for rid, kind in s.slots.values() if kind == "decode" and rid != request_id}
        running = {rid for rid, at in decode_steps.items() if at[0] < s.step <= at[-1]}
        shared += bool(decoded)
        stalled += len(running - decoded)
    return {"prefill_steps": len(prefilling), "shared_steps": shared, "stalled": stalled,
            "largest_step_tokens": max(s.num_prefill_tokens + s.num_decode_tokens for s in prefilling)}
