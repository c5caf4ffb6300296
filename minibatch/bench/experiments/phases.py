"""Where does a run's time go? Its prefill steps against its decode steps, on the bench's own workload.

Feeds docs/performance.md, section "Against the peers". The bench's side-by-side workload (`bench --peers`:
short chat turns, every request at once, each generating exactly its drawn number of tokens) served by the
engine at each max batch size, `--rounds` times; from the step records it prints:

    prefill    seconds in the steps that took prompt tokens (chunks of `max_tokens_per_step`, with any decode
               rows riding along), how many prompt tokens, and the products' arithmetic rate in them:
               2 x the parameters every token passes through x the prompt tokens, over those steps' seconds
               (prefill is bound by arithmetic: set it beside the machine's GEMM rate, `bench`'s roofline)
    decode     seconds in the decode-only steps, how many, and their median step by sequences in the step
    tok/s      the run's output tokens over its seconds, as the bench counts them

    python -m minibatch.bench.experiments.phases [--batch-sizes 1 8 32] [--dtype float32] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics

from minibatch.bench.experiments import check_positive, threads_line
from minibatch.bench.peers.systems import Minibatch
from minibatch.bench.workloads import PEERS, offline_workload
from minibatch.engine.models import load_model
from minibatch.sim.costmodel import ModelSize


def split(steps) -> dict:
    """A run's step records split into the steps that took prompt tokens and the decode-only ones."""
    prefill = [s for s in steps if s.num_prefill_tokens > 0]
    return {"prefill": prefill, "decode": [s for s in steps if s.num_prefill_tokens == 0]}


def by_rows(decode_steps, bands=((1, 1), (2, 8), (9, 16), (17, 32), (33, 1 << 30))) -> str:
    """The median decode step (ms) for each band of sequences in the step, where the run had such steps."""
    parts = []
    for low, high in bands:
        ms = [1e3 * s.duration for s in decode_steps if low <= s.num_decode_tokens <= high]
        if ms:
            label = f"{low}" if low == high else f"{low}-{high}" if high < 1 << 30 else f"{low}+"
            parts.append(f"{label}: {statistics.median(ms):.1f}")
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minibatch.bench.experiments.phases",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=3, help="runs per batch size; each is printed")
    args = parser.parse_args(argv)
    check_positive(parser, "batch-sizes", args.batch_sizes)
    check_positive(parser, "rounds", [args.rounds])
    loaded = load_model(args.model)
    body_params = ModelSize.of(loaded.config).body_params
    workload = offline_workload(PEERS, loaded.tokenizer, loaded.config.vocab_size)
    del loaded                                                         # the engine loads its own weights
    system = Minibatch(args.model, "continuous", dtype=args.dtype)   # configured as the bench configures it
    print(f"{args.model}, {args.dtype}, {threads_line()}: the bench's --peers workload, {len(workload.prompts)} "
          f"requests, {sum(map(len, workload.prompts))} prompt tokens, {workload.output_tokens} output tokens")
    for batch in args.batch_sizes:
        served = workload.head(PEERS.batch_one_requests) if batch == 1 else workload   # as the bench serves batch 1
        system.prepare(batch, workload.max_len)
        print(f"max batch {batch} ({len(served.prompts)} requests):")
        for _ in range(args.rounds):
            run = system.offline(served.prompts, served.output_lens)
            steps = split(run.steps)
            prefill_s = sum(s.duration for s in steps["prefill"])
            prompt_tokens = sum(s.num_prefill_tokens for s in steps["prefill"])
            rate = 2 * body_params * prompt_tokens / prefill_s / 1e9 if prefill_s else 0.0
            decode_s = sum(s.duration for s in steps["decode"])
            print(f"  {run.seconds:.2f} s, {served.output_tokens / run.seconds:.1f} tok/s; prefill "
                  f"{len(steps['prefill'])} steps {prefill_s:.2f} s ({prompt_tokens} tokens, {rate:.0f} GFLOP/s); "
                  f"decode {len(steps['decode'])} steps {decode_s:.2f} s, median ms by sequences "
                  f"{by_rows(steps['decode'])}")
    system.release()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
