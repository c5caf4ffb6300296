"""Service-level agreements (SLA) and goodput: not how fast the server is, but how much of its work is good enough.

An `SLA` states limits on latency at a percentile, e.g. "p99 TTFT under 1 s and p99 TPOT under
100 ms": `SLA(ttft_s=1.0, tpot_s=0.1, percentile=99)`. A run meets it when, for every limited
metric, that percentile of the requests' values is within the limit.

Goodput (as in DistServe and vLLM's benchmarks) counts only the requests that were good enough:
requests per second whose own TTFT, TPOT and e2e latency are each within the limits. A server
can raise its throughput by batching harder while its goodput falls, because more requests
miss the SLA.
"""
from __future__ import annotations

from dataclasses import dataclass

from minibatch.config import ConfigError
from minibatch.analysis.metrics import RunReport, percentile
from minibatch.engine.records import RequestMetrics
from minibatch.validate import check_number

METRICS = ("ttft", "tpot", "e2e")


@dataclass(frozen=True)
class SLA:
    """Latency limits in seconds (None: no limit on that metric) at a percentile of the requests."""

    ttft_s: float | None = 1.0    # time to first token
    tpot_s: float | None = 0.1    # mean time per output token after the first
    e2e_s: float | None = None    # arrival to last token
    percentile: float = 99.0      # share of requests, in %, that must be within each limit

    def __post_init__(self):
        for name in ("ttft_s", "tpot_s", "e2e_s"):
            value = getattr(self, name)
            if value is not None:
                check_number("SLA", name, value, 0, strict=True, allowed="a number of seconds > 0, or None for no limit")
        check_number("SLA", "percentile", self.percentile, 0, strict=True, maximum=100)
        if self.limits() == {}:
            raise ConfigError("SLA() with every limit None is not allowed: set at least one of ttft_s, tpot_s, e2e_s")

    def limits(self) -> dict[str, float]:
        """{metric: limit} for the metrics this SLA limits."""
        return {m: getattr(self, f"{m}_s") for m in METRICS if getattr(self, f"{m}_s") is not None}

    def request_ok(self, r: RequestMetrics) -> bool:
        """Whether one request was good enough: finished, and each limited metric within its limit
        (TPOT is not defined for a one-token answer and then counts as met)."""
        if r.e2e is None:
            return False
        return all((getattr(r, m) is None and m == "tpot") or (getattr(r, m) is not None and getattr(r, m) <= limit)
                   for m, limit in self.limits().items())

    def tails(self, report: RunReport) -> dict[str, float | None]:
        """The percentile of each limited metric over the finished requests, e.g. {"ttft": p99 TTFT}."""
        done = [r for r in report.requests if r.e2e is not None]
        return {m: percentile([getattr(r, m) for r in done], self.percentile) for m in self.limits()}

    def met_by(self, report: RunReport) -> bool:
        """Whether a run meets the SLA: every request finished and every tail within its limit."""
        if any(r.e2e is None for r in report.requests):
            return False
        return all(t is None or t <= self.limits()[m] for m, t in self.tails(report).items())

    def describe(self) -> str:
        names = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "e2e"}
        return " and ".join(f"p{self.percentile:g} {names[m]} <= {limit * 1e3:g} ms" for m, limit in self.limits().items())


def goodput(report: RunReport, sla: SLA) -> float:
    """Requests per second that met the SLA's limits, over the run's duration."""
    good = sum(sla.request_ok(r) for r in report.requests)
    return good / report.duration if report.duration > 0 else 0.0


def evaluate(report: RunReport, sla: SLA) -> dict:
    """The run's summary, plus goodput, the share of good requests, each tail and whether the SLA is met."""
    s = report.summary()
    s["goodput_req_s"] = goodput(report, sla)
    s["sla_attainment"] = sum(sla.request_ok(r) for r in report.requests) / len(report.requests)
    s.update({f"sla_p{sla.percentile:g}_{m}_s": t for m, t in sla.tails(report).items()})
    s["sla_met"] = sla.met_by(report)
    return s
