"""Weight formats q8_0 and q4_1: blocks round-trip, the Numba kernels equal the torch reference, the GGUF
file's q4_1 blocks are exactly the converted checkpoint's weights, tokens equal their references, bad
requests are refused."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch import LLM, EngineConfig, SamplingParams
from minibatch.config import ConfigError
from minibatch.engine.kernels import quantized_groups_numba, quantized_numba
from minibatch.engine.models import load_hf, load_model
from minibatch.engine.models.gguf_blocks import gguf_file, read_blocks, unpermute_rows
from minibatch.engine.models.quantized import QuantizedWeight, quantize_q4_1, quantize_q8_0
from minibatch.engine.ops.products import BlocksProduct, Product
from minibatch.engine.ops.reference import TorchProduct
from minibatch.engine.resolve import check_quantization
from tests.conftest import reference_greedy

QUANTIZE = {"q8_0": quantize_q8_0, "q4_1": quantize_q4_1}


def random_weight(rows, cols, seed):
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 0.05


@pytest.mark.parametrize("fmt", ["q8_0", "q4_1"])
def test_blocks_round_trip_within_half_a_step(fmt):
    weight = random_weight(48, 96, 0)
    blocks = QUANTIZE[fmt](weight)
    assert blocks.shape == (48, 96) and blocks.scales.shape == (48, 3) and blocks.scales.dtype == torch.float16
    assert blocks.nbytes() == 48 * 3 * {"q8_0": 34, "q4_1": 20}[fmt]
    step = blocks.scales.float().repeat_interleave(32, dim=1)                   # (N, K): d of each weight's block
    error = (blocks.dequantize() - weight).abs()
    assert torch.all(error <= 0.57 * step + 1e-3 * weight.abs().amax())           # half a step, plus fp16 rounding
    again = QUANTIZE[fmt](blocks.dequantize())                                  # requantising changes (almost) nothing
    assert (again.dequantize() - blocks.dequantize()).abs().max() <= 1e-3 * weight.abs().amax()


def test_q8_0_codes_and_an_all_zero_block():
    weight = torch.cat((torch.linspace(-1, 1, 32), torch.zeros(32)))[None]     # (1, 64)
    blocks = quantize_q8_0(weight)
    assert blocks.codes[0, 0] == -127 and blocks.codes[0, 31] == 127 and torch.all(blocks.codes[0, 32:] == 0)
    assert blocks.scales[0, 1] == 0 and torch.equal(blocks.dequantize()[0, 32:], torch.zeros(32))


def test_q4_1_nibble_layout_is_ggml_s():
    """Byte j of a block holds weight j in its low nibble and weight j + 16 in its high one."""
    codes = torch.tensor([[0x10 * (15 - j) + j for j in range(16)]], dtype=torch.uint8)  # (1, 16): one block
    weights = QuantizedWeight("q4_1", codes, torch.tensor([[1.0]]).half(), torch.tensor([[0.0]]).half())
    assert weights.dequantize()[0].tolist() == list(range(16)) + list(range(15, -1, -1))


def test_fp16_scales_become_fp32_exactly_subnormals_included():
    halves = np.arange(0, 1 << 16, dtype=np.uint32).astype(np.uint16)
    finite = np.isfinite(halves.view(np.float16))
    out = np.empty(len(halves), np.float32)
    quantized_groups_numba._halves_to_float(halves, np.empty(len(halves), np.uint32), out)
    np.testing.assert_array_equal(out[finite], halves.view(np.float16)[finite].astype(np.float32))
    subnormal = torch.tensor([[1, 1023]], dtype=torch.int16).view(torch.float16)      # (1, 2): 2^-24, 1023 * 2^-24
    weight = QuantizedWeight("q8_0", torch.full((1, 64), 100, dtype=torch.int8), subnormal)
    x = torch.ones(1, 64)
    assert BlocksProduct(weight)(x).item() == pytest.approx(TorchProduct(weight)(x).item(), rel=1e-6)


@settings(max_examples=40, deadline=None)
@given(fmt=st.sampled_from(["q8_0", "q4_1"]), rows=st.sampled_from([0, 1, 2, 3, 8, 9]), blocks=st.integers(1, 5),
       n=st.integers(1, 70), seed=st.integers(0, 2**16))
def test_numba_kernel_matches_the_torch_reference(fmt, rows, blocks, n, seed):
    weight = QUANTIZE[fmt](random_weight(n, 32 * blocks, seed))
    x = torch.randn(rows, 32 * blocks, generator=torch.Generator().manual_seed(seed + 1))   # (T, K)
    fast, reference = Product(weight)(x), TorchProduct(weight)(x)
    assert fast.shape == reference.shape == (rows, n)
    torch.testing.assert_close(fast, reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(reference, x @ weight.dequantize().T, rtol=1e-5, atol=1e-5)


def test_row_groups_are_the_same_bytes_interleaved_with_zero_padding():
    """grouped[g, b, j, r] is byte j of block b of row g R + r; scales and mins follow their rows."""
    weight = quantize_q4_1(random_weight(70, 64, 5))                            # 70 rows: a group and 6 rows
    codes, scales, mins, grouped, group_scales, group_mins = quantized_numba.host_arrays(
        weight.codes, weight.scales, weight.mins)
    R = quantized_groups_numba.ROW_GROUP
    assert grouped.shape == (2, 2, 16, R) and group_scales.shape == group_mins.shape == (2, 2, R)
    for n, b, j in [(0, 0, 0), (5, 1, 7), (63, 0, 15), (64, 1, 3), (69, 1, 15)]:
        assert grouped[n // R, b, j, n % R] == codes[n, b * 16 + j]
        assert group_scales[n // R, b, n % R] == scales[n, b] and group_mins[n // R, b, n % R] == mins[n, b]
    assert not grouped[1, :, :, 6:].any() and not group_scales[1, :, 6:].any()   # rows 70..127: padding


@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("fmt", ["q8_0", "q4_1"])
def test_rows_of_a_batch_do_not_see_each_other_and_add_to_adds(fmt, rows):
    weight = QUANTIZE[fmt](random_weight(40, 64, 3))
    product = Product(weight)
    x, residual = torch.randn(rows, 64), torch.randn(rows, 40)
    alone = torch.cat([product(x[i:i + 1]) for i in range(rows)])
    torch.testing.assert_close(product(x), alone, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(product(x, residual=residual), residual + alone, rtol=1e-6, atol=1e-6)
    assert product.numel() == 40 * 64 and product.nbytes() == weight.nbytes()


def test_unpermute_rows_is_transformers_reverse_permutation():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    gguf_rows = np.arange(24 * 3).reshape(24, 3)                  # 24 rows: 3 heads of 8
    expected = LlamaTensorProcessor()._reverse_permute_weights(gguf_rows, 3, 3)
    np.testing.assert_array_equal(gguf_rows[unpermute_rows(24, 3).numpy()], expected)


@pytest.mark.smollm2
def test_gguf_blocks_are_exactly_the_converted_checkpoints_weights():
    blocks = read_blocks(gguf_file("smollm2-135m"))
    state_dict = load_model("smollm2-135m").state_dict
    assert len(blocks) == 30 * 7 + 1
    assert {b.format for name, b in blocks.items() if name != "lm_head.weight"} == {"q4_1"}
    assert blocks["lm_head.weight"].format == "q8_0"                   # the tied embedding is Q8_0 in the file
    for name, weight in blocks.items():
        assert torch.equal(weight.dequantize(), state_dict[name]), name   # q and k rows unpermuted included


@pytest.mark.smollm2
def test_blocks_are_cached_on_disk_and_read_again_only_while_the_file_is_unchanged(tmp_path, monkeypatch):
    import os

    from minibatch.engine.models import gguf_blocks
    monkeypatch.setenv("MINIBATCH_CACHE", str(tmp_path))
    source = gguf_file("smollm2-135m")
    parsed = gguf_blocks.read_blocks.__wrapped__(source)                       # parses, then writes the cache
    cache = tmp_path / f"{source.stem}.blocks.safetensors"
    assert cache.exists()
    monkeypatch.setattr(gguf_blocks, "_parse", lambda path: pytest.fail("the cache should have been read"))
    cached = gguf_blocks.read_blocks.__wrapped__(source)
    assert cached.keys() == {n for n, w in parsed.items() if w is not None}
    for name, weight in cached.items():
        assert weight.format == parsed[name].format and torch.equal(weight.codes, parsed[name].codes)
        assert torch.equal(weight.scales, parsed[name].scales)
        assert (weight.mins is None) == (parsed[name].mins is None)
    stale = tmp_path / "stale.gguf"                                              # same bytes, another time stamp
    stale.write_bytes(source.read_bytes())
    os.utime(stale, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns + 10**9))
    (tmp_path / "stale.blocks.safetensors").write_bytes(cache.read_bytes())     # a cache made for the other file
    monkeypatch.setattr(gguf_blocks, "_parse", lambda path: {"parsed again": None})
    assert gguf_blocks.read_blocks.__wrapped__(stale) == {"parsed again": None}


@pytest.mark.smollm2
def test_q4_1_tokens_equal_the_fp32_reference():
    model, _ = load_hf("smollm2-135m")
    llm = LLM(EngineConfig(model="smollm2-135m", quantization="q4_1", max_batch_size=4))
    assert llm.engine.model.decode_weight_bytes() == sum(
        w.numel() * (34 if w is llm.engine.model.lm_head else 20) // 32 for w in llm.engine.model.linears()
    ) + 4 * 576 * 61                                                    # q4_1 layers, q8_0 head, fp32 norms
    prompts = ["The capital of France is", [{"role": "user", "content": "Name three colours."}], "def add(a, b):"]
    outs = llm.generate(prompts, SamplingParams(max_new_tokens=10), use_tqdm=False)
    for out in outs:
        assert out.token_ids == reference_greedy(model, out.prompt_token_ids, 10)


def dequantised_reference(hf_model):
    """The transformers model with every weight matrix the engine quantises replaced by its q8_0 round trip.

    The LM head gets its own copy (the embedding it is tied to stays fp32, as the engine's lookup does)."""
    with torch.no_grad():
        for name, module in hf_model.named_modules():
            if isinstance(module, torch.nn.Linear):
                module.weight = torch.nn.Parameter(quantize_q8_0(module.weight).dequantize())
    return hf_model


def test_q8_0_tokens_equal_transformers_on_the_dequantised_weights():
    model = dequantised_reference(load_hf("tiny")[0])
    prompts = [[5, 6, 7, 8, 9], list(range(20, 57)), [42], [3] * 17]
    llm = LLM(EngineConfig(model="tiny", quantization="q8_0", max_batch_size=4, block_size=8))
    outs = llm.generate(prompts, SamplingParams(max_new_tokens=16), use_tqdm=False)
    assert [o.token_ids for o in outs] == [reference_greedy(model, p, 16) for p in prompts]
    engine_model = llm.engine.model
    norms = 4 * engine_model.final_norm.numel() * (2 * engine_model.num_layers + 1)
    assert engine_model.decode_weight_bytes() == sum(w.numel() for w in engine_model.linears()) * 34 // 32 + norms


def test_a_format_that_is_not_one_is_refused():
    with pytest.raises(ConfigError, match=r"EngineConfig.quantization='q4_0' is not allowed: choose one of None, "
                                          r"'q8_0', 'q4_1'"):
        EngineConfig(quantization="q4_0")


def test_q4_1_needs_a_gguf_file():
    with pytest.raises(ConfigError, match=r"quantization='q4_1' is not allowed for model='tiny'.*None or 'q8_0'"):
        LLM(EngineConfig(model="tiny", quantization="q4_1"))


@pytest.mark.parametrize("device,dtype,allowed", [("cuda", torch.float32, "device='cpu'"),
                                                  ("cpu", torch.bfloat16, "dtype='float32'")])
def test_quantised_kernels_run_in_fp32_on_the_cpu(device, dtype, allowed):
    with pytest.raises(ConfigError, match=f"quantization='q8_0' is not allowed.*{allowed}"):
        check_quantization("q8_0", "tiny", torch.device(device), dtype)


def test_the_flag_sets_the_field():
    import argparse

    from minibatch.serving.flags import add_engine_arguments, engine_config_from_args

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_config_from_args(parser.parse_args(["--quantization", "q4_1"])) == EngineConfig(quantization="q4_1")
    assert engine_config_from_args(parser.parse_args(["--quantization", "none"])).quantization is None
