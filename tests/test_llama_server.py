"""llama.cpp's `llama-server` beside minibatch's server: the knob map from EngineConfig to its command line,
found where the bench finds peers, and a clean absence with the install command when it is not built (CI
never builds it). With it built (`make peer-llamaserver`), one short load test against it."""
import pytest

from minibatch.bench.peers import llama_server
from minibatch.bench.peers.external import install_hint
from minibatch.config import EngineConfig
from minibatch.serving.child import ChildServer


def pairs(flags: list[str]) -> dict[str, str]:
    return {flag: value for flag, value in zip(flags, flags[1:] + [""]) if flag.startswith("-")}


def test_knobs_map_to_llama_server_flags(tmp_path):
    gguf = tmp_path / "model.gguf"
    flags = llama_server.llama_server_flags(EngineConfig(max_batch_size=12, max_tokens_per_step=256,
                                                         max_model_len=1024), gguf, 3, "127.0.0.1", 8123)
    p = pairs(flags)
    assert p["-m"] == str(gguf) and p["-np"] == "12" and p["-c"] == str(12 * 1024)   # a slot holds one sequence
    assert "--kv-unified" in flags                      # one KV pool shared by the slots, as minibatch's
    assert p["-b"] == p["-ub"] == "256" and p["-t"] == p["-tb"] == "3"
    assert p["--host"] == "127.0.0.1" and p["--port"] == "8123" and p["--alias"] == "smollm2-135m"


def test_edge_mode_maps_to_one_slot_and_a_step_holds_every_slot():
    flags = llama_server.llama_server_flags(EngineConfig(scheduler="edge", max_batch_size=8, max_model_len=512),
                                            "m.gguf", 1, "127.0.0.1", 1)
    assert pairs(flags)["-np"] == "1" and pairs(flags)["-c"] == "512"
    assert pairs(llama_server.llama_server_flags(EngineConfig(max_batch_size=32, max_tokens_per_step=8),
                                                 "m.gguf", 1, "127.0.0.1", 1))["-b"] == "32"


def test_other_models_and_formats_are_refused_by_name():
    with pytest.raises(ValueError, match="model='tiny'"):
        llama_server.llama_server_flags(EngineConfig(model="tiny"), "m.gguf", 1, "127.0.0.1", 1)
    with pytest.raises(ValueError, match="fmt='q8_0'.*f32, q4_1"):
        llama_server.served_gguf("q8_0", 1)


def test_the_server_is_started_on_loopback_with_the_mapped_command(tmp_path, monkeypatch):
    executable = tmp_path / "llamaserver" / "bin" / "llama-server"
    executable.parent.mkdir(parents=True)
    executable.write_text("#!/bin/sh\n")
    executable.chmod(0o755)
    monkeypatch.delenv("MINIBATCH_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("MINIBATCH_PEERS", str(tmp_path))
    assert llama_server.llama_server_executable() is None           # built but not finished installing
    (tmp_path / "llamaserver" / ".installed").touch()
    assert llama_server.llama_server_executable() == executable
    started = {}
    monkeypatch.setattr(ChildServer, "__init__", lambda self, command, url, *rest: started.update(c=command, u=url))
    server = llama_server.LlamaServer(EngineConfig(max_batch_size=4, max_model_len=256, cpu_threads=2), fmt="q4_1")
    command = started["c"]
    assert command[0] == str(executable) and command[command.index("-m") + 1].endswith(".Q4_1.gguf")
    assert pairs(command)["--host"] == "127.0.0.1" and started["u"].startswith("http://127.0.0.1:")
    assert pairs(command)["-np"] == "4" and pairs(command)["-c"] == "1024" and pairs(command)["-t"] == "2"
    assert server.fmt == "q4_1"


def test_without_the_peers_the_shipped_q4_1_file_is_served(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIBATCH_PEERS", str(tmp_path))              # no llama.cpp peer to write the F32 copy
    monkeypatch.setattr(llama_server, "f32_gguf_path", lambda: tmp_path / "absent.F32.gguf")
    assert llama_server.default_format() == "q4_1"
    with pytest.raises(FileNotFoundError, match="make peer-llamacpp"):
        llama_server.served_gguf("f32", 1)
    (tmp_path / "absent.F32.gguf").touch()
    assert llama_server.default_format() == "f32" and llama_server.served_gguf("f32", 1).name == "absent.F32.gguf"


def test_without_llama_server_the_server_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.delenv("MINIBATCH_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("MINIBATCH_PEERS", str(tmp_path))
    assert llama_server.llama_server_executable() is None
    with pytest.raises(FileNotFoundError, match="make peer-llamaserver"):
        llama_server.LlamaServer(EngineConfig())


@pytest.mark.skipif(llama_server.llama_server_executable() is None, reason=install_hint("llamaserver"))
def test_llama_server_batches_requests_and_honours_the_output_length():
    from minibatch.serving import loadtest
    from minibatch.workloads import make_workload
    from minibatch.workloads.distributions import Fixed
    workload = make_workload(3, output_len=Fixed(6), seed=0)                  # all at once, EOS ignored
    with llama_server.LlamaServer(EngineConfig(max_batch_size=2, max_model_len=512, cpu_threads=1),
                                  fmt="q4_1") as server:
        report = loadtest.run(server.url, workload, use_tqdm=False)
    assert not report.errors and [r.num_output_tokens for r in report.requests] == [6, 6, 6]
