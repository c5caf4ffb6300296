"""Setup for a workshop: where torch comes from, installs from an offline wheelhouse, the model restored from it."""
import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from minibatch.engine.models import smollm2

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("torch_source", ROOT / "scripts" / "torch_source.py")
torch_source = importlib.util.module_from_spec(spec)
spec.loader.exec_module(torch_source)


def test_torch_source_prefers_the_cpu_index_on_linux_without_nvidia(monkeypatch):
    monkeypatch.setattr(torch_source, "has_nvidia_gpu", lambda: False)
    monkeypatch.setattr(torch_source, "reachable", lambda url: True)
    options, reason = torch_source.torch_source("", system="Linux")
    assert options == ["--extra-index-url", torch_source.CPU_INDEX]
    assert "CPU build" in reason


def test_torch_source_falls_back_to_the_plain_pin(monkeypatch):
    monkeypatch.setattr(torch_source, "has_nvidia_gpu", lambda: False)
    monkeypatch.setattr(torch_source, "reachable", lambda url: False)
    options, reason = torch_source.torch_source("", system="Linux")
    assert options == [] and "did not answer" in reason
    monkeypatch.setattr(torch_source, "reachable", lambda url: pytest.fail("a GPU machine must not probe"))
    monkeypatch.setattr(torch_source, "has_nvidia_gpu", lambda: True)
    assert torch_source.torch_source("", system="Linux")[0] == []
    assert torch_source.torch_source("", system="Darwin")[0] == []
    assert torch_source.torch_source("http://mirror/simple")[0] == ["--index-url", "http://mirror/simple"]


def test_an_unreachable_index_answers_false_quickly():
    assert torch_source.reachable("http://127.0.0.1:9/simple", timeout_s=1) is False  # the discard port


def make_dry_run(*args):
    """The commands `make -n -B venv ...` would run (nothing is executed)."""
    result = subprocess.run(["make", "-n", "-B", "venv", *args], cwd=ROOT, capture_output=True, text=True)
    return result.returncode, result.stdout + result.stderr


def test_a_wheelhouse_makes_every_install_offline(tmp_path):
    (tmp_path / "torch-2.13.0-cp311-cp311-linux_x86_64.whl").touch()
    (tmp_path / "model").mkdir()
    code, out = make_dry_run(f"WHEELHOUSE={tmp_path}")
    installs = [line for line in out.splitlines() if " install " in line]
    assert code == 0 and len(installs) == 4, out
    assert all(f"--no-index --find-links {tmp_path}" in line for line in installs), out
    assert "torch_source.py" not in out  # no index is probed either
    assert f"minibatch prepare --from {tmp_path}/model" in out


def test_without_a_wheelhouse_installs_go_online_and_an_empty_one_is_refused(tmp_path):
    code, out = make_dry_run("WHEELHOUSE=")
    assert code == 0 and "--no-index" not in out and "torch_source.py" in out, out
    code, out = make_dry_run(f"WHEELHOUSE={tmp_path}")
    assert f"WHEELHOUSE={tmp_path} holds no wheels" in out, out


def test_prepare_restores_a_converted_folder_instead_of_converting(tmp_path, monkeypatch):
    converted = tmp_path / "wheelhouse" / "model"
    converted.mkdir(parents=True)
    (converted / "config.json").write_text(json.dumps({"model_type": "llama"}))
    monkeypatch.setenv("MINIBATCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(smollm2, "convert_gguf", lambda *a: pytest.fail("must copy, not convert"))
    folder = smollm2.prepare_default_model(verbose=False, converted=converted)
    assert folder == tmp_path / "cache" / smollm2.CACHE_NAME
    assert json.loads((folder / "config.json").read_text()) == {"model_type": "llama"}
    with pytest.raises(FileNotFoundError, match="converted=.*no config.json"):
        monkeypatch.setenv("MINIBATCH_CACHE", str(tmp_path / "other"))
        smollm2.prepare_default_model(verbose=False, converted=tmp_path)
