"""Where a step's time goes: scheduling, input preparation, each kind of model work, sampling, the rest.

With `EngineConfig(profile_steps=True)` the engine wraps the runner's input preparation and the
model's parts (embedding lookup, norms, attention, MLP, LM head) in timers, and each step's record
carries the seconds of every part in `phase_times`. On CUDA a timer synchronises the device before
and after, so a part is charged for its kernels rather than their launch; that slows the profiled
run down, so profile to understand and benchmark with the flag off. With the flag off nothing is
wrapped and steps run as before.

The parts of a step, and which of them are overhead (work that does not grow with the model):

    schedule   the scheduler, KV block bookkeeping and the step record         overhead
    propose    draft tokens (speculative decoding only)                         draft
    prepare    packing ids, positions, slots and metadata into tensors         overhead
    embed      embedding lookup and rotary tables                              model
    norm       RMSNorms                                                        model
    attention  q|k|v and output projections, rotary, KV write, paged attention model
    mlp        SwiGLU MLP                                                      model
    lm_head    the vocabulary projection of the sampling rows                  model
    other      the rest of the forward pass: Python between layers             overhead
    sample     logits to tokens                                                overhead
    update     appending tokens, stop checks, freeing finished requests        overhead

Usage: `python -m minibatch profile --model smollm2-135m --batch-sizes 1 32`.
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


def profile_decode(llm, batch_size: int, num_steps: int = 8, prompt_tokens: int = 32) -> dict:
    """Profile decode steps at one batch size: batch_size prompts of prompt_tokens token ids generate
    num_steps + 1 tokens together. `llm` needs profile_steps=True and max_batch_size >= batch_size."""
    from minibatch.config import SamplingParams

    vocab = llm.engine.model.vocab_size
    prompts = [[(97 * i + 31 * j) % (vocab - 16) + 8 for j in range(prompt_tokens)] for i in range(batch_size)]
    first = len(llm.engine.step_records)
    llm.generate(prompts, SamplingParams(max_new_tokens=num_steps + 1, ignore_eos=True), use_tqdm=False)
    return profile_summary(llm.engine.step_records[first:])


def add_arguments(parser) -> None:
    parser.add_argument("--model", default="smollm2-135m", help="registry name or folder (default: smollm2-135m)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32], help="decode batch sizes to profile")
    parser.add_argument("--steps", type=int, default=8, help="decode steps per batch size (default: 8)")
    parser.add_argument("--prompt-tokens", type=int, default=32, help="prompt length of each sequence (default: 32)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")


def main(args) -> int:
    from minibatch import LLM, EngineConfig

    llm = LLM(EngineConfig(model=args.model, device=args.device, max_batch_size=max(args.batch_sizes),
                           profile_steps=True, max_model_len=args.prompt_tokens + args.steps + 8))
    print(f"{args.model}: median ms per decode step part")
    print(f"{'batch':>5} " + " ".join(f"{p:>9}" for p in PARTS) + f" {'total':>9} {'overhead':>8}")
    for b in args.batch_sizes:
        prof = profile_decode(llm, b, args.steps, args.prompt_tokens)
        cells = " ".join(f"{1e3 * prof['parts'][p]:9.2f}" for p in PARTS)
        print(f"{b:5d} {cells} {1e3 * prof['step_s']:9.2f} {prof['overhead_share']:8.1%}")
    return 0
