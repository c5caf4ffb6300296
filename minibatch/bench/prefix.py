"""Prefix caching on a shared-system-prompt chat workload: prefill tokens, TTFT and throughput, cache on and off.

`compare_prefix_caching(llms, workload)` serves the same workload with each engine in turn (the
prefix cache reset before each run, so every run starts cold), `reps` times, interleaved, and
returns one row per engine: prefill tokens computed, tokens served from the cache, the hit rate
(vLLM's prefix_cache_hits / prefix_cache_queries), median and mean TTFT and output tokens/s
(medians over the repetitions). Greedy tokens must be the same with the cache on and off, and this
is checked. Where vLLM is installed, its CPU build serves the same prompts with its own prefix
caching on and off (offline: tokens/s and cached tokens); where it is not, it is skipped.

    python -m minibatch prefix --system-len 256 --requests 16
"""
from __future__ import annotations

import importlib.util
import statistics

from minibatch.workloads import Poisson
from minibatch.workloads.shared_prefix import shared_prompt_workload


def run_once(llm, workload) -> dict:
    """One cold run of `workload`: its counts, latencies and tokens."""
    llm.reset_prefix_cache()
    report = llm.run(workload, use_tqdm=False)
    s = report.summary()
    requests = list(llm.engine.requests.values())[-len(workload):]
    return {"prefill_tokens": sum(st.num_prefill_tokens for st in report.steps), "cached_tokens": s["cached_tokens"],
            "hit_rate": s["prefix_cache_hit_rate"], "p50_ttft_s": s["p50_ttft_s"], "mean_ttft_s": s["mean_ttft_s"],
            "tok_s": s["throughput_tok_s"], "tokens": [r.output_token_ids for r in requests]}


def compare_prefix_caching(llms: dict, workload, reps: int = 2) -> list[dict]:
    """One row per engine in `llms` ({name: LLM}); figures are medians over `reps` interleaved runs."""
    runs = {name: [] for name in llms}
    for _ in range(reps):
        for name, llm in llms.items():
            runs[name].append(run_once(llm, workload))
    first = next(iter(llms))
    rows = []
    for name, results in runs.items():
        if any(r["tokens"] != runs[first][0]["tokens"] for r in results):
            raise AssertionError(f"{name} produced other tokens than {first}: prefix caching must not change them")
        row = {"engine": name, **{key: statistics.median(r[key] for r in results)
                                  for key in ("prefill_tokens", "cached_tokens", "hit_rate", "p50_ttft_s",
                                              "mean_ttft_s", "tok_s")}}
        rows.append(row)
    for row in rows:
        row["ttft_ratio"] = row["mean_ttft_s"] / rows[0]["mean_ttft_s"]
    return rows


def vllm_model(name: str) -> str:
    """What vLLM loads for a minibatch model name: the converted folder of the default SLM, else the name itself."""
    if name == "smollm2-135m":
        from minibatch.engine.models.smollm2 import default_model_dir
        return str(default_model_dir())
    return name


def vllm_rows(model_folder: str, prompts: list[list[int]], max_new_tokens: int) -> list[dict] | None:
    """vLLM-CPU with enable_prefix_caching off and on, offline, on the same token ids; None if vLLM is not installed."""
    if importlib.util.find_spec("vllm") is None:
        return None
    import time

    from vllm import LLM as VLLM, SamplingParams as VParams, TokensPrompt

    rows = []
    for on in (False, True):
        llm = VLLM(model=model_folder, enable_prefix_caching=on, dtype="float32", max_model_len=2048)
        params = VParams(max_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
        start = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        seconds = time.perf_counter() - start
        rows.append({"engine": f"vllm-cpu cache {'on' if on else 'off'}",
                     "cached_tokens": sum(o.num_cached_tokens or 0 for o in outs),
                     "tok_s": sum(len(o.outputs[0].token_ids) for o in outs) / seconds})
        del llm
    return rows


def add_arguments(parser) -> None:
    parser.add_argument("--model", default="smollm2-135m", help="the model (default: smollm2-135m)")
    parser.add_argument("--requests", type=int, default=16, help="requests in the workload (default: 16)")
    parser.add_argument("--system-len", type=int, default=256, help="tokens of each system prompt (default: 256)")
    parser.add_argument("--system-prompts", type=int, default=1, help="distinct system prompts (default: 1)")
    parser.add_argument("--rate", type=float, default=2.0, help="arrivals per second, Poisson (default: 2)")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="tokens per answer (default: 16)")
    parser.add_argument("--reps", type=int, default=2, help="interleaved runs of each engine (default: 2)")
    parser.add_argument("--clock", default="real", choices=("real", "simulated"), help="engine clock (default: real)")


def main(args) -> int:
    from minibatch import LLM, EngineConfig
    from minibatch.workloads import Fixed

    base = dict(model=args.model, max_batch_size=8, block_size=16, clock=args.clock)
    llms = {f"cache {label}": LLM(EngineConfig(**base, enable_prefix_caching=on)) for label, on in
            (("off", False), ("on", True))}
    tokenizer = next(iter(llms.values())).tokenizer
    workload = shared_prompt_workload(tokenizer, args.requests, args.system_len, args.system_prompts,
                                      Poisson(args.rate), Fixed(args.max_new_tokens))
    print(f"{args.requests} chat requests, {args.system_prompts} system prompt(s) of {args.system_len} tokens, "
          f"Poisson {args.rate}/s, {args.max_new_tokens} tokens each, {args.clock} clock, median of {args.reps} runs")
    print(f"{'engine':>14} {'prefill tok':>11} {'cached tok':>10} {'hit rate':>8} {'p50 TTFT s':>10} "
          f"{'mean TTFT s':>11} {'TTFT ratio':>10} {'tok/s':>7}")
    for r in compare_prefix_caching(llms, workload, args.reps):
        print(f"{r['engine']:>14} {r['prefill_tokens']:11.0f} {r['cached_tokens']:10.0f} {r['hit_rate']:8.2f} "
              f"{r['p50_ttft_s']:10.3f} {r['mean_ttft_s']:11.3f} {r['ttft_ratio']:10.2f} {r['tok_s']:7.1f}")
    peers = vllm_rows(vllm_model(args.model), [w.prompt for w in workload], args.max_new_tokens)
    if peers is None:
        print("vLLM-CPU: not installed, skipped (pip install vllm, CPU build, to set it beside minibatch)")
    else:
        for r in peers:
            print(f"{r['engine']:>14} {'':>11} {r['cached_tokens']:10.0f} {'':>8} {'':>10} {'':>11} {'':>10} "
                  f"{r['tok_s']:7.1f}")
    return 0
