"""The side-by-side run with vLLM: the knob map from EngineConfig to `vllm serve` flags, and a clean
absence when vLLM is not installed (CI never installs it)."""

import pytest

from minibatch.config import EngineConfig
from minibatch.bench.peers import vllm_server


def test_knobs_map_to_vllm_flags():
    flags = vllm_server.vllm_flags(EngineConfig(max_batch_size=12, max_tokens_per_step=256, block_size=32,
                                          max_model_len=1024, enable_prefix_caching=True))
    pairs = dict(zip(flags[1::2], flags[2::2]))
    assert pairs["--max-num-seqs"] == "12" and pairs["--max-num-batched-tokens"] == "256"
    assert pairs["--block-size"] == "32" and pairs["--max-model-len"] == "1024" and pairs["--dtype"] == "float32"
    assert "--enable-prefix-caching" in flags and flags[0].endswith("SmolLM2-135M-Instruct")


def test_edge_mode_maps_to_one_sequence_and_prefix_caching_off():
    flags = vllm_server.vllm_flags(EngineConfig(scheduler="edge", max_batch_size=8))
    assert flags[flags.index("--max-num-seqs") + 1] == "1" and "--no-enable-prefix-caching" in flags
    assert flags[flags.index("--block-size") + 1] == "32"       # 16 rounded up: vLLM-CPU takes multiples of 32


def test_other_models_are_refused_by_name():
    with pytest.raises(ValueError, match="model='tiny'"):
        vllm_server.vllm_flags(EngineConfig(model="tiny"))


def test_peers_installed_elsewhere_are_found_as_the_bench_finds_them(tmp_path, monkeypatch):
    monkeypatch.delenv("MINIBATCH_VLLM", raising=False)
    monkeypatch.setenv("MINIBATCH_PEERS", str(tmp_path))
    assert vllm_server.vllm_executable() is None                  # an empty folder of peers: no vLLM, not the repo's
    command = tmp_path / "vllm" / "bin" / "vllm"
    command.parent.mkdir(parents=True)
    command.write_text("#!/bin/sh\n")
    command.chmod(0o755)
    assert vllm_server.vllm_executable() == command


def test_without_vllm_there_is_no_executable_and_the_server_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIBATCH_VLLM", str(tmp_path / "no-vllm-here"))
    assert vllm_server.vllm_executable() is None
    with pytest.raises(FileNotFoundError, match="make peer-vllm"):
        vllm_server.VllmServer(EngineConfig())
