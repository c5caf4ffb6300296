"""Speculative decoding for one user: tokens/s with and without each proposer, on the same prompts.

`compare_speculation(llms, prompts)` serves each prompt alone (a batch of one, greedy) with every
engine in turn, prompt by prompt, so slow drift of the machine hits all engines alike, and
returns one row per engine: tokens/s, the speed-up over the first engine (plain decoding), the
acceptance rate a, tokens per step, what (1 - a^(k+1)) / (1 - a) predicts for that a, and the
step cost: the median decode step (a verify step, with speculation) over plain decoding's median
decode step. Tokens per step divided by step cost is the speed-up the steps predict. Every
engine must produce the same tokens as the first (greedy speculative decoding changes nothing
but speed), and this is checked.

The command runs an input-grounded task (summarising or extracting from a given text, where the
output copies from the input and prompt lookup shines) and free generation:

    python -m minibatch speculate --model smollm2-135m --k 4
"""
from __future__ import annotations

import statistics
import time

from minibatch.config import SamplingParams
from minibatch.analysis.metrics import speculation_summary
from minibatch.engine.speculative import expected_tokens_per_step
from minibatch.workloads.grounded import grounded_prompts

FREE_PROMPTS = ["Write a short story about a lighthouse keeper who finds a message in a bottle.",
                "Describe your ideal weekend in a small mountain village."]


def compare_speculation(llms: dict, prompts: list, max_new_tokens: int = 64) -> list[dict]:
    """One row per engine in `llms` ({name: LLM}, plain decoding first) over `prompts` (chats or text)."""
    params = SamplingParams(max_new_tokens=max_new_tokens)
    seconds, tokens, steps, outputs = ({name: [] for name in llms} for _ in range(4))
    for name, llm in llms.items():                         # warm-up: first calls pay for lazy initialisation
        llm.generate([[1, 2, 3, 4]], SamplingParams(max_new_tokens=4), use_tqdm=False)
    for prompt in prompts:
        for name, llm in llms.items():
            first = len(llm.engine.step_records)
            start = time.perf_counter()
            out = llm.generate([prompt], params, use_tqdm=False)[0]
            seconds[name].append(time.perf_counter() - start)
            tokens[name].append(len(out.token_ids))
            steps[name] += llm.engine.step_records[first:]
            outputs[name].append(out.token_ids)
    plain = next(iter(llms))
    decode_step_s = {name: statistics.median(s.duration for s in steps[name] if s.num_prefill_tokens == 0) for name in llms}
    rows = []
    for name, llm in llms.items():
        if outputs[name] != outputs[plain]:
            raise AssertionError(f"{name} produced other tokens than {plain}: greedy speculation must not change them")
        spec = speculation_summary(steps[name])
        k = llm.config.num_speculative_tokens if llm.config.speculative_method else 0
        a = spec.get("spec_acceptance_rate")
        rows.append({"engine": name, "tokens": sum(tokens[name]), "tok_s": sum(tokens[name]) / sum(seconds[name]),
                     "acceptance_rate": a, "tokens_per_step": spec.get("spec_tokens_per_step", 1.0),
                     "formula_tokens_per_step": expected_tokens_per_step(a, k) if a is not None else 1.0,
                     "draft_tokens_per_step": spec.get("spec_draft_tokens_per_step", 0.0),
                     "step_cost": decode_step_s[name] / decode_step_s[plain]})
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
    parser.add_argument("--k", type=int, default=4, help="draft tokens per step (default: 4)")
    parser.add_argument("--layers", type=int, default=None, help="layer_skip: draft layers (default: half)")
    parser.add_argument("--draft", default=None, help="draft model for method 'draft' (default: none, skipped)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per answer (default: 64)")


def main(args) -> int:
    from minibatch import LLM, EngineConfig

    base = dict(model=args.model, scheduler="edge", max_model_len=1024, num_kv_blocks=80,
                num_speculative_tokens=args.k)
    methods = {"plain": {}, "ngram": {"speculative_method": "ngram"},
               "layer_skip": {"speculative_method": "layer_skip", "speculative_layers": args.layers}}
    if args.draft:
        methods["draft"] = {"speculative_method": "draft", "speculative_model": args.draft}
    llms = {name: LLM(EngineConfig(**base, **extra)) for name, extra in methods.items()}
    for task, prompts in (("input-grounded", grounded_prompts()), ("free generation", FREE_PROMPTS)):
        chats = [[{"role": "user", "content": p}] for p in prompts]
        print(f"\n{task}: {len(chats)} prompts, batch of one, greedy, k={args.k}")
        print(f"{'engine':>11} {'tok/s':>7} {'speedup':>7} {'accept':>6} {'tok/step':>8} {'formula':>7} {'step cost':>9}")
        for r in compare_speculation(llms, chats, args.max_new_tokens):
            accept = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.2f}"
            print(f"{r['engine']:>11} {r['tok_s']:7.1f} {r['speedup']:7.2f} {accept:>6} "
                  f"{r['tokens_per_step']:8.2f} {r['formula_tokens_per_step']:7.2f} {r['step_cost']:9.2f}")
    return 0
