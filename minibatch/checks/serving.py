"""Chapter 14 (serving over HTTP): utilisation and saturation read from two /metrics scrapes, and a prediction
of the mean and p99 wait of a one-slot server at 80 % load (M/D/1) against the simulated clock."""

import functools

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
    _name_the_mistake(read_load, hand)
    cases = [Case((b, a, size), expected) for b, a, size, expected in hand]
    cases += [Case((b, a, 4), expected) for b, a, expected in _served_with_metrics()]
    return check_cases(read_load, cases)


def _name_the_mistake(read_load, hand) -> None:
    """Raise a message naming the usual slips, recognised by their answers on the two hand-made scrapes."""
    first, second = (read_load(b, a, size) for b, a, size, _ in hand)
    near = lambda got, x: isinstance(got, (int, float)) and abs(got - x) <= 1e-6 * abs(x)      # noqa: E731
    if isinstance(first, dict) and near(first.get("saturation_req_s"), 8 / (3.5 / 2)):
        raise AssertionError("the saturation point counts the queue time as service: a request holds a slot only "
                             "from its start, so subtract request_queue_time_seconds_sum from the e2e sum")
    if isinstance(first, dict) and near(first.get("saturation_req_s"), 8 / 3.0):
        raise AssertionError("the saturation point divides by the total service seconds: Little's law needs the "
                             "mean time in service, the sum divided by the requests finished (the e2e _count)")
    if isinstance(second, dict) and near(second.get("utilisation"), 0.5):
        raise AssertionError("the utilisation uses the counters' totals since the server started: counters only "
                             "grow, so what happened between two scrapes is their difference, after minus before")


# ---- predict, then measure: the wait at 80 % load of a one-slot server (M/D/1) ----------------------

LOAD, REQUESTS, SEED = 0.8, 3000, 5                   # offered load (share of capacity), requests served, arrivals' seed
TOLERANCE = {"mean_wait_s": 0.15, "p99_wait_s": 0.25}  # relative


@functools.lru_cache(maxsize=4)   # deterministic: the checker and its tests reuse one run
def edge_waits(load: float = LOAD) -> dict:
    """A one-slot server (the edge scheduler) serving identical requests (32 prompt tokens, 8 output tokens) on
    the simulated clock: the service time S of one request alone, then REQUESTS Poisson arrivals at load / S:
    {"service_s", "mean_wait_s", "p99_wait_s"} (waits: time from arrival to the first step, the queue time)."""
    from minibatch.config import EngineConfig
    from minibatch.llm import LLM
    from minibatch.workloads import AllAtOnce, Fixed, Poisson, make_workload

    def serve(count, arrival):
        llm = LLM(EngineConfig(model="tiny", clock="simulated", sim_skip_model=True, scheduler="edge"))
        work = make_workload(count, arrival, output_len=Fixed(8), prompt_len=Fixed(32), tokenizer=llm.tokenizer,
                             seed=SEED)
        return llm.run(work, use_tqdm=False).requests

    service = serve(1, AllAtOnce())[0].e2e
    waits = np.array([r.queue_time for r in serve(REQUESTS, Poisson(rate=load / service))])
    return {"service_s": service, "mean_wait_s": float(waits.mean()), "p99_wait_s": float(np.percentile(waits, 99))}


@checker("predict_waits(service_s, load), against the simulated clock")
def check_predict_waits(predict_waits):
    from minibatch.analysis.queueing import pollaczek_khinchine_wait

    measured = edge_waits()
    s = measured["service_s"]
    got = predict_waits(s, LOAD)
    assert isinstance(got, dict) and set(TOLERANCE) <= got.keys(), (
        f"return {{'mean_wait_s': ..., 'p99_wait_s': ...}}, got {got!r}")
    md1 = pollaczek_khinchine_wait(LOAD, s)
    shown = (f"measured on the simulated clock: service {s:.3g} s, {REQUESTS} requests at {LOAD:.0%} load waited "
             f"{measured['mean_wait_s']:.3g} s on average ({measured['mean_wait_s'] / s:.2f} S; M/D/1 says "
             f"{md1 / s:.2f} S) and {measured['p99_wait_s']:.3g} s at the p99 ({measured['p99_wait_s'] / s:.2f} S)")
    print(shown)
    for name, tolerance in TOLERANCE.items():
        answer, want = got[name], measured[name]
        if isinstance(answer, (int, float)) and abs(answer - want) <= tolerance * want:
            continue
        near = lambda x: isinstance(answer, (int, float)) and abs(answer - x) <= 0.1 * x   # noqa: E731
        if name == "mean_wait_s" and near(2 * md1):
            why = ("that is M/M/1's wait (c² = 1): every request here needs the same work, so the service time "
                   "does not vary (c² = 0) and the Pollaczek-Khinchine wait is half of it")
        elif name == "p99_wait_s" and (near(got["mean_wait_s"]) or near(2 * got["mean_wait_s"])):
            why = (f"the wait has a long tail: most requests wait little ({1 - LOAD:.0%} not at all) and a few wait "
                   "many service times, so its p99 is several times its mean")
        else:
            why = ("start from the Pollaczek-Khinchine mean wait and think about the shape of the wait: a share "
                   "load of the requests waits at all")
        raise AssertionError(f"{name}: you predicted {answer!r}, expected {want:.3g} within {tolerance:.0%} "
                             f"({shown}): {why}")
    print("M/D/1 holds here because one slot serves identical requests one at a time: a batching server (the "
          "chapter's sweep) serves several at once, and only the 1 / (1 - load) shape of its wait carries over.")
