"""The batching panel, the SLA tuner panel and the live dashboard, driven headlessly: set a widget's
value (or click), then check what the panel computed."""
import matplotlib

matplotlib.use("Agg")

import pytest

from minibatch import LLM, EngineConfig, SamplingParams, WorkloadRequest
from minibatch.workloads.distributions import AllAtOnce, Fixed, Poisson
from minibatch.widgets import BatchingPanel, ChunkingPanel, Dashboard, TunerPanel
from minibatch.workloads import make_workload

SIM = {"model": "tiny", "clock": "simulated", "sim_skip_model": True}


@pytest.fixture
def panel():
    return BatchingPanel(model="tiny", num_requests=16, output_len=Fixed(12), rate=4.0, max_batch_size=4)


def test_batching_panel_sliders_have_stable_descriptions(panel):
    assert panel.batch_size_slider.description == "max batch size"
    assert panel.timeout_slider.description == "batch timeout (s)"
    assert panel.rate_slider.description == "arrival rate (req/s)"
    assert panel.scheduler_choice.description == "scheduler"


def test_batching_panel_runs_what_its_sliders_say(panel):
    panel.batch_size_slider.value = 2
    panel.timeout_slider.value = 0.3
    panel.rate_slider.value = 8.0
    config = EngineConfig(**SIM, max_batch_size=2, batch_timeout_s=0.3)
    expected = LLM(config).run(make_workload(16, arrival=Poisson(8.0), output_len=Fixed(12)), use_tqdm=False)
    assert panel.summary == expected.summary()
    assert panel.report.max_batch_size == 2 and max(s.batch_size for s in panel.report.steps) == 2


def test_batching_panel_batch_size_moves_throughput_and_the_table(panel):
    before, html, image = panel.summary, panel.metrics.value, panel.image.value
    panel.batch_size_slider.value = 1
    after = panel.summary
    assert after["mean_batch_size"] == 1.0 < before["mean_batch_size"]
    assert after["p50_ttft_s"] > before["p50_ttft_s"], "a batch of one makes requests queue"
    assert panel.metrics.value != html and panel.image.value != image and panel.image.value[:4] == b"\x89PNG"
    assert [row["max_batch_size"] for row in panel.history] == [4, 1]


def test_batching_panel_timeout_delays_a_lone_request(panel):
    panel.scheduler_choice.value = "static"
    panel.rate_slider.value = 0.5            # the first request arrives alone, long before a batch of 4 could
    assert panel.report.requests[0].queue_time == 0.0
    panel.timeout_slider.value = 0.5
    assert panel.report.requests[0].queue_time == pytest.approx(0.5)
    assert panel.history[-1]["batch_timeout_s"] == 0.5 and "static" in panel.metrics.value


def test_batching_panel_edge_mode_disables_the_batching_knobs(panel):
    panel.scheduler_choice.value = "edge"
    assert panel.batch_size_slider.disabled and panel.timeout_slider.disabled
    assert panel.summary["mean_batch_size"] == 1.0 and panel.history[-1]["max_batch_size"] == 1
    panel.scheduler_choice.value = "continuous"
    assert not panel.batch_size_slider.disabled


SPACE = {"max_batch_size": (1, 4, 16), "batch_timeout_s": (0.0, 0.5), "max_tokens_per_step": (64, 512)}


def test_tuner_panel_meets_a_loose_sla_and_follows_its_sliders():
    tuner = TunerPanel(model="tiny", num_requests=24, output_len=Fixed(16), rate=0.5, ttft_s=2.0, tpot_s=0.3,
                       space=SPACE)
    assert tuner.result.best.result["sla_met"] and "meets the SLA" in tuner.metrics.value
    assert tuner.image.value[:4] == b"\x89PNG"
    tuner.ttft_slider.value = 0.1
    tuner.tpot_slider.value = 0.02
    assert tuner.result.sla.ttft_s == 2.0, "sliders alone do not retune"
    tuner.tune_button.click()
    assert tuner.result.sla.ttft_s == 0.1 and tuner.result.sla.tpot_s == 0.02
    assert not tuner.result.best.result["sla_met"] and "no configuration meets the SLA" in tuner.metrics.value


def test_tuner_panel_front_is_undominated():
    tuner = TunerPanel(model="tiny", num_requests=24, output_len=Fixed(16), rate=3.0, space=SPACE)
    key, front = tuner.result.latency_key, tuner.result.pareto
    full = [t for t in tuner.result.trials if t.num_requests == 24]
    for t in front:
        assert not any(o.result["throughput_tok_s"] > t.result["throughput_tok_s"] and o.result[key] < t.result[key]
                       for o in full)


def small_workload(n=6, tokens=6):
    return [WorkloadRequest(0.0, [4 + i, 5, 6], SamplingParams(max_new_tokens=tokens, ignore_eos=True)) for i in range(n)]


def test_dashboard_updates_while_serving_and_ends_on_the_run_summary():
    llm = LLM(EngineConfig(**SIM, max_batch_size=2))
    dash = Dashboard(llm, refresh_s=0.0)                         # redraw after every step
    report = llm.run(small_workload(n=3, tokens=3), use_tqdm=False)
    summary = report.summary()
    assert dash.updates == len(report.steps) > 1, "the dashboard redraws during the run, not only at its end"
    snap = dash.snapshot
    assert snap["steps"] == len(report.steps) and snap["finished"] == 3
    assert snap["p99_ttft_s"] == summary["p99_ttft_s"] and snap["p50_tpot_s"] == summary["p50_tpot_s"]
    assert snap["mean_throughput_tok_s"] * snap["time_s"] == pytest.approx(summary["output_tokens"])
    assert snap["batch_size"] == report.steps[-1].batch_size and snap["queue_depth"] == 0
    assert "p99 TTFT (s)" in dash.numbers.value and dash.image.value[:4] == b"\x89PNG"


def test_dashboard_shows_queue_and_preemptions_under_pressure():
    llm = LLM(EngineConfig(**SIM, max_batch_size=4, num_kv_blocks=5))
    dash = Dashboard(llm, refresh_s=3600.0)                      # draws at the first step and when the engine drains
    report = llm.run(make_workload(8, arrival=AllAtOnce(), output_len=Fixed(20), prompts=["abcdefgh"]),
                     use_tqdm=False)
    assert dash.updates == 2
    assert dash.snapshot["preemptions"] == sum(s.num_preempted for s in report.steps) > 0
    assert max(s.queue_depth for s in dash.steps) >= 4


def test_dashboard_close_unsubscribes():
    llm = LLM(EngineConfig(**SIM))
    dash = Dashboard(llm, refresh_s=0.0)
    dash.close()
    assert dash.observe_step not in llm.engine.step_observers
    llm.run(small_workload(n=2), use_tqdm=False)
    assert dash.updates == 0 and dash.steps == []


def test_chunking_panel_trades_the_long_requests_ttft_for_the_decoders_waits():
    panel = ChunkingPanel(model="tiny", token_budget=1024, long_prompt_tokens=512)
    assert panel.budget_slider.description == "token budget"
    whole = panel.numbers
    panel.budget_slider.value = 64
    chunked = panel.numbers
    assert chunked["max_decode_wait_s"] < whole["max_decode_wait_s"] / 2
    assert chunked["long_ttft_s"] > whole["long_ttft_s"]
    assert max(s.num_prefill_tokens + s.num_decode_tokens for s in panel.report.steps) <= 64
    panel.prompt_slider.value = 768                              # tiny's context is 1024 tokens
    assert panel.numbers["long_ttft_s"] > chunked["long_ttft_s"] and "768" in panel.metrics.value
