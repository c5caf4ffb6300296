"""The engine's metrics in Prometheus format, under the names vLLM uses (prefix `minibatch:`).

A dashboard built for vLLM (Grafana, an alert on `vllm:num_requests_waiting`) works here after
swapping the prefix. `EngineMetrics(engine)` owns its own `CollectorRegistry`, so several engines
in one process never mix their numbers, and subscribes to the engine's step observers:

- gauges read the engine's state when scraped: requests running and waiting, KV-cache usage
  (a fraction, 0 to 1, as vLLM's `kv_cache_usage_perc`);
- counters and histograms are updated after every step: prompt and generated tokens, tokens per
  step, preemptions, prefix-cache queries and hits (in tokens, as vLLM), and, per request, TTFT,
  time per output token, queue time and e2e latency.

Made after the engine has already served requests, it first replays the steps recorded so far,
so its counts are the engine's whole history. `exposition(engine)` returns the text a `/metrics`
endpoint serves (with media type `CONTENT_TYPE`). A dashboard reads a percentile off a histogram
the way Prometheus' `histogram_quantile` does: `histogram_buckets` and `histogram_quantile` here.
"""
from __future__ import annotations

import bisect
import weakref

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from minibatch.engine.records import StepRecord
from minibatch.engine.request import Request

PREFIX = "minibatch:"
CONTENT_TYPE = CONTENT_TYPE_LATEST
# bucket bounds as vLLM's (seconds, then tokens)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def _one_two_five(limit: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to limit (vLLM's buckets for token counts)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > limit:
                return out
            out.append(m * scale)
        scale *= 10


def tokens_of_step(request: Request, end: float) -> range:
    """Indices of the output tokens the request produced in the step that ended at `end` (empty if
    none; more than one when speculating). Token times are sorted, so two bisections find them."""
    return range(bisect.bisect_left(request.token_times, end), bisect.bisect_right(request.token_times, end))


