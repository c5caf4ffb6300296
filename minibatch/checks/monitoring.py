"""Chapter 12 (monitoring): a quantile from a Prometheus histogram."""

from minibatch.checks.core import Case, check_cases, checker


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
    return check_cases(histogram_quantile, cases)
