"""Prometheus export: names as vLLM's with a `minibatch:` prefix, values equal to what the engine did."""
import pytest
from prometheus_client.parser import text_string_to_metric_families

from minibatch import LLM, EngineConfig, SamplingParams, WorkloadRequest
from minibatch.serving.monitoring import EngineMetrics, engine_metrics, exposition, histogram_buckets, histogram_quantile


def samples(text: str) -> dict:
    """{(sample name, frozenset of labels other than model_name): value}."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = frozenset((k, v) for k, v in s.labels.items() if k != "model_name")
            out[(s.name, labels)] = s.value
    return out


def value(text: str, name: str, **labels) -> float:
    return samples(text)[(name, frozenset(labels.items()))]


def workload(n=6, max_new_tokens=5):
    return [WorkloadRequest(0.0, [3 + i] * (4 + 3 * i), SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True))
            for i in range(n)]


@pytest.fixture(scope="module")
def served():
    llm = LLM(EngineConfig(model="tiny", max_batch_size=4, num_kv_blocks=64))
    live = EngineMetrics(llm.engine)                 # subscribed before the run
    report = llm.run(workload(), use_tqdm=False)
    return llm, live, report


def test_counters_and_histograms_match_the_run(served):
    llm, live, report = served
    text = live.exposition()
    done = report.requests
    assert value(text, "minibatch:generation_tokens_total") == sum(r.num_output_tokens for r in done)
    assert value(text, "minibatch:prompt_tokens_total") == sum(r.num_prompt_tokens for r in done)  # no preemption
    assert value(text, "minibatch:request_success_total", finished_reason="length") == len(done)
    assert value(text, "minibatch:num_preemptions_total") == 0
    assert value(text, "minibatch:iteration_tokens_total_count") == len(report.steps)
    assert value(text, "minibatch:iteration_tokens_total_sum") == sum(
        s.num_prefill_tokens + s.num_decode_tokens for s in report.steps)
    for name, field in (("time_to_first_token_seconds", "ttft"), ("e2e_request_latency_seconds", "e2e"),
                        ("request_queue_time_seconds", "queue_time"),
                        ("request_time_per_output_token_seconds", "tpot")):
        assert value(text, f"minibatch:{name}_count") == len(done)
        assert value(text, f"minibatch:{name}_sum") == pytest.approx(sum(getattr(r, field) for r in done))
    # one observation per gap between consecutive tokens, summing to each request's decode time
    assert value(text, "minibatch:time_per_output_token_seconds_count") == sum(r.num_output_tokens - 1 for r in done)
    assert value(text, "minibatch:time_per_output_token_seconds_sum") == pytest.approx(
        sum(r.tpot * (r.num_output_tokens - 1) for r in done))


def test_histogram_buckets_count_the_requests_under_each_bound(served):
    _, live, report = served
    text = live.exposition()
    for bound in ("0.3", "1.0", "5.0", "+Inf"):
        expected = sum(r.e2e <= float(bound) for r in report.requests)
        assert value(text, "minibatch:e2e_request_latency_seconds_bucket", le=bound) == expected


def test_gauges_read_the_engine_state_after_a_run(served):
    llm, live, _ = served
    text = live.exposition()
    assert value(text, "minibatch:num_requests_running") == 0
    assert value(text, "minibatch:num_requests_waiting") == 0
    assert value(text, "minibatch:kv_cache_usage_perc") == 0.0


def test_gauges_follow_the_engine_mid_run():
    llm = LLM(EngineConfig(model="tiny", max_batch_size=2, num_kv_blocks=32))
    engine = llm.engine
    for w in workload(n=5):
        engine.add_request(w.prompt, w.params)
    engine.step()
    text = exposition(llm)
    assert value(text, "minibatch:num_requests_running") == len(engine.scheduler.running) == 2
    assert value(text, "minibatch:num_requests_waiting") == len(engine.scheduler.waiting) == 3
    assert value(text, "minibatch:kv_cache_usage_perc") == pytest.approx(engine.blocks.num_used_blocks / 32)
    assert value(text, "minibatch:kv_cache_usage_perc") > 0


def test_metrics_made_after_the_run_replay_its_history(served):
    llm, live, _ = served
    late = EngineMetrics(llm.engine)
    strip = lambda t: {k: v for k, v in samples(t).items() if not k[0].endswith("_created")}
    assert strip(late.exposition()) == strip(live.exposition())
    late.close()


def test_preemptions_are_counted():
    llm = LLM(EngineConfig(model="tiny", clock="simulated", sim_skip_model=True, max_batch_size=4, num_kv_blocks=5))
    report = llm.run(workload(n=6, max_new_tokens=20), use_tqdm=False)
    preempted = sum(s.num_preempted for s in report.steps)
    assert preempted > 0
    assert value(exposition(llm), "minibatch:num_preemptions_total") == preempted
    # recomputed prompts count again as prefill tokens, as in vLLM
    assert value(exposition(llm), "minibatch:prompt_tokens_total") == sum(s.num_prefill_tokens for s in report.steps)


def test_static_batching_held_slots_produce_nothing():
    llm = LLM(EngineConfig(model="tiny", scheduler="static", clock="simulated", sim_skip_model=True, max_batch_size=3))
    mixed = [WorkloadRequest(0.0, [5, 6, 7], SamplingParams(max_new_tokens=n, ignore_eos=True)) for n in (2, 9, 4)]
    report = llm.run(mixed, use_tqdm=False)
    assert any(phase == "held" for s in report.steps for _, phase in s.slots.values())
    text = exposition(llm)
    assert value(text, "minibatch:generation_tokens_total") == 15
    assert value(text, "minibatch:time_per_output_token_seconds_count") == 15 - 3


def test_each_engine_has_its_own_registry():
    a = LLM(EngineConfig(model="tiny", clock="simulated", sim_skip_model=True))
    b = LLM(EngineConfig(model="tiny", clock="simulated", sim_skip_model=True))
    a.run(workload(n=2), use_tqdm=False)
    assert engine_metrics(a) is engine_metrics(a.engine) and engine_metrics(a) is not engine_metrics(b)
    assert value(exposition(a), "minibatch:generation_tokens_total") == 10
    assert value(exposition(b), "minibatch:generation_tokens_total") == 0


def test_names_are_vllms_with_our_prefix(served):
    names = {f.name for f in text_string_to_metric_families(served[1].exposition())}
    for vllm_name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "num_preemptions",
                      "prompt_tokens", "generation_tokens", "request_success", "iteration_tokens_total",
                      "time_to_first_token_seconds", "time_per_output_token_seconds", "e2e_request_latency_seconds",
                      "request_queue_time_seconds", "request_prompt_tokens", "request_generation_tokens"):
        assert f"minibatch:{vllm_name}" in names


INF = float("inf")


@pytest.mark.parametrize("q, expected", [(0.5, 0.4), (0.1, 0.05), (0.8, 1.0), (0.99, 1.0), (1.0, 1.0)])
def test_histogram_quantile_interpolates_like_prometheus(q, expected):
    buckets = [(0.1, 2.0), (0.5, 6.0), (1.0, 8.0), (INF, 10.0)]
    assert histogram_quantile(q, buckets) == pytest.approx(expected)


def test_histogram_quantile_edges():
    assert histogram_quantile(0.5, [(1.0, 0.0), (INF, 0.0)]) != histogram_quantile(0.5, [(1.0, 0.0), (INF, 0.0)])  # nan
    with pytest.raises(ValueError, match="q=1.5"):
        histogram_quantile(1.5, [(1.0, 1.0), (INF, 1.0)])


def test_histogram_estimate_brackets_the_exact_percentile(served):
    _, live, report = served
    buckets = histogram_buckets(live.exposition(), "minibatch:e2e_request_latency_seconds")
    assert buckets[-1] == (INF, len(report.requests))
    estimate = histogram_quantile(0.5, buckets)
    exact = sorted(r.e2e for r in report.requests)[len(report.requests) // 2 - 1]    # rank 3 of 6
    bounds = [0.0] + [b for b, _ in buckets]
    home = next(i for i in range(1, len(bounds)) if exact <= bounds[i])
    assert bounds[home - 1] <= estimate <= bounds[home]
    with pytest.raises(KeyError, match="minibatch:nothing"):
        histogram_buckets(live.exposition(), "minibatch:nothing")