class EngineMetrics:
    """Prometheus metrics of one engine, in a registry of their own."""

    def __init__(self, engine):
        self.engine = engine
        self.registry = CollectorRegistry()
        label = {"labelnames": ["model_name"], "registry": self.registry}
        model = engine.config.model

        def gauge(name, doc, read):
            Gauge(PREFIX + name, doc, **label).labels(model).set_function(read)

        def counter(name, doc):
            return Counter(PREFIX + name, doc, **label).labels(model)

        def histogram(name, doc, buckets):
            return Histogram(PREFIX + name, doc, buckets=buckets, **label).labels(model)

        gauge("num_requests_running", "Number of requests in model execution batches.", lambda: engine.num_running)
        gauge("num_requests_waiting", "Number of requests waiting to be processed.", lambda: engine.num_waiting)
        gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", lambda: engine.kv_usage)
        self.preemptions = counter("num_preemptions", "Cumulative number of preemption from the engine.")
        self.prefix_cache_queries = counter("prefix_cache_queries",
                                            "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_cache_hits = counter("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.prompt_tokens = counter("prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("generation_tokens", "Number of generation tokens processed.")
        self.success = Counter(PREFIX + "request_success", "Count of successfully processed requests.",
                               labelnames=["model_name", "finished_reason"], registry=self.registry)
        self.model_name = model
        token_buckets = _one_two_five(engine.max_model_len)
        self.request_prompt_tokens = histogram("request_prompt_tokens", "Number of prefill tokens processed.",
                                               token_buckets)
        self.request_generation_tokens = histogram("request_generation_tokens",
                                                   "Number of generation tokens processed.", token_buckets)
        self.iteration_tokens = histogram("iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                                          ITERATION_TOKEN_BUCKETS)
        self.ttft = histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.tpot = histogram("time_per_output_token_seconds", "Histogram of time per output token in seconds.",
                              TPOT_BUCKETS)
        self.request_tpot = histogram("request_time_per_output_token_seconds",
                                      "Histogram of the mean time per output token of each request in seconds.",
                                      TPOT_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             REQUEST_LATENCY_BUCKETS)
        self.queue_time = histogram("request_queue_time_seconds",
                                    "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS)
        for record in list(engine.step_records):   # the history before we subscribed
            self.observe_step(record)
        engine.step_observers.append(self.observe_step)

    def observe_step(self, record: StepRecord, finished: list[Request] | None = None) -> None:
        """Count what one step did; called by the engine after each step."""
        in_step = [self.engine.requests[rid] for rid, phase in record.slots.values() if phase != "held"]
        produced = {r.request_id: tokens_of_step(r, record.end) for r in in_step}
        self.preemptions.inc(record.num_preempted)
        self.prefix_cache_queries.inc(record.prefix_cache_queries)
        self.prefix_cache_hits.inc(record.prefix_cache_hits)
        self.prompt_tokens.inc(record.num_prefill_tokens)
        self.generation_tokens.inc(sum(len(p) for p in produced.values()))
        self.iteration_tokens.observe(record.num_prefill_tokens + record.num_decode_tokens)
        for r in in_step:
            new = produced[r.request_id]
            if 0 in new:
                self.ttft.observe(r.first_token_time - r.arrival_time)
            for i in new[1:] if 0 in new else new:
                self.tpot.observe(r.token_times[i] - r.token_times[i - 1])
            if r.is_finished and r.finish_time == record.end:
                self.observe_finished(r)

    def observe_finished(self, r: Request) -> None:
        self.success.labels(self.model_name, r.finish_reason).inc()
        self.e2e.observe(r.finish_time - r.arrival_time)
        if r.first_scheduled_time is not None:
            self.queue_time.observe(r.first_scheduled_time - r.arrival_time)
        self.request_prompt_tokens.observe(len(r.prompt_token_ids))
        self.request_generation_tokens.observe(len(r.output_token_ids))
        if len(r.token_times) > 1:
            self.request_tpot.observe((r.token_times[-1] - r.token_times[0]) / (len(r.token_times) - 1))

    def exposition(self) -> str:
        """The Prometheus text exposition of every metric, as served at /metrics."""
        return generate_latest(self.registry).decode()

    def close(self) -> None:
        """Stop counting (the gauges still read the engine when scraped)."""
        if self.observe_step in self.engine.step_observers:
            self.engine.step_observers.remove(self.observe_step)


_by_engine: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def engine_metrics(engine) -> EngineMetrics:
    """The EngineMetrics of an engine (an `LLMEngine` or an `LLM`), made on first use."""
    engine = getattr(engine, "engine", engine)
    if engine not in _by_engine:
        _by_engine[engine] = EngineMetrics(engine)
    return _by_engine[engine]


def exposition(engine) -> str:
    """The Prometheus text of an engine's (or an LLM's) metrics, for a /metrics endpoint."""
    return engine_metrics(engine).exposition()


def histogram_buckets(text: str, name: str) -> list[tuple[float, float]]:
    """[(upper bound, cumulative count), ...] of histogram `name` (e.g. "minibatch:time_to_first_token_seconds")
    in an exposition text, by increasing bound, the last bound +inf."""
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return sorted((float(s.labels["le"]), s.value) for s in family.samples if s.name == name + "_bucket")
    raise KeyError(f"no histogram {name!r} in the exposition")


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """The q-quantile (0 < q <= 1) estimated from cumulative buckets, as Prometheus does: find the
    bucket holding rank q * count and interpolate linearly inside it (the first bucket starts at 0);
    a rank in the +inf bucket gives the highest finite bound; no observations give nan."""
    if not 0 < q <= 1:
        raise ValueError(f"q={q!r} is not allowed: a number in (0, 1], e.g. 0.99 for p99")
    total = buckets[-1][1]
    if total == 0:
        return float("nan")
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound
