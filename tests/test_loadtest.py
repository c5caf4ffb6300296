"""The load generator against the server on `tiny`, over loopback: open and closed loops, client-side
metrics that agree with the server's own, failures reported, and the command line."""
import argparse
import json

import pytest

from minibatch import EngineConfig, SamplingParams, WorkloadRequest
from minibatch.serving import loadtest
from minibatch.workloads.distributions import Fixed, Poisson, Uniform
from minibatch.serving.server import ServerThread
from minibatch.analysis.sla import SLA, evaluate
from minibatch.workloads import ClosedLoop, make_workload


@pytest.fixture(scope="module")
def server():
    with ServerThread(EngineConfig(model="tiny", max_batch_size=8, num_kv_blocks=128)) as running:
        yield running


def test_request_body_speaks_openai():
    chat = WorkloadRequest(0.0, [{"role": "user", "content": "hi"}], SamplingParams(max_new_tokens=5))
    path, body = loadtest.request_body(chat, "m")
    assert path == "/v1/chat/completions" and body["messages"] == chat.prompt and body["max_tokens"] == 5
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert not {"seed", "top_p", "top_k", "ignore_eos", "stop_token_ids"} & set(body)   # defaults are not sent
    ids = WorkloadRequest(1.0, [5, 6, 7], SamplingParams(seed=3, top_k=4, ignore_eos=True, stop_token_ids=(9,)))
    path, body = loadtest.request_body(ids, "m")
    assert path == "/v1/completions" and body["prompt"] == [5, 6, 7]
    assert (body["seed"], body["top_k"], body["ignore_eos"], body["stop_token_ids"]) == (3, 4, True, [9])


def test_open_loop_poisson(server):
    workload = make_workload(12, Poisson(rate=40.0), output_len=Uniform(3, 8), seed=1)
    before = len(server.engine.step_records)
    report = loadtest.run(server.url, workload, use_tqdm=False)
    assert report.errors == []
    s = report.summary()
    assert s["requests"] == 12 and s["failed"] == 0
    assert s["output_tokens"] == sum(w.params.max_new_tokens for w in workload)   # ignore_eos: every token asked for
    for r, w in zip(report.requests, workload):
        assert r.num_output_tokens == w.params.max_new_tokens and r.finish_reason == "length"
        assert 0 < r.ttft <= r.e2e and r.arrival_time >= 0
        assert r.tpot > 0                         # every step's token comes in a chunk, text or not
    assert len(report.itl) == s["output_tokens"] - 12           # one gap per token after the first
    served = sum(st.num_prefill_tokens for st in server.engine.step_records[before:])
    assert served == sum(r.num_prompt_tokens for r in report.requests)   # the prompt sizes the server reported


def test_closed_loop_never_exceeds_its_users(server):
    workload = make_workload(10, output_len=Fixed(4), seed=2)
    before = len(server.engine.step_records)
    report = loadtest.run(server.url, workload, closed_loop=ClosedLoop(users=2), use_tqdm=False)
    assert report.summary()["requests"] == 10
    batches = [st.batch_size for st in server.engine.step_records[before:]]
    assert max(batches) <= 2                                     # two users: never more than two in flight


def test_failures_are_reported_not_raised(server):
    good = WorkloadRequest(0.0, "fine", SamplingParams(max_new_tokens=3))
    too_long = WorkloadRequest(0.0, "x" * 1100, SamplingParams(max_new_tokens=3))   # beyond tiny's context
    report = loadtest.run(server.url, [good, too_long, good], use_tqdm=False)
    assert len(report.errors) == 1 and "HTTP 400" in report.errors[0] and "request 1" in report.errors[0]
    s = evaluate(report, SLA(ttft_s=1e6, tpot_s=1e6))
    assert s["requests"] == 2 and s["failed"] == 1 and s["sla_attainment"] == pytest.approx(2 / 3)


def test_same_summary_names_as_the_engine(server, tmp_path):
    from minibatch import LLM
    workload = make_workload(4, output_len=Fixed(3), seed=3)
    offline = LLM(EngineConfig(model="tiny", max_batch_size=8, num_kv_blocks=128)).run(workload, use_tqdm=False)
    over_http = loadtest.run(server.url, workload, use_tqdm=False)
    engine_names = set(offline.summary()) - {"steps", "mean_batch_size", "slot_utilisation", "preemptions"}
    assert engine_names <= set(over_http.summary())
    assert [r.num_output_tokens for r in over_http.requests] == [r.num_output_tokens for r in offline.requests]


def test_command_line(server, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    loadtest.add_arguments(parser)
    out = tmp_path / "result.json"
    args = parser.parse_args(["--url", server.url, "--num-requests", "3", "--output-len", "2", "--rate", "50",
                              "--json", str(out)])
    assert loadtest.main(args) == 0
    printed = capsys.readouterr().out
    assert "p99_ttft_s" in printed and "goodput_req_s" in printed and "SLA" in printed
    saved = json.loads(out.read_text())
    assert saved["summary"]["requests"] == 3 and len(saved["requests"]) == 3


def test_metrics_sampler_and_figures(server):
    from minibatch.serving.scrape import MetricsSampler, scrape
    from minibatch.viz import latency_vs_load, metrics_over_time

    before = scrape(server.url)
    workload = make_workload(6, Poisson(rate=30.0), output_len=Fixed(3), seed=4)
    with MetricsSampler(server.url, every_s=0.05) as sampler:
        report = loadtest.run(server.url, workload, use_tqdm=False)
    after = scrape(server.url)
    assert after["generation_tokens_total"] - before["generation_tokens_total"] == 18
    assert after["e2e_request_latency_seconds_count"] - before["e2e_request_latency_seconds_count"] == 6
    times, running = sampler.series("num_requests_running")
    assert len(times) >= 1 and times == sorted(times) and all(0 <= r <= 8 for r in running)
    fig = metrics_over_time({"30 req/s": sampler.samples}, max_batch_size=8)
    assert len(fig.axes) == 3 and all(len(ax.lines) >= 1 for ax in fig.axes)
    rows = [{"rate": 30.0, "where": "HTTP", **report.summary()}, {"rate": 10.0, "where": "HTTP", **report.summary()}]
    fig = latency_vs_load(rows, metrics=("p50_ttft_s", "p50_e2e_s"))
    assert len(fig.axes) == 2 and list(fig.axes[0].lines[0].get_xdata()) == [10.0, 30.0]
    with pytest.raises(KeyError, match="no field 'p77_s'"):
        latency_vs_load(rows, metrics=("p77_s",))


def test_first_token_without_text_counts_for_ttft(server):
    """A first token with no text (a special token) is timed as the first token, as the engine times it."""
    special = SamplingParams(max_new_tokens=4, ignore_eos=True, logit_bias={1: 100.0})   # <|im_start|>: no text
    report = loadtest.run(server.url, [WorkloadRequest(0.0, "Hi", special)], use_tqdm=False)
    (r,) = report.requests
    assert report.errors == [] and r.num_output_tokens == 4
    assert 0 < r.ttft < r.e2e and r.tpot > 0 and len(report.itl) == 3


def test_a_server_that_is_not_there_is_a_reported_failure():
    from minibatch.serving.child import free_port
    url = f"http://127.0.0.1:{free_port('127.0.0.1')}"                # nothing listens there
    request = WorkloadRequest(0.0, "Hi", SamplingParams(max_new_tokens=2))
    report = loadtest.run(url, [request], model="m", use_tqdm=False)
    assert report.summary()["failed"] == 1 and report.errors[0].startswith("request 0: ClientConnectorError")
