"""The playground panel driven headlessly (set a widget's value, check what it computed), and the
playground notebook served by Voilà as a standalone page."""
import matplotlib

matplotlib.use("Agg")

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from minibatch import LLM, EngineConfig
from minibatch.workloads.distributions import Fixed, Poisson
from minibatch.widgets import PlaygroundPanel
from minibatch.workloads import make_workload

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20
SIM = {"model": "tiny", "clock": "simulated", "sim_skip_model": True}
# tiny's KV cache costs 32 KiB a block of 16 tokens, so its budgets are fractions of a MiB
TINY = {"model": "tiny", "num_requests": 16, "output_len": Fixed(12), "rate": 4.0, "max_batch_size": 4,
        "kv_memory_mib": 2.0, "kv_range": (0.05, 4.0, 0.05)}


@pytest.fixture
def panel():
    return PlaygroundPanel(**TINY)


def test_playground_knobs_have_stable_descriptions(panel):
    assert panel.scheduler_choice.description == "scheduler"
    assert panel.batch_size_slider.description == "max batch size"
    assert panel.timeout_slider.description == "batch timeout (s)"
    assert panel.rate_slider.description == "arrival rate (req/s)"
    assert panel.kv_slider.description == "KV memory (MiB)"


def test_kv_memory_becomes_the_blocks_the_engine_itself_would_allocate(panel):
    for mib in (2.0, 0.5, 0.3):
        panel.kv_slider.value = mib
        engine = LLM(EngineConfig(**SIM, dtype="float32", kv_cache_memory_bytes=int(mib * MIB))).engine
        assert panel.num_kv_blocks == engine.blocks.num_blocks, mib
        assert f"{panel.num_kv_blocks} blocks" in panel.kv_blocks_label.value


def test_playground_runs_what_its_knobs_say(panel):
    panel.kv_slider.value = 0.5
    panel.batch_size_slider.value = 2
    panel.rate_slider.value = 8.0
    config = EngineConfig(**SIM, max_batch_size=2, num_kv_blocks=panel.num_kv_blocks)
    expected = LLM(config).run(make_workload(16, arrival=Poisson(8.0), output_len=Fixed(12)), use_tqdm=False)
    assert panel.summary == expected.summary()
    assert {s.kv_blocks_total for s in panel.report.steps} == {panel.num_kv_blocks}
    peak = max(s.kv_blocks_used for s in expected.steps)
    assert panel.report.steps[panel.peak_step].kv_blocks_used == peak == panel.history[-1]["peak_kv_blocks"]
    assert panel.history[-1]["peak_kv_usage"] == peak / panel.num_kv_blocks


def test_scheduler_changes_the_run_and_the_table(panel):
    before = panel.summary
    panel.scheduler_choice.value = "static"
    assert panel.config().scheduler == "static" and panel.history[-1]["scheduler"] == "static"
    assert panel.summary["mean_batch_size"] < before["mean_batch_size"], "static batches drain before refilling"
    assert [row["scheduler"] for row in panel.history] == ["continuous", "static"]
    assert "static" in panel.metrics.value and "peak KV use" in panel.metrics.value


def test_less_kv_memory_means_fewer_blocks_and_more_waiting(panel):
    roomy, roomy_blocks = panel.summary, panel.num_kv_blocks
    roomy_peak = panel.history[-1]["peak_kv_blocks"]
    image = panel.image.value
    panel.kv_slider.value = 0.3
    assert panel.num_kv_blocks < roomy_blocks and panel.num_kv_blocks < roomy_peak, "the budget must bind"
    assert panel.history[-1]["peak_kv_blocks"] <= panel.num_kv_blocks < roomy_peak
    tight = panel.summary
    assert tight["preemptions"] > roomy["preemptions"] or tight["mean_queue_time_s"] > roomy["mean_queue_time_s"]
    assert tight["p99_ttft_s"] > roomy["p99_ttft_s"]
    assert panel.image.value != image and panel.image.value[:4] == b"\x89PNG"


def test_edge_mode_disables_batch_size_and_timeout(panel):
    panel.scheduler_choice.value = "edge"
    assert panel.batch_size_slider.disabled and panel.timeout_slider.disabled and not panel.kv_slider.disabled
    assert panel.summary["mean_batch_size"] == 1.0 and panel.history[-1]["max_batch_size"] == 1
    panel.scheduler_choice.value = "continuous"
    assert not panel.batch_size_slider.disabled and not panel.timeout_slider.disabled


def test_too_little_kv_memory_gives_a_message_not_a_traceback(panel):
    runs = len(panel.history)
    panel.kv_slider.value = 0.1
    assert panel.report is None and panel.summary is None and len(panel.history) == runs
    assert "Too little KV memory" in panel.message.value and "can never fit" in panel.message.value
    assert f"{panel.num_kv_blocks} block" in panel.message.value and panel.image.layout.display == "none"
    panel.kv_slider.value = 2.0
    assert panel.message.value == "" and panel.summary is not None and panel.image.layout.display is None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_voila_serves_the_playground_notebook(tmp_path):
    voila = shutil.which("voila", path=str(Path(sys.executable).parent)) or shutil.which("voila")
    if voila is None:
        pytest.skip("voila is not installed: pip install -r requirements.txt")
    port, log = free_port(), tmp_path / "voila.log"
    with log.open("w") as err:
        server = subprocess.Popen([voila, "notebooks/playground.ipynb", "--no-browser", f"--port={port}",
                                   "--Voila.ip=127.0.0.1", "--show_tracebacks=True"],
                                  cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 60
        while True:                                  # the server is up when its port answers
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None, log.read_text()[-2000:]
                assert time.monotonic() < deadline, "voila did not open its port within 60 s"
                time.sleep(0.5)
        page = httpx.get(f"http://127.0.0.1:{port}/", timeout=300)   # Voilà runs the notebook, then answers
        assert page.status_code == 200
        assert "The playground: every knob at once" in page.text
        assert "application/vnd.jupyter.widget-view+json" in page.text, "no widget view in the page"
        assert "Traceback" not in page.text and "There was an error" not in page.text, "a cell failed"
    finally:
        server.terminate()
        server.wait(timeout=30)
