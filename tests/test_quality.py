"""The quality cost of a weight format (minibatch.bench.quality): the log-likelihood of text from the prompt
log-probabilities, equal to transformers' on the same tokens; on SmolLM2, q4_1 scores as fp32 does."""
import math

import pytest
import torch

from minibatch import LLM, EngineConfig
from minibatch.bench.quality import format_quality, log_likelihood, quality_lines
from minibatch.engine.models import load_hf

TEXTS = ["The tide comes in.", "A short second text, longer than the first one."]


def reference_log_likelihood(hf, tokenizer, texts) -> tuple[float, int]:
    total, count = 0.0, 0
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        with torch.no_grad():
            logprobs = hf(torch.tensor([ids])).logits[0].float().log_softmax(-1)     # (T, V)
        total += sum(float(logprobs[p, t]) for p, t in enumerate(ids[1:]))
        count += len(ids) - 1
    return total, count


def test_rows_per_format_against_the_reference(tiny_hf):
    hf, tokenizer = tiny_hf
    config = dict(model="tiny", scheduler="edge", block_size=8, num_kv_blocks=32)
    rows = format_quality({"fp32": LLM(EngineConfig(**config)),
                           "q8_0": LLM(EngineConfig(**config, quantization="q8_0"))}, TEXTS)
    total, count = reference_log_likelihood(hf, tokenizer, TEXTS)
    fp32, q8 = rows
    assert [r["format"] for r in rows] == ["fp32", "q8_0"] and fp32["tokens"] == q8["tokens"] == count
    assert fp32["mean_logprob"] == pytest.approx(total / count, abs=1e-4) and fp32["vs_reference"] == 0
    assert fp32["perplexity"] == pytest.approx(math.exp(-fp32["mean_logprob"]))
    assert q8["weight_bytes"] < fp32["weight_bytes"] and q8["vs_reference"] == q8["mean_logprob"] - fp32["mean_logprob"]
    assert len(quality_lines(rows)) == 3 and "q8_0" in quality_lines(rows)[2]


@pytest.mark.smollm2
@pytest.mark.slow
def test_smollm2_q4_1_scores_as_fp32_and_both_as_transformers():
    hf, tokenizer = load_hf("smollm2-135m")
    text = ["The tide comes in twice a day, pulled by the moon, and the harbour fills with boats."]
    config = dict(model="smollm2-135m", scheduler="edge", max_model_len=256, num_kv_blocks=16)
    fp32, count = log_likelihood(LLM(EngineConfig(**config)), text)
    q4_1, _ = log_likelihood(LLM(EngineConfig(**config, quantization="q4_1")), text)
    reference, ref_count = reference_log_likelihood(hf, tokenizer, text)
    assert count == ref_count and fp32 / count == pytest.approx(reference / count, abs=1e-4)
    assert abs(q4_1 - fp32) / count < 1e-3
