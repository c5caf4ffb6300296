"""Chapter 12 (monitoring): a quantile from a Prometheus histogram, and a dashboard panel to debug whose
"p99 TPOT" mixes TPOT up with inter-token latency (`check_p99_tpot_panel`)."""

import functools

import numpy as np

from minibatch.checks.core import Case, NotSolved, check_cases, checker


def _served_histograms() -> list[list[tuple[float, float]]]:
    """Cumulative buckets of the TTFT, TPOT and e2e histograms of a simulated run of `tiny`."""
    from minibatch.config import EngineConfig
    from minibatch.workloads.distributions import Poisson, Uniform
    from minibatch.llm import LLM
    from minibatch.serving.monitoring import exposition, histogram_buckets
    from minibatch.workloads import make_workload

    llm = LLM(EngineConfig(model="tiny", clock="simulated", sim_skip_model=True, max_batch_size=8))
    llm.run(make_workload(60, arrival=Poisson(20.0), output_len=Uniform(2, 40), seed=11), use_tqdm=False)
    text = exposition(llm)
    return [histogram_buckets(text, f"minibatch:{name}") for name in
            ("time_to_first_token_seconds", "time_per_output_token_seconds", "e2e_request_latency_seconds")]


@checker("histogram_quantile(q, buckets)")
def check_histogram_quantile(histogram_quantile):
    from minibatch.serving.monitoring import histogram_quantile as reference

    inf = float("inf")
    hand = [(0.1, 2.0), (0.5, 6.0), (1.0, 8.0), (inf, 10.0)]
    cases = [Case((0.5, hand), 0.4),            # rank 5 lies in (0.1, 0.5]: 0.1 + 0.4 * (5 - 2) / (6 - 2)
             Case((0.1, hand), 0.05),           # rank 1 in the first bucket, which starts at 0
             Case((0.8, hand), 1.0),            # rank 8 is exactly the count up to 1.0
             Case((0.99, hand), 1.0),           # rank 9.9 is in the +inf bucket: the highest finite bound
             Case((0.5, [(1.0, 0.0), (2.0, 4.0), (inf, 4.0)]), 1.5)]   # an empty first bucket
    cases += [Case((q, buckets), reference(q, buckets)) for buckets in _served_histograms() for q in (0.5, 0.9, 0.99)]
    median, tail = histogram_quantile(0.5, list(hand)), histogram_quantile(0.99, list(hand))
    summed = [(bound, sum(count for _, count in hand[:i + 1])) for i, (bound, _) in enumerate(hand)]
    if median == 0.5:
        raise AssertionError("the median of [(0.1, 2), (0.5, 6), (1.0, 8), (inf, 10)] came back as 0.5, the upper "
                             "bound of its bucket: interpolate inside it, 0.1 + (0.5 - 0.1) * (5 - 2) / (6 - 2)")
    if tail == inf:
        raise AssertionError("q = 0.99 falls in the +inf bucket: nothing is known there, so answer the highest finite "
                             "bound (1.0 here), as Prometheus does, not infinity")
    if median == reference(0.5, summed):
        raise AssertionError("the counts are already cumulative (each includes every bucket below it): do not add "
                             "them up again; a bucket holds the observations between the previous count and its own")
    return check_cases(histogram_quantile, cases)


# ---- debugging: a dashboard panel whose "p99 TPOT" is the p99 of inter-token latency ----------------

def tpot_p99(requests) -> float | None:
    """The reference: p99 over requests of (last - first token time) / (tokens - 1), as RunReport.summary()."""
    from minibatch.analysis.metrics import percentile

    return percentile([(t[-1] - t[0]) / (len(t) - 1) for _, t in requests if len(t) > 1], 99)


def _p99(values):
    return float(np.percentile(values, 99)) if len(values) else None


