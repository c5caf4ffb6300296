"""A decode step's layers as whole compiled calls compute what the layer run part by part computes."""
import pathlib

import numpy as np
import pytest

from minibatch import LLM, EngineConfig, SamplingParams
from minibatch.engine.kernels import (bfloat16, codes16, fused_cpu, gemv_blocks_cpu, gemv_cpu, lanes, lanes16,
                                     layer_cpu, numba_cpu, pairs_bf16, quantized_groups_numba, quantized_numba)
from minibatch.engine.ops.crossover import STREAM_ROWS
from minibatch.engine.kernels.stale_cache import digest, forget_stale

PROMPTS = ["The cat sat on", "Once upon a time, in a land far away,", "1, 2, 3,", "Paris is the capital of"]


def _engine(whole_layers: bool, **config):
    """The fast path; whole_layers=False runs its layers part by part (the same kernels), as it does for steps
    whose products or attention the compiled layer cannot run."""
    llm = LLM(EngineConfig(**{"model": "tiny", "max_batch_size": 8, "max_model_len": 128, **config}))
    llm.engine.ops.whole_layers = whole_layers
    return llm


def _steps_through_whole_layers(llm, monkeypatch) -> list[int]:
    """Rows of every forward that ran the compiled layers."""
    rows, run = [], layer_cpu.run_layers
    monkeypatch.setattr(layer_cpu, "run_layers", lambda x, *a, **k: rows.append(x.shape[0]) or run(x, *a, **k))
    return rows


def _same_tokens_and_log_probabilities(whole, parts, monkeypatch, prompts=PROMPTS, tokens=12, atol=1e-4) -> list[int]:
    """Generate with both engines; return the row counts of the forwards that ran the compiled layers."""
    params = SamplingParams(max_new_tokens=tokens, ignore_eos=True, logprobs=3)
    rows = _steps_through_whole_layers(whole, monkeypatch)
    fast, slow = whole.generate(prompts, params, use_tqdm=False), parts.generate(prompts, params, use_tqdm=False)
    for a, b in zip(fast, slow):
        assert a.token_ids == b.token_ids
        for got, want in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):   # {token: logprob}: top tokens, each step
            assert got.keys() == want.keys()
            assert np.allclose(list(got.values()), list(want.values()), atol=atol)
    return rows


def test_greedy_tokens_and_log_probabilities_equal_the_part_by_part_layers(monkeypatch):
    rows = _same_tokens_and_log_probabilities(_engine(True), _engine(False), monkeypatch)
    assert 4 in rows and max(rows) <= STREAM_ROWS                 # the decode steps took it (a short prefill too)


@pytest.mark.parametrize("model", ["tiny", "smollm2-135m"])
def test_bfloat16_layers_compute_what_their_parts_compute(model, monkeypatch):
    """bfloat16 runs the same compiled layer (its arrays as bits): the same tokens, log-probabilities within
    SiLU's rounding (torch's exp and the kernel's round a few values to neighbouring bfloat16s)."""
    whole, parts = (_engine(flag, model=model, dtype="bfloat16") for flag in (True, False))
    assert whole.engine.attention_backend == "numba" and whole.engine.kernels == "fast"
    rows = _same_tokens_and_log_probabilities(whole, parts, monkeypatch, PROMPTS[:3], tokens=8, atol=0.05)
    assert 3 in rows and max(rows) <= STREAM_ROWS


@pytest.mark.parametrize("model,quantization", [("tiny", "q8_0"), ("smollm2-135m", "q4_1")])
def test_quantized_layers_compute_what_their_parts_compute(model, quantization, monkeypatch):
    """q8_0 and q4_1 blocks run through the same compiled layer, with their own products."""
    whole, parts = (_engine(flag, model=model, quantization=quantization) for flag in (True, False))
    assert whole.engine.model.layers[0]["qkv"].format == quantization
    rows = _same_tokens_and_log_probabilities(whole, parts, monkeypatch, PROMPTS[:2], tokens=8)
    assert 2 in rows and max(rows) <= STREAM_ROWS


