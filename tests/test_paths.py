"""The two paths behind `EngineConfig.kernels`: the same tokens, operation by operation and end to end.

`fast` must equal `reference` token for token (float32, q8_0 and q4_1 exactly; bfloat16 by the near-tie
rule of DESIGN.md) over batch sizes 1 to 64, chunked prefill, preemption and the prefix cache; each fast
operation agrees with its reference by property tests.
"""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch import LLM, EngineConfig, SamplingParams
from minibatch.config import ConfigError
from minibatch.engine.kernels import AttentionMetadata, numba_cpu, torch_ref
from minibatch.engine.ops import FastOps, ReferenceOps
from minibatch.engine.resolve import resolve

PROMPTS = [[5, 6, 7, 8, 9], list(range(20, 57)), [42], list(range(100, 190)), [3] * 17, list(range(60, 75))]
NEW = 16


def generate(kernels: str, prompts, new=NEW, **config) -> list[list[int]]:
    llm = LLM(EngineConfig(**{"model": "tiny", "kernels": kernels, **config}))
    outs = llm.generate(prompts, SamplingParams(max_new_tokens=new, ignore_eos=True), use_tqdm=False)
    assert llm.engine.blocks.num_free_blocks == llm.engine.blocks.num_blocks
    return [o.token_ids for o in outs]


@pytest.fixture(scope="module")
def reference_tokens():
    return generate("reference", PROMPTS)


def test_auto_picks_fast_on_a_cpu_in_float32_or_bfloat16_and_reference_elsewhere():
    assert resolve(EngineConfig(model="tiny")).kernels == "fast"
    assert resolve(EngineConfig(model="tiny", dtype="bfloat16")).kernels == "fast"
    assert resolve(EngineConfig(model="tiny", dtype="float16")).kernels == "reference"
    fast, reference = resolve(EngineConfig(model="tiny")), resolve(EngineConfig(model="tiny", kernels="reference"))
    assert (fast.attention_backend, reference.attention_backend) == ("numba", "torch")


def test_fast_where_it_cannot_run_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"EngineConfig.kernels='fast' is not allowed.*'float16'.*'reference'"):
        LLM(EngineConfig(model="tiny", kernels="fast", dtype="float16"))
    with pytest.raises(ConfigError, match=r"EngineConfig.kernels='nope' is not allowed"):
        EngineConfig(kernels="nope")


@pytest.mark.parametrize("batch", [1, 2, 3, 8, 64])
def test_fast_equals_reference_at_every_batch_size(reference_tokens, batch):
    prompts = (PROMPTS * 11)[:batch] if batch > len(PROMPTS) else PROMPTS
    want = (reference_tokens * 11)[:len(prompts)]
    assert generate("fast", prompts, max_batch_size=batch) == want


@pytest.mark.parametrize("settings_", [dict(max_tokens_per_step=7, block_size=4, max_batch_size=4),   # chunked
                                       dict(max_batch_size=6, block_size=4, num_kv_blocks=32),         # preempts
                                       dict(enable_prefix_caching=True, block_size=4)])                # shares
def test_fast_equals_reference_through_chunks_preemption_and_the_prefix_cache(reference_tokens, settings_):
    shared = [[9, 9, 9, 9, 9, 9, 9, 9] + p for p in PROMPTS]                 # a prefix of two full blocks
    prompts = shared if settings_.get("enable_prefix_caching") else PROMPTS
    want = reference_tokens if prompts is PROMPTS else generate("reference", prompts, **settings_)
    assert generate("fast", prompts, **settings_) == want
    assert generate("reference", prompts, **settings_) == want


def test_q8_0_fast_equals_its_reference_exactly():
    assert generate("fast", PROMPTS, quantization="q8_0", max_batch_size=4) == \
        generate("reference", PROMPTS, quantization="q8_0", max_batch_size=4)


