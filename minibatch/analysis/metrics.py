"""What a run measured: the records of its requests and steps (`minibatch.engine.records`), and their summary,
over the whole run or per class of request (`class_tails`).

Latency names follow the serving literature and vLLM: queue time (arrival to first scheduled),
TTFT (arrival to first output token), TPOT (mean time between output tokens after the first),
e2e (arrival to finish). Slot utilisation is the share of `max_batch_size` slots that computed
something, averaged over steps.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from minibatch.config import ConfigError
from minibatch.engine.records import RequestMetrics, StepRecord


def percentile(values, q: float) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.percentile(values, q)) if values else None


def speculation_summary(steps: list[StepRecord]) -> dict:
    """Speculative decoding over some steps ({} if none drafted): the acceptance rate a (accepted draft
    tokens per draft position the target reached: all accepted ones plus each first rejection), the
    draft tokens proposed and the tokens produced per sequence per step (accepted + 1)."""
    outcomes = [o for st in steps for o in st.spec_outcomes]
    if not outcomes:
        return {}
    drafted = sum(d for d, _ in outcomes)
    accepted = sum(a for _, a in outcomes)
    reached = accepted + sum(1 for d, a in outcomes if a < d)
    return {"spec_acceptance_rate": accepted / reached,
            "spec_draft_tokens_per_step": drafted / len(outcomes),
            "spec_tokens_per_step": (accepted + len(outcomes)) / len(outcomes)}


@dataclass
class RunReport:
    """Per-request and per-step records of one run, and their summary."""

    requests: list[RequestMetrics]
    steps: list[StepRecord]
    max_batch_size: int
    start_time: float = 0.0

    @property
    def duration(self) -> float:
        ends = [r.arrival_time + r.e2e for r in self.requests if r.e2e is not None]
        return max(ends, default=self.start_time) - self.start_time

    def summary(self) -> dict:
        done = [r for r in self.requests if r.e2e is not None]
        duration = self.duration or float("nan")
        out_tokens = sum(r.num_output_tokens for r in done)
        s = {"requests": len(done), "output_tokens": out_tokens, "duration_s": duration,
             "throughput_tok_s": out_tokens / duration, "requests_per_s": len(done) / duration}
        for name in ("queue_time", "ttft", "tpot", "e2e"):
            vals = [getattr(r, name) for r in done]
            for q in (50, 90, 99):
                s[f"p{q}_{name}_s"] = percentile(vals, q)
            good = [v for v in vals if v is not None]
            s[f"mean_{name}_s"] = float(np.mean(good)) if good else None
        s["steps"] = len(self.steps)
        s["mean_batch_size"] = float(np.mean([st.batch_size for st in self.steps])) if self.steps else 0.0
        s["slot_utilisation"] = s["mean_batch_size"] / self.max_batch_size
        s["preemptions"] = sum(r.num_preemptions for r in done)
        queries = sum(st.prefix_cache_queries for st in self.steps)
        hits = sum(st.prefix_cache_hits for st in self.steps)
        s.update(prefix_cache_queries=queries, prefix_cache_hits=hits,
                 prefix_cache_hit_rate=hits / queries if queries else 0.0,
                 cached_tokens=sum(r.num_cached_tokens for r in done))
        s.update(speculation_summary(self.steps))
        return s

    def profile(self, decode_only: bool = True) -> dict:
        """Median seconds per step part and the overhead share, for runs with EngineConfig(profile_steps=True)."""
        from minibatch.analysis.profiler import profile_summary   # imported here: the profiler module imports torch
        return profile_summary(self.steps, decode_only)

    def memory(self, engine) -> dict:
        """Reserved versus used KV bytes, waste, most sequences in the cache at once (see minibatch.analysis.memory)."""
        from minibatch.analysis.memory import memory_report   # imported here: the memory module imports torch
        return memory_report(self, engine)

    def to_dict(self) -> dict:
        return {"summary": self.summary(), "requests": [asdict(r) for r in self.requests],
                "steps": [asdict(s) for s in self.steps]}


def class_tails(report: RunReport, classes: list[str], metric: str = "ttft",
                percentiles: tuple[float, ...] = (50, 99)) -> dict[str, dict[str, float | None]]:
    """{class: {"requests": n, "p50_ttft_s": ..., "p99_ttft_s": ..., "max_ttft_s": ...}} over the
    requests of each class (`classes` in the order of report.requests)."""
    if len(classes) != len(report.requests):
        raise ConfigError(f"classes has {len(classes)} entries for {len(report.requests)} requests: "
                          "give one per request")
    table = {}
    for kind in sorted(set(classes)):
        values = [getattr(r, metric) for r, k in zip(report.requests, classes) if k == kind]
        row = {"requests": len(values)}
        row.update({f"p{q:g}_{metric}_s": percentile(values, q) for q in percentiles})
        row[f"max_{metric}_s"] = max((v for v in values if v is not None), default=None)
        table[kind] = row
    return table
