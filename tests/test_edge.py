"""Edge mode: one request at a time in arrival order, with no batching wait; and the panel that
switches between it and a server batching the same arrivals."""
import pytest

from minibatch import LLM, EngineConfig, SamplingParams, WorkloadRequest
from minibatch.widgets import EdgeModePanel
from minibatch.workloads import make_workload
from minibatch.workloads.distributions import Fixed, Poisson


@pytest.fixture(scope="module")
def edge_report():
    workload = [WorkloadRequest(0.0, [5 + i, 6, 7, 8], SamplingParams(max_new_tokens=6, ignore_eos=True))
                for i in range(5)]
    llm = LLM(EngineConfig(model="tiny", scheduler="edge", max_batch_size=8, batch_timeout_s=5.0))
    return llm.run(workload, use_tqdm=False)


def test_edge_serves_one_request_at_a_time_in_arrival_order(edge_report):
    assert all(step.batch_size == 1 for step in edge_report.steps)
    reqs = edge_report.requests
    for before, after in zip(reqs, reqs[1:]):
        assert after.arrival_time + after.queue_time >= before.arrival_time + before.e2e  # starts once the last is done


def test_edge_ignores_the_batching_timeout(edge_report):
    first = edge_report.requests[0]
    assert first.queue_time < 5.0, "edge mode must not wait batch_timeout_s for a batch"


def test_edge_report_shows_per_token_latency_and_queueing(edge_report):
    s = edge_report.summary()
    assert s["mean_batch_size"] == 1.0 and s["p50_tpot_s"] > 0
    queues = [r.queue_time for r in edge_report.requests]
    assert queues[-1] > queues[0], "requests arriving together must queue behind each other"


def test_edge_mode_panel_switches_and_keeps_runs():
    workload = make_workload(8, arrival=Poisson(4.0), output_len=Fixed(12), seed=1)
    panel = EdgeModePanel(workload, model="tiny", max_batch_size=4)
    assert panel.switch.description == "edge mode" and panel.mode == "continuous"
    server, edge, server_image = panel.reports["continuous"], panel.reports["edge"], panel.image.value
    assert panel.summary == server.summary() and panel.summary["mean_batch_size"] > 1
    assert "edge (batch of one)" in panel.metrics.value and "server (batch 4)" in panel.metrics.value
    panel.switch.value = True
    assert panel.mode == "edge" and panel.summary["mean_batch_size"] == 1.0
    assert panel.summary["p50_queue_time_s"] > server.summary()["p50_queue_time_s"]
    assert panel.image.value[:4] == b"\x89PNG" and panel.image.value != server_image
    assert [r.arrival_time for r in edge.requests] == [r.arrival_time for r in server.requests], "same arrivals"
    panel.switch.value = False
    assert panel.reports["edge"] is edge and panel.image.value == server_image, "flipping back reruns nothing"


def test_edge_mode_has_one_slot_everywhere():
    """Edge mode is a batch of one for every part that counts slots, whatever max_batch_size says:
    the scheduler, the idle slots of each step, the KV pool's size and the report's slot utilisation."""
    workload = [WorkloadRequest(0.0, [5, 6, 7, 8], SamplingParams(max_new_tokens=6, ignore_eos=True)) for _ in range(3)]
    config = dict(model="tiny", max_batch_size=8, block_size=4, kv_cache_memory_bytes=1 << 30, max_model_len=64)
    edge = LLM(EngineConfig(scheduler="edge", **config))
    server = LLM(EngineConfig(scheduler="continuous", **config))
    report = edge.run(workload, use_tqdm=False)
    assert report.max_batch_size == 1 and report.summary()["slot_utilisation"] == 1.0
    assert all(step.idle_slots == 0 for step in report.steps)
    assert edge.engine.scheduler.max_batch_size == 1
    assert edge.engine.blocks.num_blocks == 64 // 4, "the pool holds one full-length sequence"
    assert server.engine.blocks.num_blocks == 8 * 64 // 4, "a server's pool holds max_batch_size of them"