PANEL_MISTAKES = {   # name: (what the mistake returns, what it mixed up)
    "inter-token latency": (lambda reqs: _p99([b - a for _, t in reqs for a, b in zip(t, t[1:])]),
                            "it equals the p99 of every gap between consecutive tokens: that is the inter-token "
                            "latency (ITL), one observation per token, so a long answer counts many times and a "
                            "single stall counts in full; TPOT is one number per request, its mean gap"),
    "TTFT included": (lambda reqs: _p99([(t[-1] - a) / len(t) for a, t in reqs]),
                      "it divides each request's whole e2e time by its tokens, so the queue wait and the prefill "
                      "(the TTFT) land in the TPOT: TPOT starts at the first token"),
    "n gaps": (lambda reqs: _p99([(t[-1] - t[0]) / len(t) for _, t in reqs if len(t) > 1]),
               "n tokens have n - 1 gaps between them: divide by len(token_times) - 1"),
    "one-token requests as 0": (lambda reqs: _p99([(t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else 0.0
                                                   for _, t in reqs]),
                                "a one-token request has no TPOT (no gap): leave it out instead of counting 0"),
    "longest gap": (lambda reqs: _p99([max(b - a for a, b in zip(t, t[1:])) for _, t in reqs if len(t) > 1]),
                    "each request's longest gap is its worst stall (max ITL), not its time per output token"),
    "mean": (lambda reqs: float(np.mean([(t[-1] - t[0]) / (len(t) - 1) for _, t in reqs if len(t) > 1])),
             "that is the mean TPOT over requests: the panel's SLA line is on the 99th percentile"),
}


@functools.lru_cache(maxsize=4)   # deterministic: the checker and its tests reuse one run
def _served_requests() -> list[tuple[str, list, float]]:
    """Two simulated runs of `tiny` with long prompts arriving among decodes (their prefills stall the
    running answers): (what, [(arrival_time, token_times)], the engine's p99_tpot_s)."""
    from minibatch.config import EngineConfig
    from minibatch.llm import LLM
    from minibatch.workloads import Poisson, Uniform, make_workload

    out = []
    for seed in (3, 4):
        llm = LLM(EngineConfig(model="tiny", clock="simulated", sim_skip_model=True, max_batch_size=8))
        work = make_workload(40, Poisson(rate=0.5), output_len=Uniform(16, 64), prompt_len=Uniform(8, 500),
                             tokenizer=llm.tokenizer, seed=seed)
        summary = llm.run(work, use_tqdm=False).summary()
        requests = [(r.arrival_time, list(r.token_times)) for r in llm.engine.requests.values()]
        out.append((f"a simulated run of 40 requests (seed {seed})", requests, summary["p99_tpot_s"]))
    return out


@checker("p99_tpot(requests), the dashboard panel, debugged")
def check_p99_tpot_panel(p99_tpot):
    hand = [(0.0, [1.0, 1.1, 1.2, 3.2, 3.3, 3.4, 3.5]), (0.5, [0.9, 1.0, 1.1]), (0.2, [2.0]), (1.0, [4.0, 4.5]),
            (0.0, [0.3, 0.35, 0.4, 0.45, 2.45, 2.5])]
    cases = [("a hand-made list of five requests, one of them a single token", hand, tpot_p99(hand))]
    cases += _served_requests()
    close = lambda a, b: (isinstance(a, (int, float)) and b is not None             # noqa: E731
                          and abs(a - b) <= 1e-6 + 1e-6 * abs(b))
    answers = [p99_tpot([(a, list(t)) for a, t in requests]) for _, requests, _ in cases]
    wrong = [(what, got, want) for (what, _, want), got in zip(cases, answers) if not close(got, want)]
    if not wrong:
        return len(cases)
    what, got, want = wrong[0]
    shown = f"on {what}: your panel says {got!r} s, the engine's p99 TPOT is {want:.4g} s"
    for name, (mistake, why) in PANEL_MISTAKES.items():        # the mistake that gives every one of your answers
        if all(close(answer, mistake(requests)) for (_, requests, _), answer in zip(cases, answers)):
            if name == "inter-token latency":
                raise NotSolved(f"{shown}: {why}")
            raise AssertionError(f"{shown}: {why}")
    raise AssertionError(f"{shown}: compute each request's TPOT, (last - first token time) / (tokens - 1), "
                         "then the 99th percentile over requests as numpy.percentile does")