@pytest.mark.smollm2
@pytest.mark.slow
def test_q4_1_fast_equals_its_reference_exactly_on_the_shipped_blocks():
    prompts = [list(range(100, 120)), [1, 2, 3, 4]]
    config = dict(model="smollm2-135m", quantization="q4_1", max_batch_size=2, max_model_len=128)
    assert generate("fast", prompts, 8, **config) == generate("reference", prompts, 8, **config)


def test_bfloat16_fast_agrees_with_reference_up_to_the_first_near_tie():
    """Both round in bfloat16 but sum in different orders: where the reference's top two logits are within
    bfloat16's tolerance they may part; before that they agree."""
    llm = LLM(EngineConfig(model="tiny", dtype="bfloat16", kernels="reference"))
    params = SamplingParams(max_new_tokens=NEW, ignore_eos=True, logprobs=2)
    reference = llm.generate(PROMPTS, params, use_tqdm=False)
    fast = generate("fast", PROMPTS, dtype="bfloat16")
    compared = 0
    for want, got in zip(reference, fast):
        gaps = [abs(a - b) for a, b in (list(step.values())[:2] for step in want.outputs[0].logprobs)]
        first_tie = next((i for i, gap in enumerate(gaps) if gap <= 0.05), NEW)
        assert got[:first_tie] == want.token_ids[:first_tie]
        compared += first_tie
    assert compared >= NEW, "ties everywhere: the test would compare nothing"


# ---- operation by operation -------------------------------------------------------------------------------

H, HKV, D, BS = 4, 2, 16, 4                      # query heads, KV heads, head dim, block size


def step_tensors(seed: int, lens: list[int], dtype):
    """A packed step of sequences whose query lengths are `lens`, each with a few cached tokens before."""
    g = torch.Generator().manual_seed(seed)
    contexts = [n + 3 for n in lens]
    tables, next_block = [], 0
    for c in contexts:
        blocks = -(-c // BS)
        tables.append(list(range(next_block, next_block + blocks)))
        next_block += blocks
    meta = AttentionMetadata.build(lens, contexts, tables, torch.device("cpu"))
    slots = torch.tensor([t[p // BS] * BS + p % BS for t, c, n in zip(tables, contexts, lens)
                          for p in range(c - n, c)])
    positions = torch.tensor([p for c, n in zip(contexts, lens) for p in range(c - n, c)])
    caches = [torch.randn(next_block, BS, HKV, D, generator=g).to(dtype) for _ in range(2)]
    qkv = torch.randn(sum(lens), (H + 2 * HKV) * D, generator=g).to(dtype)
    angles = torch.randn(64, D, generator=g)
    return qkv, positions, slots, meta, caches, angles.cos().to(dtype), angles.sin().to(dtype)


@settings(max_examples=25, deadline=None)
@given(lens=st.lists(st.integers(1, 9), min_size=1, max_size=4), seed=st.integers(0, 2**16),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_each_fast_operation_agrees_with_its_reference(lens, seed, dtype):
    reference, fast = ReferenceOps(torch_ref), FastOps(numba_cpu)
    qkv, positions, slots, meta, (k, v), cos, sin = step_tensors(seed, lens, dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    x, weight = qkv[:, :32].contiguous(), torch.randn(32).to(dtype)
    torch.testing.assert_close(fast.rms_norm(x, weight, 1e-5).float(), reference.rms_norm(x, weight, 1e-5).float(),
                               **tol)
    torch.testing.assert_close(fast.silu_mul(qkv).float(), reference.silu_mul(qkv).float(), **tol)
    k2, v2 = k.clone(), v.clone()
    q_ref = reference.rotary_write_kv(qkv, positions, cos, sin, k, v, slots, H)
    q_fast = fast.rotary_write_kv(qkv, positions, cos, sin, k2, v2, slots, H)
    torch.testing.assert_close(q_fast.float(), q_ref.float(), **tol)
    torch.testing.assert_close(k2.float(), k.float(), **tol)
    assert torch.equal(v2, v)                                            # values are copied, not computed
    scale = D ** -0.5
    torch.testing.assert_close(fast.attention(q_ref, k, v, meta, scale).float(),
                               reference.attention(q_ref, k, v, meta, scale).float(), **tol)
