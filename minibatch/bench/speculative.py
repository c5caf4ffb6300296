"""Speculative decoding for one user: tokens/s with and without each proposer, on the same prompts.

`compare_speculation(llms, prompts)` serves each prompt alone (a batch of one, greedy) with every
engine in turn, prompt by prompt, so slow drift of the machine hits all engines alike, and
returns one row per engine: tokens/s and the speed-up over the first engine (plain decoding); the
acceptance rate a of the drafts verified; over all decode steps (with or without drafts), the
tokens per step, what 1 + a + ... + a^d predicts for each step's d drafts, and the step cost (the
mean decode step over plain decoding's); and the predicted speed-up: tokens per step over step
cost for the decoding, with the prefill (which speculation does not shorten) added back. Every
engine must produce the same tokens as the first (greedy speculative decoding changes nothing but
speed), and this is checked.

The command runs an input-grounded task (summarising or extracting from a given text, where the
output copies from the input and prompt lookup shines) and free generation, with the default
settings (`EngineConfig.speculative_adaptive`: each request drafts only what pays) and, for
comparison, prompt lookup that always drafts k:

    python -m minibatch speculate --model smollm2-135m
"""
from __future__ import annotations

import statistics
import time

from minibatch.config import EngineConfig, SamplingParams
from minibatch.analysis.metrics import speculation_summary
from minibatch.engine.speculative import expected_tokens_per_step
from minibatch.workloads.grounded import grounded_prompts

FREE_PROMPTS = ["Write a short story about a lighthouse keeper who finds a message in a bottle.",
                "Describe your ideal weekend in a small mountain village."]


def warm_up(llm, max_new_tokens: int = 12) -> None:
    """First calls pay for lazy initialisation: serve a prompt that repeats itself (prompt lookup then drafts)."""
    llm.generate([[1, 2, 3, 4, 5, 6, 7, 8] * 4], SamplingParams(max_new_tokens=max_new_tokens), use_tqdm=False)


def compare_speculation(llms: dict, prompts: list, max_new_tokens: int = 64, rounds: int = 1) -> list[dict]:
    """One row per engine in `llms` ({name: LLM}, plain decoding first) over `prompts` (chats or text).
    With rounds > 1 every engine serves every prompt that many times, interleaved, and each (engine,
    prompt) keeps its fastest answer and that answer's steps: other programs only slow answers down."""
    params = SamplingParams(max_new_tokens=max_new_tokens)
    best = {}                                             # (engine, prompt index) -> (seconds, token ids, steps)
    for llm in llms.values():
        warm_up(llm)
    for _ in range(rounds):
        for i, prompt in enumerate(prompts):
            for name, llm in llms.items():
                first = len(llm.engine.step_records)
                start = time.perf_counter()
                out = llm.generate([prompt], params, use_tqdm=False)[0]
                elapsed = time.perf_counter() - start
                if (name, i) not in best or elapsed < best[name, i][0]:
                    best[name, i] = (elapsed, out.token_ids, llm.engine.step_records[first:])
    seconds, tokens, steps, outputs = ({name: [] for name in llms} for _ in range(4))
    for (name, _), (elapsed, token_ids, records) in best.items():
        seconds[name].append(elapsed)
        tokens[name].append(len(token_ids))
        steps[name] += records
        outputs[name].append(token_ids)
    plain = next(iter(llms))
    prefill_s = sum(s.duration for s in steps[plain] if s.num_prefill_tokens)   # the same work for every engine
    decode = {name: [s for s in steps[name] if s.num_prefill_tokens == 0] for name in llms}
    step_s = {name: sum(s.duration for s in decode[name]) / len(decode[name]) for name in llms}  # mean decode step
    rows = []
    for name in llms:
        if outputs[name] != outputs[plain]:
            raise AssertionError(f"{name} produced other tokens than {plain}: greedy speculation must not change them")
        spec = speculation_summary(steps[name])
        a = spec.get("spec_acceptance_rate")
        drafted = [sum(d for d, _ in s.spec_outcomes) for s in decode[name]]
        tokens_per_step = (sum(tokens[name]) - len(prompts)) / len(decode[name])  # the first token ends the prefill
        step_cost = step_s[name] / step_s[plain]
        plain_decode_s = len(decode[plain]) * step_s[plain]
        rows.append({"engine": name, "tokens": sum(tokens[name]), "tok_s": sum(tokens[name]) / sum(seconds[name]),
                     "acceptance_rate": a, "drafting_steps": sum(1 for d in drafted if d) / len(drafted),
                     "draft_tokens_per_step": spec.get("spec_draft_tokens_per_step", 0.0),
                     "tokens_per_step": tokens_per_step,
                     "formula_tokens_per_step": sum(expected_tokens_per_step(a or 0.0, d) for d in drafted) / len(drafted),
                     "step_cost": step_cost,
                     "predicted_speedup": (prefill_s + plain_decode_s)
                     / (prefill_s + plain_decode_s * step_cost / tokens_per_step)})
    for row in rows:
        row["speedup"] = row["tok_s"] / rows[0]["tok_s"]
    return rows


