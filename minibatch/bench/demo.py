"""`python -m minibatch demo`: one workload, static versus continuous batching, side by side.

The workload is a few dozen chat requests that all arrive at once, with output lengths drawn
from an exponential distribution (most answers short, a few long), enforced with `ignore_eos`
so every run produces exactly the same number of tokens. The same workload runs under the
static and the continuous scheduler with the same `max_batch_size`, on the same model runner
and kernels, so the difference is scheduling alone. Decoding is greedy, so both runs must
produce identical tokens; the demo checks that and says so.
"""
from __future__ import annotations

import argparse
import gc
from dataclasses import dataclass

import numpy as np

from minibatch.config import EngineConfig, SamplingParams
from minibatch.llm import LLM
from minibatch.analysis.metrics import RunReport
from minibatch.workloads import WorkloadRequest

QUESTIONS = [  # short chat questions; the workload cycles through them
    "What is the capital of France?", "Give me three tips for a good night's sleep.",
    "Explain photosynthesis in one paragraph.", "Write a haiku about the sea.",
    "How do I boil an egg?", "Why is the sky blue?", "What is a prime number?",
    "Suggest a name for a friendly robot.", "How far away is the Moon?",
    "What does a compiler do?", "Describe a cat to someone who has never seen one.",
    "List four fruits that are red.", "What is the difference between weather and climate?",
    "How do vaccines work?", "Tell me a fun fact about octopuses.", "What is recursion?",
]
SCHEDULERS = ("static", "continuous")
ROWS = [  # (label, summary key, format, scale)
    ("tokens/s", "throughput_tok_s", "{:.1f}", 1),
    ("requests/s", "requests_per_s", "{:.2f}", 1),
    ("p50 TTFT (ms)", "p50_ttft_s", "{:.0f}", 1000),
    ("p99 TTFT (ms)", "p99_ttft_s", "{:.0f}", 1000),
    ("mean TPOT (ms)", "mean_tpot_s", "{:.1f}", 1000),
    ("mean e2e (s)", "mean_e2e_s", "{:.2f}", 1),
    ("slot utilisation", "slot_utilisation", "{:.0%}", 1),
    ("steps", "steps", "{:d}", 1),
]


def demo_workload(num_requests: int = 24, mean_new_tokens: int = 16, max_new_tokens: int = 64,
                  seed: int = 0) -> list[WorkloadRequest]:
    """Chat requests all arriving at t=0, output lengths ~ exponential(mean), clipped to [1, max]."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.ceil(rng.exponential(mean_new_tokens, num_requests)), 1, max_new_tokens).astype(int)
    return [WorkloadRequest(0.0, [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                            SamplingParams(max_new_tokens=int(n), ignore_eos=True))
            for i, n in enumerate(lengths)]


@dataclass
class Comparison:
    """Both runs of one workload: reports and output token ids per scheduler (in workload order)."""

    reports: dict[str, RunReport]
    outputs: dict[str, list[list[int]]]
    model: str
    max_batch_size: int

    @property
    def mismatches(self) -> list[int]:
        """Indices of the requests whose tokens differ between the two runs (empty: identical)."""
        static, continuous = (self.outputs[s] for s in SCHEDULERS)
        return [i for i, (a, b) in enumerate(zip(static, continuous)) if a != b]

    @property
    def identical(self) -> bool:
        return len(self.outputs["static"]) == len(self.outputs["continuous"]) and not self.mismatches

    def summaries(self) -> dict[str, dict]:
        return {name: report.summary() for name, report in self.reports.items()}


def run_workload(workload: list[WorkloadRequest], config: EngineConfig, use_tqdm: bool = True):
    """Serve a workload on a fresh engine; returns (report, output token ids in workload order)."""
    llm = LLM(config)
    llm.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2), use_tqdm=False)  # warm-up, not measured
    report = llm.run(workload, use_tqdm=use_tqdm)
    outputs = [list(llm.engine.requests[r.request_id].output_token_ids) for r in report.requests]
    del llm
    gc.collect()                                           # one model in memory at a time
    return report, outputs


def compare(workload: list[WorkloadRequest], model: str = "smollm2-135m", max_batch_size: int = 8,
            use_tqdm: bool = True, **config_fields) -> Comparison:
    """Run the workload under static, then continuous batching, with the same engine settings."""
    reports, outputs = {}, {}
    for scheduler in SCHEDULERS:
        config = EngineConfig(model=model, scheduler=scheduler, max_batch_size=max_batch_size, **config_fields)
        reports[scheduler], outputs[scheduler] = run_workload(workload, config, use_tqdm)
    return Comparison(reports, outputs, model, max_batch_size)


def table(comparison: Comparison) -> str:
    """The side-by-side table: one row per metric, a column per scheduler, and their ratio."""
    summaries = comparison.summaries()
    lines = [f"{'':18}{'static':>12}{'continuous':>12}{'cont/static':>13}"]
    for label, key, fmt, scale in ROWS:
        values = [summaries[s][key] for s in SCHEDULERS]
        cells = ["-" if v is None else fmt.format(v * scale if scale != 1 else v) for v in values]
        ratio = f"{values[1] / values[0]:.2f}x" if None not in values and values[0] else "-"
        lines.append(f"{label:18}{cells[0]:>12}{cells[1]:>12}{ratio:>13}")
    return "\n".join(lines)


def verdict(comparison: Comparison) -> str:
    """One line saying whether both schedulers produced the same tokens."""
    outputs = comparison.outputs["static"]
    if comparison.identical:
        return (f"outputs identical: yes, all {len(outputs)} requests, "
                f"{sum(map(len, outputs))} tokens (greedy decoding)")
    return (f"outputs identical: NO, {len(comparison.mismatches)} of {len(outputs)} requests differ "
            f"(workload indices {comparison.mismatches[:10]})")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1, or an error naming the value."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: an integer >= 1")
    return int(text)


def add_arguments(parser) -> None:
    parser.add_argument("--model", default="smollm2-135m", help="model name or folder (default: %(default)s)")
    parser.add_argument("--requests", type=positive_int, default=24, help="number of requests (default: %(default)s)")
    parser.add_argument("--batch-size", type=positive_int, default=8, help="max_batch_size of both runs (default: %(default)s)")
    parser.add_argument("--mean-tokens", type=positive_int, default=16, help="mean output length (default: %(default)s)")
    parser.add_argument("--max-tokens", type=positive_int, default=64, help="longest output (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the output lengths (default: %(default)s)")


def main(args) -> int:
    workload = demo_workload(args.requests, args.mean_tokens, args.max_tokens, args.seed)
    lengths = [w.params.max_new_tokens for w in workload]
    print(f"{args.requests} requests arriving at once on {args.model}, max_batch_size={args.batch_size}, "
          f"output lengths {min(lengths)}..{max(lengths)} tokens (mean {np.mean(lengths):.0f})")
    comparison = compare(workload, args.model, args.batch_size)
    print()
    print(table(comparison))
    print()
    print(verdict(comparison))
    return 0 if comparison.identical else 1
