"""Chapter 14 (serving over HTTP): utilisation and saturation read from two /metrics scrapes."""

import numpy as np

from minibatch.checks.core import Case, check_cases, checker


def _exposition(generated: int, steps: int, service: list[tuple[float, float]]) -> str:
    """Prometheus text of a server that produced `generated` tokens in `steps` steps and finished
    requests with these (queue time, e2e) pairs, under the names /metrics serves."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    registry = CollectorRegistry()
    label = {"labelnames": ["model_name"], "registry": registry}
    Counter("minibatch:generation_tokens", "tokens", **label).labels("m").inc(generated)
    per_step = Histogram("minibatch:iteration_tokens_total", "tokens per step", **label).labels("m")
    for _ in range(steps):
        per_step.observe(1)
    queue = Histogram("minibatch:request_queue_time_seconds", "queue", **label).labels("m")
    e2e = Histogram("minibatch:e2e_request_latency_seconds", "e2e", **label).labels("m")
    for q, total in service:
        queue.observe(q)
        e2e.observe(total)
    return generate_latest(registry).decode()


def _served_with_metrics() -> list[tuple[str, str, dict]]:
    """Two runs on the simulated clock, scraped around each: (before, after, the engine's own answer)."""
    from minibatch.config import EngineConfig
    from minibatch.llm import LLM
    from minibatch.serving.monitoring import engine_metrics
    from minibatch.workloads import Poisson, Uniform, make_workload

    llm = LLM(EngineConfig(model="tiny", clock="simulated", sim_skip_model=True, max_batch_size=4))
    metrics, out = engine_metrics(llm), []
    for rate, seed in ((2.0, 13), (40.0, 14)):
        before = metrics.exposition()
        report = llm.run(make_workload(16, Poisson(rate=rate), output_len=Uniform(2, 12), seed=seed), use_tqdm=False)
        tokens = sum(r.num_output_tokens for r in report.requests)
        service = [r.e2e - r.queue_time for r in report.requests]
        out.append((before, metrics.exposition(), {"utilisation": tokens / len(report.steps) / 4,
                                                   "saturation_req_s": 4 / float(np.mean(service))}))
    return out


@checker("read_load(before, after, max_batch_size)")
def check_read_load(read_load):
    """Utilisation (tokens per step / max_batch_size) and the saturation point (Little's law:
    max_batch_size / mean time in service) between two scrapes of /metrics."""
    empty = _exposition(0, 0, [])
    hand = [(empty, _exposition(80, 40, [(0.5, 2.5), (0.0, 1.0)]), 8, {"utilisation": 0.25, "saturation_req_s": 8 / 1.5}),
            (_exposition(10, 10, [(1.0, 3.0)]), _exposition(40, 20, [(1.0, 3.0), (0.25, 1.25), (0.75, 0.75)]), 4,
             {"utilisation": 0.75, "saturation_req_s": 4 / 0.5})]
    cases = [Case((b, a, size), expected) for b, a, size, expected in hand]
    cases += [Case((b, a, 4), expected) for b, a, expected in _served_with_metrics()]
    return check_cases(read_load, cases)