def test_only_steps_of_a_few_rows_with_the_numba_backend_and_compiled_products_take_it():
    ops, model = (lambda llm: (llm.engine.ops, llm.engine.model))(_engine(True))
    assert ops.layer_operands(model.layers, 1) and ops.layer_operands(model.layers, STREAM_ROWS)
    assert ops.layer_operands(model.layers, STREAM_ROWS + 1) is None     # more rows: oneDNN's products
    assert ops.layer_operands(model.layers, 0) is None
    torch_attention = LLM(EngineConfig(model="tiny", max_model_len=128, attention_backend="torch")).engine
    assert torch_attention.kernels == "fast"                               # another attention backend: part by part
    assert torch_attention.ops.layer_operands(torch_attention.model.layers, 1) is None
    quantized = _engine(True, quantization="q8_0").engine                 # blocks, through the quantised kernels
    assert quantized.ops.layer_operands(quantized.model.layers, 1)
    assert quantized.ops.layer_operands(quantized.model.layers, STREAM_ROWS + 1) is None
    reference = LLM(EngineConfig(model="tiny", max_model_len=128, kernels="reference")).engine
    assert not hasattr(reference.ops, "layer_operands")                    # the reference never compiles a layer


def test_a_profiled_engine_runs_the_path_it_reports_and_times_its_parts():
    """Profiling never switches path: whole compiled layers still run, their parts are timed apart."""
    llm = LLM(EngineConfig(model="tiny", max_model_len=64, profile_steps=True))
    rows = []
    run = layer_cpu.run_layers
    layer_cpu.run_layers = lambda x, *a, **k: rows.append(x.shape[0]) or run(x, *a, **k)
    try:
        llm.generate(["hello"], SamplingParams(max_new_tokens=3), use_tqdm=False)
    finally:
        layer_cpu.run_layers = run
    record = llm.engine.step_records[-1]
    assert record.phase_times["mlp"] > 0 and record.phase_times["attention"] > 0
    described = llm.engine.profiler.describe()
    assert described["kernels"] == "fast" and described["whole_layer_steps"] == len(rows) > 0
    assert "apart" in described["parts"]


def test_a_changed_kernel_file_drops_the_cached_layer(tmp_path, monkeypatch):
    """Numba checks a cached function against its own file only; the layer compiles other files' kernels in."""
    flushed = []
    cache = type("Cache", (), {"cache_path": str(tmp_path / "cache"), "flush": lambda self: flushed.append(1)})()
    monkeypatch.setattr(layer_cpu._layer, "_cache", cache)
    forget_stale(layer_cpu._layer, layer_cpu.CALLEES)      # no stamp yet: compiled afresh, stamp written
    stamp = tmp_path / "cache" / "layer_cpu._layer.callees.sha256"
    assert flushed == [1] and stamp.read_text() == digest(layer_cpu.CALLEES)
    forget_stale(layer_cpu._layer, layer_cpu.CALLEES)      # nothing changed: the cached code stands
    assert flushed == [1]
    stamp.write_text("a digest of kernel files as they were before an edit")
    forget_stale(layer_cpu._layer, layer_cpu.CALLEES)
    assert flushed == [1, 1] and stamp.read_text() == digest(layer_cpu.CALLEES)


@pytest.mark.parametrize("kernel, callees", [
    (gemv_cpu._stream, (bfloat16, gemv_blocks_cpu, lanes, lanes16, pairs_bf16)),
    (gemv_cpu._task, (bfloat16, gemv_blocks_cpu, lanes, lanes16)),
    (pairs_bf16._pairs_product, (bfloat16, gemv_blocks_cpu, lanes, lanes16)),
    (pairs_bf16._task, (bfloat16, gemv_blocks_cpu, lanes, lanes16)),
    (numba_cpu._paged_attention, (bfloat16, lanes)), (numba_cpu._write_kv, (bfloat16, lanes)),
    (fused_cpu._rms_norm, (bfloat16, lanes)), (fused_cpu._rotary_write_kv, (bfloat16, lanes)),
    (fused_cpu._silu_mul, (bfloat16, lanes)),
    (quantized_numba._q4_1_into, (codes16, lanes, lanes16, quantized_groups_numba)),
    (quantized_numba._q8_0_many_into, (codes16, lanes, lanes16, quantized_groups_numba)),
    (quantized_groups_numba._q4_1_lanes_into, (codes16, lanes, lanes16)),
])
def test_each_cached_kernel_keeps_a_stamp_of_the_files_it_compiles_in(kernel, callees):
    module = kernel.py_func.__module__.rsplit(".", 1)[-1]
    stamp = pathlib.Path(kernel._cache.cache_path) / f"{module}.{kernel.__name__}.callees.sha256"
    assert stamp.read_text() == digest(callees)
