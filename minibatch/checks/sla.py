"""Chapter 11 (batching configuration and SLAs): latency percentiles and picking a configuration that meets an SLA."""

import numpy as np

from minibatch.checks.core import Case, check_cases, checker


def _simulated_requests():
    """(arrival_time, token_times, the engine's RequestMetrics) of requests served on the simulated clock."""
    from minibatch.config import EngineConfig
    from minibatch.llm import LLM
    from minibatch.engine.records import RequestMetrics
    from minibatch.workloads import Poisson, Uniform, make_workload

    llm = LLM(EngineConfig(model="tiny", clock="simulated", sim_skip_model=True, max_batch_size=4))
    llm.run(make_workload(24, Poisson(rate=3.0), output_len=Uniform(1, 12), seed=10), use_tqdm=False)
    return [(r.arrival_time, list(r.token_times), RequestMetrics.of(r)) for r in llm.engine.requests.values()]


@checker("request_latencies(arrival_time, token_times) and percentile(values, q)")
def check_latency_metrics(request_latencies, percentile):
    cases = [Case((0.0, [0.5]), (0.5, None, 0.5)),                     # one token: TPOT is not defined
             Case((1.0, [1.25, 1.5, 2.0]), (0.25, 0.375, 1.0)),
             Case((2.0, [2.0, 2.0]), (0.0, 0.0, 0.0))]
    cases += [Case((arrival, times), (m.ttft, m.tpot, m.e2e)) for arrival, times, m in _simulated_requests()]
    three, one = request_latencies(1.0, [1.25, 1.5, 2.0]), request_latencies(0.0, [0.5])
    if isinstance(three, tuple) and len(three) == 3 and three[1] == 0.25:
        raise AssertionError("for tokens at 1.25, 1.5 and 2.0 s your TPOT is 0.25 s, (2.0 - 1.25) / 3: three tokens have "
                             "two gaps between them, so divide by len(token_times) - 1")
    if isinstance(one, tuple) and len(one) == 3 and one[1] is not None:
        raise AssertionError(f"a one-token answer has no gap between tokens, so no TPOT: return None, not {one[1]!r}")
    spread = [5.0, 1.0, 4.0, 2.0, 3.0]
    if percentile(list(spread), 90) == 2.6:
        raise AssertionError("percentile([5, 1, 4, 2, 3], 90) came back as 2.6: sort the values before finding the "
                             "position (n - 1) * q / 100")
    if percentile(list(spread), 90) == 5.0:
        raise AssertionError("percentile([5, 1, 4, 2, 3], 90) came back as 5.0, the nearest rank: the position is "
                             "(5 - 1) * 0.9 = 3.6, so interpolate between the 4th and 5th smallest: 4.6")
    count = check_cases(request_latencies, cases)
    rng = np.random.default_rng(10)
    samples = [[3.0], [1.0, 2.0], [5.0, 1.0, 4.0, 2.0, 3.0]]
    samples += [rng.exponential(1.0, int(rng.integers(2, 300))).round(4).tolist() for _ in range(6)]
    return count + check_cases(percentile, [Case((values, q), float(np.percentile(values, q)))
                                            for values in samples for q in (0, 50, 90, 99, 100)])


def _sweep_rows() -> list[dict]:
    """A small sweep on the simulated clock: one row (knobs + summary) per configuration."""
    from minibatch.config import EngineConfig
    from minibatch.llm import LLM
    from minibatch.workloads import Poisson, Uniform, make_workload

    workload = make_workload(40, Poisson(rate=4.0), output_len=Uniform(4, 32), seed=11)
    rows = []
    for size in (1, 2, 4, 8, 16):
        for timeout in (0.0, 0.5):
            llm = LLM(EngineConfig(model="tiny", clock="simulated", sim_skip_model=True, max_batch_size=size,
                                   batch_timeout_s=timeout))
            rows.append({"max_batch_size": size, "batch_timeout_s": timeout, **llm.run(workload, use_tqdm=False).summary()})
    return rows


def _pick_reference(rows, limits):
    good = [r for r in rows if all(r[k] is not None and r[k] <= limit for k, limit in limits.items())]
    return max(good, key=lambda r: r["throughput_tok_s"]) if good else None   # max keeps the first of equals


@checker("pick_config(rows, limits)")
def check_pick_config(pick_config):
    rows = _sweep_rows()
    ttft, tpot = sorted(r["p99_ttft_s"] for r in rows), sorted(r["p99_tpot_s"] for r in rows)
    limit_sets = [{"p99_ttft_s": t, "p99_tpot_s": p} for t in (ttft[1], ttft[5], ttft[-1]) for p in (tpot[0], tpot[4], tpot[-1])]
    limit_sets += [{"p99_e2e_s": sorted(r["p99_e2e_s"] for r in rows)[3]}, {"p99_ttft_s": ttft[0] / 2}]
    cases = [Case((rows, limits), _pick_reference(rows, limits)) for limits in limit_sets]
    hand = [{"name": "a", "p99_ttft_s": 0.5, "throughput_tok_s": 10.0}, {"name": "b", "p99_ttft_s": 2.0, "throughput_tok_s": 30.0},
            {"name": "c", "p99_ttft_s": 0.9, "throughput_tok_s": 10.0}]
    cases += [Case((hand, {"p99_ttft_s": 1.0}), hand[0]),                # a and c tie: the first one
              Case((hand, {"p99_ttft_s": 2.0}), hand[1]),                # exactly at the limit meets it
              Case((hand, {"p99_ttft_s": 0.1}), None), Case(([], {"p99_ttft_s": 1.0}), None)]
    picked = pick_config(list(hand), {"p99_ttft_s": 1.0})
    if picked == hand[1]:
        raise AssertionError("with a p99 TTFT limit of 1.0 s you picked row 'b', the fastest, whose p99 TTFT is 2.0 s: "
                             "only rows within every limit count")
    if picked == hand[2]:
        raise AssertionError("rows 'a' and 'c' both meet the limit at 10 tokens/s and you picked 'c': of equally fast "
                             "rows, the first in the list wins (compare with >, not >=)")
    if pick_config(list(hand), {"p99_ttft_s": 2.0}) != hand[1]:
        raise AssertionError("with a limit of 2.0 s row 'b' (p99 TTFT exactly 2.0 s, 30 tokens/s) meets it: a value "
                             "equal to the limit is within it (<=)")
    return check_cases(pick_config, cases)
