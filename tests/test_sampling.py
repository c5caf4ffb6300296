"""Sampling: filters keep the right tokens, and a seeded request samples the same tokens in any batch."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch import LLM, EngineConfig, SamplingParams
from minibatch.engine.sampling import filter_logits, most_likely


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


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5), st.integers(1, 40), st.data())
def test_most_likely_is_torch_argmax_ties_and_nans_included(rows, vocab, data):
    # few distinct values, so ties are common; NaN and infinities as the model could produce them
    value = st.sampled_from([0.0, 1.0, -1.0, 2.5, float("inf"), float("-inf"), float("nan")])
    logits = torch.tensor(data.draw(st.lists(value, min_size=rows * vocab, max_size=rows * vocab))).reshape(rows, vocab)
    assert most_likely(logits) == logits.argmax(dim=-1).tolist()
    assert most_likely(logits.t().contiguous().t()) == logits.argmax(dim=-1).tolist()   # a non-contiguous view
    assert most_likely(logits.to(torch.bfloat16)) == logits.to(torch.bfloat16).argmax(dim=-1).tolist()


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


# ---- vLLM's sampling fields: each changes what it should, and only that ---------------------------

import pytest  # noqa: E402

from minibatch import ConfigError  # noqa: E402
from minibatch.engine.sampling import apply_penalties, filter_rows  # noqa: E402

REPETITIVE = [5, 6, 7, 5, 6, 7, 5, 6, 7]


@pytest.fixture(scope="module")
def tiny():
    return LLM(EngineConfig(model="tiny", max_batch_size=8))


def greedy(llm, prompt, **kw):
    return llm.generate([prompt], SamplingParams(**{"max_new_tokens": 12, "ignore_eos": True, **kw}), use_tqdm=False)[0]


def test_penalties_follow_vllm_arithmetic():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    prompt_and_output = ([0], [1, 2, 2])                 # token 0 only in the prompt; 2 twice in the output
    rep = apply_penalties(logits.clone(), [prompt_and_output], [SamplingParams(repetition_penalty=2.0)])
    assert rep.tolist() == [[1.0, -4.0, 0.5, 0.5]]       # positive divided, negative multiplied, unseen kept
    additive = apply_penalties(logits.clone(), [prompt_and_output],
                               [SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)])
    assert additive.tolist() == [[2.0, -2.75, 0.0, 0.5]]  # output tokens only: 0.5 + 0.25 x count


def test_min_p_keeps_tokens_within_a_fraction_of_the_top():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = filter_rows(probs.log(), [SamplingParams(temperature=1.0, min_p=0.5)])
    assert torch.isfinite(out).tolist() == [[True, True, False, False]]


def test_top_k_minus_one_means_off_as_in_vllm(tiny):
    sampled = dict(temperature=1.0, seed=5)
    assert (greedy(tiny, [1, 2, 3], top_k=-1, **sampled).token_ids
            == greedy(tiny, [1, 2, 3], top_k=0, **sampled).token_ids)


def test_repetition_penalty_changes_the_greedy_continuation_of_a_repetitive_prompt(tiny):
    plain = greedy(tiny, REPETITIVE).token_ids
    penalised = greedy(tiny, REPETITIVE, repetition_penalty=1.5).token_ids
    assert penalised != plain
    most_repeated = lambda ids: max(ids.count(t) for t in ids)
    assert most_repeated(penalised) < most_repeated(plain), (plain, penalised)
    assert not set(penalised) & set(REPETITIVE) or most_repeated(penalised) == 1
    assert greedy(tiny, REPETITIVE, repetition_penalty=1.0, presence_penalty=0.0).token_ids == plain   # neutral


def test_frequency_penalty_thins_out_repeats(tiny):
    plain = greedy(tiny, REPETITIVE).token_ids
    thinned = greedy(tiny, REPETITIVE, frequency_penalty=2.0).token_ids
    assert max(thinned.count(t) for t in thinned) < max(plain.count(t) for t in plain)


def test_min_tokens_forbids_an_early_eos(tiny):
    eos = min(tiny.engine.eos_token_ids)
    rushed = tiny.generate([[1, 2, 3]], SamplingParams(max_new_tokens=8, logit_bias={eos: 100.0}), use_tqdm=False)[0]
    assert rushed.token_ids == [eos] and rushed.finish_reason == "stop"
    held = tiny.generate([[1, 2, 3]], SamplingParams(max_new_tokens=8, min_tokens=4, logit_bias={eos: 100.0}),
                         use_tqdm=False)[0]
    assert len(held.token_ids) == 5 and eos not in held.token_ids[:4] and held.token_ids[4] == eos
    stop = greedy(tiny, [1, 2, 3]).token_ids[0]          # a stop token is held back the same way
    early = tiny.generate([[1, 2, 3]], SamplingParams(max_new_tokens=8, stop_token_ids=(stop,), min_tokens=3,
                                                      ignore_eos=True), use_tqdm=False)[0]
    assert len(early.token_ids) >= 3 and stop not in early.token_ids[:3]


def test_logprobs_match_log_softmax_of_the_reference_logits(tiny, tiny_hf):
    hf, _ = tiny_hf
    prompt = [10, 20, 30, 40]
    out = greedy(tiny, prompt, max_new_tokens=6, logprobs=5).outputs[0]
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + out.token_ids[:-1]])).logits      # (1, T, V)
        reference = logits[0, len(prompt) - 1:].log_softmax(-1)                # (6, V)
    for position, (token, logprobs) in enumerate(zip(out.token_ids, out.logprobs)):
        top = torch.topk(reference[position], 5)
        assert list(logprobs)[0] == token and set(logprobs) == set(top.indices.tolist()) | {token}
        for token_id, value in logprobs.items():
            assert value == pytest.approx(float(reference[position, token_id]), abs=1e-4)


def test_logprobs_come_from_the_raw_distribution_not_the_penalised_one(tiny):
    raw = greedy(tiny, REPETITIVE, max_new_tokens=1, logprobs=0).outputs[0]
    biased = greedy(tiny, REPETITIVE, max_new_tokens=1, logprobs=0, logit_bias={7: 100.0}).outputs[0]
    assert biased.token_ids == [7] and biased.logprobs[0][7] < 0          # chosen by the bias, scored by the model
    assert raw.logprobs[0][raw.token_ids[0]] >= biased.logprobs[0][7]


def test_n_samples_are_seeded_and_reproducible(tiny):
    params = SamplingParams(max_new_tokens=10, temperature=1.0, n=3, seed=42, ignore_eos=True)
    first = tiny.generate([[3, 4, 5]], params, use_tqdm=False)[0]
    again = tiny.generate([[9, 9], [3, 4, 5]], [SamplingParams(max_new_tokens=4), params], use_tqdm=False)[1]
    samples = [o.token_ids for o in first.outputs]
    assert [o.index for o in first.outputs] == [0, 1, 2] and len({tuple(s) for s in samples}) == 3
    assert [o.token_ids for o in again.outputs] == samples and first.token_ids == samples[0]
    third = greedy(tiny, [3, 4, 5], max_new_tokens=10, temperature=1.0, seed=44)      # the i-th is seed + i (vLLM)
    assert third.token_ids == samples[2]


def test_penalised_seeded_sample_does_not_depend_on_batch_mates(tiny):
    params = SamplingParams(max_new_tokens=12, temperature=0.9, seed=3, repetition_penalty=1.3, min_p=0.02,
                            presence_penalty=0.5, ignore_eos=True)
    alone = tiny.generate([REPETITIVE], params, use_tqdm=False)[0].token_ids
    crowd = tiny.generate([[8] * 20, REPETITIVE, [4]], [SamplingParams(max_new_tokens=15), params,
                          SamplingParams(max_new_tokens=3, temperature=1.0, top_k=5)], use_tqdm=False)
    assert crowd[1].token_ids == alone


def test_fields_speculative_decoding_cannot_honour_are_refused():
    llm = LLM(EngineConfig(model="tiny", speculative_method="ngram"))
    for field, value in [("repetition_penalty", 1.2), ("logprobs", 2), ("min_tokens", 2)]:
        with pytest.raises(ConfigError, match=f"{field}={value}"):
            llm.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4, **{field: value}), use_tqdm=False)
    with pytest.raises(ConfigError, match="priority=2"):
        llm.generate([[1, 2, 3]], SamplingParams(priority=2), use_tqdm=False)
