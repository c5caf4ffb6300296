"""Sampling: filters keep the right tokens, and a seeded request samples the same tokens in any batch."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch import LLM, EngineConfig, SamplingParams
from minibatch.engine.sampling import filter_logits


def kept(logits, **kw):
    return torch.isfinite(filter_logits(torch.tensor(logits), SamplingParams(temperature=1.0, **kw))).tolist()


def test_top_k_keeps_the_k_largest():
    assert kept([0.1, 3.0, 2.0, -1.0], top_k=2) == [False, True, True, False]


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])).tolist()
    assert kept(logits, top_p=0.5) == [True, False, False, False]
    assert kept(logits, top_p=0.8) == [True, True, False, False]
    assert kept(logits, top_p=0.81) == [True, True, True, False]
    assert kept(logits, top_p=1.0) == [True, True, True, True]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-20, 20), min_size=2, max_size=30), st.floats(0.05, 1.0), st.integers(0, 40))
def test_filters_never_drop_the_most_likely_token(values, top_p, top_k):
    logits = torch.tensor(values)
    out = filter_logits(logits, SamplingParams(temperature=0.7, top_p=top_p, top_k=top_k))
    assert torch.isfinite(out[logits.argmax()])
    if top_k:
        assert int(torch.isfinite(out).sum()) >= min(top_k, len(values)) or top_p < 1.0


def test_seeded_sample_does_not_depend_on_batch_mates():
    llm = LLM(EngineConfig(model="tiny", max_batch_size=8))
    sampled = SamplingParams(max_new_tokens=20, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    alone = llm.generate([[10, 11, 12]], sampled, use_tqdm=False)[0].token_ids
    crowd = llm.generate([[5] * 30, [10, 11, 12], [7, 8]], [SamplingParams(max_new_tokens=30), sampled,
                          SamplingParams(max_new_tokens=5, temperature=1.5, seed=9)], use_tqdm=False)
    assert crowd[1].token_ids == alone
    other_seed = llm.generate([[10, 11, 12]], SamplingParams(max_new_tokens=20, temperature=1.0, top_p=0.9, seed=1,
                                                          ignore_eos=True), use_tqdm=False)[0].token_ids
    assert other_seed != alone, "different seeds should give different samples"
