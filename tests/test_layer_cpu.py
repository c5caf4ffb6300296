"""A decode step's layers as whole compiled calls compute what the layer run part by part computes."""
import numpy as np
import torch

from minibatch import LLM, EngineConfig, SamplingParams
from minibatch.engine.kernels import layer_cpu, numba_cpu, torch_ref

PROMPTS = ["The cat sat on", "Once upon a time, in a land far away,", "1, 2, 3,", "Paris is the capital of"]


def _engine(whole_layers: bool, **config):
    llm = LLM(EngineConfig(model="tiny", max_batch_size=8, max_model_len=128, **config))
    llm.engine.model.whole_layers = whole_layers
    return llm


def _steps_through_whole_layers(llm, monkeypatch) -> list[int]:
    """Rows of every forward that ran the compiled layers."""
    rows, run = [], layer_cpu.run_layers
    monkeypatch.setattr(layer_cpu, "run_layers", lambda x, *a, **k: rows.append(x.shape[0]) or run(x, *a, **k))
    return rows


def test_greedy_tokens_and_log_probabilities_equal_the_part_by_part_layers(monkeypatch):
    params = SamplingParams(max_new_tokens=12, ignore_eos=True, logprobs=3)
    whole, parts = _engine(True), _engine(False)
    rows = _steps_through_whole_layers(whole, monkeypatch)
    fast, slow = whole.generate(PROMPTS, params, use_tqdm=False), parts.generate(PROMPTS, params, use_tqdm=False)
    assert rows and set(rows) <= {1, 2, 3, 4}                     # the decode steps took it; the prefill did not
    for a, b in zip(fast, slow):
        assert a.token_ids == b.token_ids
        for got, want in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):   # {token: logprob}: top tokens, each step
            assert got.keys() == want.keys()
            assert np.allclose(list(got.values()), list(want.values()), atol=1e-4)


def test_silu_times_up_matches_torch():
    gate_up = torch.randn(3, 2 * 40, generator=torch.Generator().manual_seed(0)) * 4        # (T, 2 I)
    out = np.empty((3, 40), np.float32)
    layer_cpu._silu_mul(gate_up.numpy(), out)
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(torch.from_numpy(out), torch.nn.functional.silu(gate) * up, rtol=1e-6, atol=1e-6)


def test_only_float32_streamed_steps_with_the_numba_backend_take_it():
    model = _engine(True).engine.model
    assert layer_cpu.applies(model.layers, 1, numba_cpu) and layer_cpu.applies(model.layers, 12, numba_cpu)
    assert not layer_cpu.applies(model.layers, 13, numba_cpu)      # a prefill chunk: oneDNN's products
    assert not layer_cpu.applies(model.layers, 0, numba_cpu)
    assert not layer_cpu.applies(model.layers, 1, torch_ref)        # another attention backend
    quantized = _engine(True, quantization="q8_0").engine.model
    assert not layer_cpu.applies(quantized.layers, 1, numba_cpu)


def test_a_profiled_engine_runs_the_parts_it_times():
    llm = LLM(EngineConfig(model="tiny", max_model_len=64, profile_steps=True))
    assert llm.engine.model.whole_layers is False
    llm.generate(["hello"], SamplingParams(max_new_tokens=3), use_tqdm=False)
    record = llm.engine.step_records[-1]
    assert record.phase_times["mlp"] > 0 and record.phase_times["attention"] > 0


def test_a_changed_kernel_file_drops_the_cached_layer(tmp_path, monkeypatch):
    """Numba checks a cached function against its own file only; the layer compiles other files' kernels in."""
    flushed = []
    cache = type("Cache", (), {"cache_path": str(tmp_path / "cache"), "flush": lambda self: flushed.append(1)})()
    monkeypatch.setattr(layer_cpu._layer, "_cache", cache)
    layer_cpu.forget_stale_layer()                         # no stamp yet: compiled afresh, stamp written
    stamp = tmp_path / "cache" / "layer_cpu.callees.sha256"
    assert flushed == [1] and stamp.read_text() == layer_cpu.callees_digest()
    layer_cpu.forget_stale_layer()                         # nothing changed: the cached code stands
    assert flushed == [1]
    stamp.write_text("a digest of kernel files as they were before an edit")
    layer_cpu.forget_stale_layer()
    assert flushed == [1, 1] and stamp.read_text() == layer_cpu.callees_digest()
