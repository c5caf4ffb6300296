"""Greedy tokens equal transformers' generate() for each prompt alone, on every scheduling path."""
import pytest
import torch
from transformers import LlamaConfig

from minibatch import LLM, EngineConfig, SamplingParams
from minibatch.bench.check import greedy_kwargs
from minibatch.engine.models import load_hf
from minibatch.engine.models.tiny import random_llama
from tests.conftest import reference_greedy

PROMPTS = [[5, 6, 7, 8, 9], list(range(20, 57)), [42], list(range(100, 190)), [3] * 17, list(range(60, 75))]
NEW = 24


@pytest.fixture(scope="module")
def references(tiny_hf):
    model, _ = tiny_hf
    return [reference_greedy(model, p, NEW) for p in PROMPTS]


@pytest.mark.parametrize("scheduler", ["static", "continuous", "edge"])
@pytest.mark.parametrize("max_batch_size,block_size", [(1, 16), (2, 1), (4, 8), (8, 32)])
def test_greedy_matches_generate(references, scheduler, max_batch_size, block_size):
    llm = LLM(EngineConfig(model="tiny", scheduler=scheduler, max_batch_size=max_batch_size, block_size=block_size))
    outs = llm.generate(PROMPTS, SamplingParams(max_new_tokens=NEW), use_tqdm=False)
    assert [o.token_ids for o in outs] == references
    assert llm.engine.blocks.num_free_blocks == llm.engine.blocks.num_blocks


def test_chunked_prefill_matches_generate(references):
    llm = LLM(EngineConfig(model="tiny", max_batch_size=4, max_tokens_per_step=7, block_size=4))
    outs = llm.generate(PROMPTS, SamplingParams(max_new_tokens=NEW), use_tqdm=False)
    assert [o.token_ids for o in outs] == references
    assert max(s.num_prefill_tokens + s.num_decode_tokens for s in llm.engine.step_records) <= 7
    assert any(s.num_prefill_tokens and s.num_decode_tokens for s in llm.engine.step_records), "no mixed step"


def test_preemption_keeps_tokens(references):
    llm = LLM(EngineConfig(model="tiny", max_batch_size=6, block_size=4, num_kv_blocks=32))
    outs = llm.generate(PROMPTS, SamplingParams(max_new_tokens=NEW), use_tqdm=False)
    assert sum(o.metrics.num_preemptions for o in outs) > 0, "the KV pool was meant to force preemption"
    assert [o.token_ids for o in outs] == references
    assert llm.engine.blocks.num_free_blocks == 32


@pytest.mark.parametrize("backend", ["numba"])
def test_other_backends_match(references, backend):
    llm = LLM(EngineConfig(model="tiny", max_batch_size=4, block_size=8, attention_backend=backend))
    outs = llm.generate(PROMPTS, SamplingParams(max_new_tokens=NEW), use_tqdm=False)
    assert [o.token_ids for o in outs] == references


def test_contiguous_layout_matches(references):
    llm = LLM(EngineConfig(model="tiny", max_batch_size=4, kv_layout="contiguous", max_model_len=256))
    outs = llm.generate(PROMPTS, SamplingParams(max_new_tokens=NEW), use_tqdm=False)
    assert [o.token_ids for o in outs] == references


def test_saved_gqa_checkpoint_with_untied_embeddings(tmp_path):
    config = LlamaConfig(vocab_size=97, hidden_size=96, num_hidden_layers=3, num_attention_heads=6,
                         num_key_value_heads=2, head_dim=16, intermediate_size=160, max_position_embeddings=256,
                         tie_word_embeddings=False, rope_theta=500.0)
    random_llama(config, seed=3).save_pretrained(tmp_path)
    hf, tokenizer = load_hf(str(tmp_path))
    assert tokenizer is None
    assert not torch.equal(hf.lm_head.weight, hf.model.embed_tokens.weight)
    prompts = [[1, 2, 3], list(range(10, 60)), [96] * 9]
    llm = LLM(EngineConfig(model=str(tmp_path), max_batch_size=2, block_size=8))
    outs = llm.generate(prompts, SamplingParams(max_new_tokens=16, ignore_eos=True), use_tqdm=False)
    assert [o.token_ids for o in outs] == [reference_greedy(hf, p, 16) for p in prompts]
    assert all(o.text == "" for o in outs)


def test_text_and_chat_prompts(tiny_hf):
    model, tokenizer = tiny_hf
    llm = LLM(EngineConfig(model="tiny"))
    chat = [{"role": "user", "content": "Hi!"}]
    out_text, out_chat = llm.generate(["Hello", chat], SamplingParams(max_new_tokens=8), use_tqdm=False)
    ids = tokenizer.encode("Hello", add_special_tokens=False)
    assert out_text.prompt_token_ids == ids and out_text.token_ids == reference_greedy(model, ids, 8)
    assert out_text.text == tokenizer.decode(out_text.token_ids, skip_special_tokens=True)
    rendered = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert out_chat.prompt_token_ids == tokenizer.encode(rendered, add_special_tokens=False)
    assert llm.chat(chat, SamplingParams(max_new_tokens=8), use_tqdm=False)[0].token_ids == out_chat.token_ids


def test_stop_conditions():
    llm = LLM(EngineConfig(model="tiny"))
    free = llm.generate([[7, 8, 9]], SamplingParams(max_new_tokens=12, ignore_eos=True), use_tqdm=False)[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 12
    stop_at = free.token_ids[4]
    first = free.token_ids.index(stop_at)
    stopped = llm.generate([[7, 8, 9]], SamplingParams(max_new_tokens=12, stop_token_ids=(stop_at,)), use_tqdm=False)[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids == free.token_ids[: first + 1]


@pytest.mark.smollm2
def test_smollm2_matches_generate():
    model, tokenizer = load_hf("smollm2-135m")
    llm = LLM(EngineConfig(model="smollm2-135m", max_batch_size=4, block_size=16))
    prompts = ["The capital of France is", [{"role": "user", "content": "Name three colours."}], "def add(a, b):"]
    outs = llm.generate(prompts, SamplingParams(max_new_tokens=12), use_tqdm=False)
    for out in outs:
        assert out.token_ids == reference_greedy(model, out.prompt_token_ids, 12)
    assert "Paris" in outs[0].text


@pytest.mark.smollm2
@pytest.mark.parametrize("batch", [8, 19])
def test_smollm2_batches_of_eight_and_more_match_generate(batch):
    """Eight sequences decode together: the products take eight rows of x at a time, and the down projection
    (1536 columns, longer than gemv_cpu.K_CHUNK) sums them chunk by chunk. Nineteen: blocks of four rows by six
    weight rows (four without AVX-512), the last three rows in a block overlapping the one before, the down
    projection unchunked with AVX-512. Every token is still the reference's."""
    model, _ = load_hf("smollm2-135m")
    llm = LLM(EngineConfig(model="smollm2-135m", max_batch_size=batch, block_size=16))
    prompts = [f"Write one sentence about the number {i}." for i in range(batch)]
    outs = llm.generate(prompts, SamplingParams(max_new_tokens=10, ignore_eos=True), use_tqdm=False)
    assert max(s.batch_size for s in llm.engine.step_records) == batch
    for out in outs:                                        # the reference past EOS too, as ignore_eos asks
        with torch.no_grad():
            ref = model.generate(torch.tensor([out.prompt_token_ids]), **greedy_kwargs(10))
        assert out.token_ids == ref[0, len(out.prompt_token_ids):].tolist()