def speedup_by_batch(plain, speculative, prompt, batch_sizes=(1, 4, 16), max_new_tokens: int = 48) -> list[dict]:
    """Throughput of `speculative` against `plain` (two LLMs with room for the largest batch) when
    batch_size copies of `prompt` are served together, for each batch size; with the tokens per
    step of the speculative run and its step cost (median decode step over plain's median)."""
    params, rows = SamplingParams(max_new_tokens=max_new_tokens), []
    for b in batch_sizes:
        row, decode_s = {"batch_size": b}, {}
        for name, llm in (("plain", plain), ("speculative", speculative)):
            first = len(llm.engine.step_records)
            start = time.perf_counter()
            outs = llm.generate([prompt] * b, params, use_tqdm=False)
            row[f"{name}_tok_s"] = sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start)
            steps = llm.engine.step_records[first:]
            decode_s[name] = statistics.median(s.duration for s in steps if s.num_prefill_tokens == 0)
            if name == "speculative":
                row["tokens_per_step"] = speculation_summary(steps).get("spec_tokens_per_step", 1.0)
        row["speedup"] = row["speculative_tok_s"] / row["plain_tok_s"]
        row["step_cost"] = decode_s["speculative"] / decode_s["plain"]
        rows.append(row)
    return rows


def add_arguments(parser) -> None:
    parser.add_argument("--model", default="smollm2-135m", help="the target model (default: smollm2-135m)")
    parser.add_argument("--k", type=int, default=EngineConfig.num_speculative_tokens,
                        help="the most draft tokens per step (default: EngineConfig's)")
    parser.add_argument("--layers", type=int, default=None, help="layer_skip: draft layers (default: half)")
    parser.add_argument("--draft", default=None, help="draft model for method 'draft' (default: none, skipped)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per answer (default: 64)")
    parser.add_argument("--rounds", type=int, default=3, help="answers per engine and prompt, the fastest kept "
                                                               "(default: 3)")


def main(args) -> int:
    from minibatch import LLM

    base = dict(model=args.model, scheduler="edge", max_model_len=1024, num_kv_blocks=80,
                num_speculative_tokens=args.k)
    methods = {"plain": {}, "ngram": {"speculative_method": "ngram"},
               "ngram fixed": {"speculative_method": "ngram", "speculative_adaptive": False},
               "layer_skip": {"speculative_method": "layer_skip", "speculative_layers": args.layers}}
    if args.draft:
        methods["draft"] = {"speculative_method": "draft", "speculative_model": args.draft}
    llms = {name: LLM(EngineConfig(**base, **extra)) for name, extra in methods.items()}
    for task, prompts in (("input-grounded", grounded_prompts()), ("free generation", FREE_PROMPTS)):
        chats = [[{"role": "user", "content": p}] for p in prompts]
        print(f"\n{task}: {len(chats)} prompts, batch of one, greedy, k up to {args.k} "
              f"('fixed': always k, the others only what pays), fastest of {args.rounds} rounds")
        print(f"{'engine':>11} {'tok/s':>7} {'speedup':>7} {'predict':>7} {'accept':>6} {'drafting':>8} "
              f"{'tok/step':>8} {'formula':>7} {'step cost':>9}")
        for r in compare_speculation(llms, chats, args.max_new_tokens, args.rounds):
            accept = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.2f}"
            print(f"{r['engine']:>11} {r['tok_s']:7.1f} {r['speedup']:7.2f} {r['predicted_speedup']:7.2f} {accept:>6} "
                  f"{r['drafting_steps']:8.0%} {r['tokens_per_step']:8.2f} {r['formula_tokens_per_step']:7.2f} "
                  f"{r['step_cost']:9.2f}")
    return 0
