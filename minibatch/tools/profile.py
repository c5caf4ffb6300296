"""Profile decode steps of a real engine, part by part (`minibatch.analysis.profiler` does the arithmetic).

The profile times the engine as configured, on the path it runs (`--kernels`); it says which path that was
and, where the fast path ran a step's layers as whole compiled calls, that their parts were timed apart on
the same kernels (engine/timing.py).

Usage: `python -m minibatch profile --model smollm2-135m --batch-sizes 1 32 [--kernels reference]`.
"""
from __future__ import annotations

from minibatch.analysis.profiler import PARTS, profile_summary


def profile_decode(llm, batch_size: int, num_steps: int = 8, prompt_tokens: int = 32) -> dict:
    """Profile decode steps at one batch size: batch_size prompts of prompt_tokens token ids generate
    num_steps + 1 tokens together. `llm` needs profile_steps=True and max_batch_size >= batch_size."""
    from minibatch.config import SamplingParams

    vocab = llm.engine.model.vocab_size
    prompts = [[(97 * i + 31 * j) % (vocab - 16) + 8 for j in range(prompt_tokens)] for i in range(batch_size)]
    first = len(llm.engine.step_records)
    llm.generate(prompts, SamplingParams(max_new_tokens=num_steps + 1, ignore_eos=True), use_tqdm=False)
    return {**profile_summary(llm.engine.step_records[first:]), "engine": engine_profiled(llm)}


def engine_profiled(llm) -> dict:
    """What the profiled engine ran: its path, attention backend, dtype, and how its layers ran."""
    engine = llm.engine
    return {"kernels": engine.kernels, "attention_backend": engine.attention_backend,
            "dtype": str(engine.dtype)[6:], **engine.profiler.describe()}


def add_arguments(parser) -> None:
    parser.add_argument("--model", default="smollm2-135m", help="registry name or folder (default: smollm2-135m)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32], help="decode batch sizes to profile")
    parser.add_argument("--steps", type=int, default=8, help="decode steps per batch size (default: 8)")
    parser.add_argument("--prompt-tokens", type=int, default=32, help="prompt length of each sequence (default: 32)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--kernels", default="auto", help="auto, reference or fast (EngineConfig.kernels)")


def main(args) -> int:
    from minibatch import LLM, EngineConfig

    llm = LLM(EngineConfig(model=args.model, device=args.device, kernels=args.kernels, profile_steps=True,
                           max_batch_size=max(args.batch_sizes), max_model_len=args.prompt_tokens + args.steps + 8))
    print(f"{args.model}: median ms per decode step part")
    print(f"{'batch':>5} " + " ".join(f"{p:>9}" for p in PARTS) + f" {'total':>9} {'overhead':>8}")
    for b in args.batch_sizes:
        prof = profile_decode(llm, b, args.steps, args.prompt_tokens)
        cells = " ".join(f"{1e3 * prof['parts'][p]:9.2f}" for p in PARTS)
        print(f"{b:5d} {cells} {1e3 * prof['step_s']:9.2f} {prof['overhead_share']:8.1%}")
    ran = engine_profiled(llm)
    print(f"path: {ran['kernels']} ({ran['attention_backend']} attention, {ran['dtype']}); "
          f"{ran['whole_layer_steps']} forward passes ran whole compiled layers, {ran['part_by_part_steps']} ran "
          f"part by part; parts {ran['parts']}")
    return 0
