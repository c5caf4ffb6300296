"""Prompt log-probabilities (vLLM's `prompt_logprobs`): equal to transformers' log-softmax of the same
forward pass, over batching, chunked prefill, the prefix cache, every scheduler and n > 1."""
import json
import math

import httpx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch import LLM, EngineConfig, SamplingParams
from minibatch.config import MAX_LOGPROBS, ConfigError
from minibatch.serving.server import ServerThread

PROMPTS = [[5, 17, 99, 3, 250, 41, 8], [200, 2, 2, 2, 77],
           [12, 140, 13, 9, 61, 62, 63, 64, 65, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 44]]   # tiny's vocabulary: 259
TOP = 3


def reference(hf, prompt: list[int]) -> torch.Tensor:
    """transformers' log-softmax over the prompt alone (float32): row p scores token p + 1. (T, V)"""
    with torch.no_grad():
        return hf(torch.tensor([prompt])).logits[0].float().log_softmax(-1)


def check_against(hf, prompt: list[int], scored: list, top: int = TOP) -> None:
    """scored is a RequestOutput's prompt_logprobs: [None, {token: logprob, top-N...}, ...]."""
    ref = reference(hf, prompt)
    assert len(scored) == len(prompt) and scored[0] is None
    for position, entry in enumerate(scored[1:]):
        row, token = ref[position], prompt[position + 1]
        assert list(entry)[0] == token                                     # the prompt's own token first
        for token_id, value in entry.items():
            assert value == pytest.approx(float(row[token_id]), abs=1e-4)
        assert len(entry) in (top, top + 1)                                # the token is one of the top-N, or not
        assert sorted(entry.values(), reverse=True)[:top] == pytest.approx(torch.topk(row, top).values.tolist(),
                                                                           abs=1e-4)


def generate(llm, prompts, **kw):
    params = SamplingParams(**{"max_new_tokens": 3, "ignore_eos": True, "prompt_logprobs": TOP, **kw})
    return llm.generate(prompts, params, use_tqdm=False)


@pytest.fixture(scope="module")
def continuous():
    return LLM(EngineConfig(model="tiny", max_batch_size=8, seed=0))


def test_several_prompts_batched_equal_the_reference(continuous, tiny_hf):
    hf, _ = tiny_hf
    outs = generate(continuous, PROMPTS)
    for prompt, out in zip(PROMPTS, outs):
        check_against(hf, prompt, out.prompt_logprobs)


@pytest.mark.parametrize("scheduler", ["static", "continuous", "edge"])
def test_every_scheduler_with_chunked_prefill(scheduler, tiny_hf):
    hf, _ = tiny_hf
    llm = LLM(EngineConfig(model="tiny", scheduler=scheduler, max_batch_size=4, max_tokens_per_step=4,
                           block_size=4, seed=0))
    outs = generate(llm, PROMPTS)
    for prompt, out in zip(PROMPTS, outs):
        check_against(hf, prompt, out.prompt_logprobs)
    assert llm.engine.blocks.num_used_blocks == 0


def test_a_shared_prefix_in_the_cache_still_gets_every_prompt_logprob(tiny_hf):
    hf, _ = tiny_hf
    llm = LLM(EngineConfig(model="tiny", enable_prefix_caching=True, block_size=4, seed=0))
    shared = PROMPTS[2][:16]
    first, second = shared + [70, 71, 72], shared + [80, 81]
    plain = llm.generate([first], SamplingParams(max_new_tokens=2), use_tqdm=False)[0]   # fills the cache
    assert plain.prompt_logprobs is None
    hits = llm.engine.prefix_cache_hits
    scored = generate(llm, [second])[0]
    assert scored.num_cached_tokens == 0 and llm.engine.prefix_cache_hits == hits     # it reused nothing
    check_against(hf, second, scored.prompt_logprobs)
    after = llm.generate([shared + [90, 91]], SamplingParams(max_new_tokens=2), use_tqdm=False)[0]
    assert after.num_cached_tokens == 16                                  # the cache still serves the others


def test_preemption_scores_each_prompt_token_once(tiny_hf):
    hf, _ = tiny_hf
    # few blocks: the longer requests are preempted and recompute their prompts
    llm = LLM(EngineConfig(model="tiny", max_batch_size=4, block_size=4, num_kv_blocks=12, seed=0))
    prompts = [PROMPTS[2], PROMPTS[0], PROMPTS[1]]
    outs = generate(llm, prompts, max_new_tokens=20)
    assert sum(r.num_preemptions for r in llm.engine.requests.values()) > 0
    for prompt, out in zip(prompts, outs):
        check_against(hf, prompt, out.prompt_logprobs)


def test_n_samples_share_one_scoring_of_the_prompt(continuous, tiny_hf):
    hf, _ = tiny_hf
    out = generate(continuous, [PROMPTS[0]], n=2, temperature=1.0, seed=3)[0]
    assert len(out.outputs) == 2
    check_against(hf, PROMPTS[0], out.prompt_logprobs)
    assert SamplingParams(prompt_logprobs=2, n=2).for_sample(1).prompt_logprobs is None


def test_a_one_token_prompt_has_only_none(continuous):
    assert generate(continuous, [[42]])[0].prompt_logprobs == [None]


def test_zero_top_keeps_only_the_prompt_token_and_none_asked_is_none(continuous, tiny_hf):
    hf, _ = tiny_hf
    out = generate(continuous, [PROMPTS[1]], prompt_logprobs=0)[0]
    assert [list(e) for e in out.prompt_logprobs[1:]] == [[t] for t in PROMPTS[1][1:]]
    ref = reference(hf, PROMPTS[1])
    assert [e[t] for e, t in zip(out.prompt_logprobs[1:], PROMPTS[1][1:])] == pytest.approx(
        [float(ref[p, t]) for p, t in enumerate(PROMPTS[1][1:])], abs=1e-4)
    assert generate(continuous, [PROMPTS[1]], prompt_logprobs=None)[0].prompt_logprobs is None


def test_generated_tokens_are_unchanged_by_scoring_the_prompt(continuous):
    plain = generate(continuous, PROMPTS, prompt_logprobs=None, max_new_tokens=8)
    scored = generate(continuous, PROMPTS, max_new_tokens=8)
    assert [o.token_ids for o in plain] == [o.token_ids for o in scored]


@pytest.mark.parametrize("value", [-1, MAX_LOGPROBS + 1, True, 1.5, "3"])
def test_bad_values_name_the_field(value):
    with pytest.raises(ConfigError, match=r"SamplingParams\.prompt_logprobs=.* is not allowed: None, or an integer in"):
        SamplingParams(prompt_logprobs=value)


def test_refused_with_speculative_decoding():
    llm = LLM(EngineConfig(model="tiny", speculative_method="ngram"))
    with pytest.raises(ConfigError, match=r"SamplingParams\.prompt_logprobs=2 is not allowed with speculative"):
        llm.generate([[1, 2, 3]], SamplingParams(prompt_logprobs=2), use_tqdm=False)


def test_a_scheduler_that_reuses_a_cached_prefix_fails_clearly():
    llm = LLM(EngineConfig(model="tiny", enable_prefix_caching=True, block_size=4, seed=0))
    llm.generate([PROMPTS[2]], SamplingParams(max_new_tokens=1), use_tqdm=False)
    scheduler = llm.engine.scheduler
    scheduler.cached_prefix = lambda request: llm.engine.blocks.cached_prefix(request.all_token_ids)  # a careless one
    with pytest.raises(RuntimeError, match="asks for prompt_logprobs but computes from position 20"):
        generate(llm, [PROMPTS[2]])


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, 258), min_size=2, max_size=12), st.integers(1, MAX_LOGPROBS))
def test_top_n_are_sorted_and_their_probabilities_sum_to_at_most_one(continuous, prompt, top):
    scored = generate(continuous, [prompt], prompt_logprobs=top, max_new_tokens=1)[0].prompt_logprobs
    for position, entry in enumerate(scored[1:]):
        token = prompt[position + 1]
        others = [v for t, v in entry.items() if t != token]               # the top-N without the prompt's token
        assert others == sorted(others, reverse=True) and len(entry) in (top, top + 1)
        if len(entry) == top + 1:                                          # not among the top-N: no more likely
            assert entry[token] <= others[-1]
        assert math.fsum(math.exp(v) for v in entry.values()) <= 1 + 1e-5


# ---- over HTTP: OpenAI's echo with logprobs, vLLM's prompt_logprobs --------------------------------------------

@pytest.fixture(scope="module")
def server():
    with ServerThread(EngineConfig(model="tiny", max_batch_size=8, num_kv_blocks=256)) as running:
        yield running


def complete(server, **body) -> dict:
    response = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "temperature": 0, **body}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_echo_with_max_tokens_zero_scores_the_prompt_alone(server, continuous):
    body = complete(server, prompt=PROMPTS[0], echo=True, logprobs=1, max_tokens=0)
    choice, engine = body["choices"][0], generate(continuous, [PROMPTS[0]], prompt_logprobs=1)[0]
    lp = choice["logprobs"]
    assert choice["text"] == continuous.engine.prompts.decode(PROMPTS[0]) and choice["finish_reason"] == "length"
    assert len(lp["tokens"]) == len(PROMPTS[0]) and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][1:] == pytest.approx([e[t] for e, t in zip(engine.prompt_logprobs[1:], PROMPTS[0][1:])],
                                                     abs=1e-5)
    assert all(1 <= len(top) <= 2 for top in lp["top_logprobs"][1:])
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    assert body["usage"]["completion_tokens"] == 0 and body["usage"]["prompt_tokens"] == len(PROMPTS[0])


def test_echo_puts_the_prompt_before_the_generated_tokens(server):
    plain = complete(server, prompt="The tide", logprobs=2, max_tokens=3, ignore_eos=True)["choices"][0]
    echoed = complete(server, prompt="The tide", echo=True, logprobs=2, max_tokens=3, ignore_eos=True)["choices"]
    assert echoed[0]["text"] == "The tide" + plain["text"]
    lp, alone = echoed[0]["logprobs"], plain["logprobs"]       # a row in another batch: equal to float rounding
    assert lp["tokens"][-3:] == alone["tokens"] and lp["token_logprobs"][-3:] == pytest.approx(alone["token_logprobs"])
    assert [list(top) for top in lp["top_logprobs"][-3:]] == [list(top) for top in alone["top_logprobs"]]
    prompt_chars = sum(map(len, echoed[0]["logprobs"]["tokens"][:-3]))
    assert echoed[0]["logprobs"]["text_offset"][-3:] == [o + prompt_chars for o in plain["logprobs"]["text_offset"]]
    text_only = complete(server, prompt="The tide", echo=True, max_tokens=3, ignore_eos=True)["choices"][0]
    assert text_only["text"] == echoed[0]["text"] and text_only["logprobs"] is None


def test_streamed_echo_matches_the_whole_response(server):
    body = {"model": "tiny", "prompt": "Tides", "echo": True, "logprobs": 1, "max_tokens": 4, "n": 2,
            "temperature": 0, "ignore_eos": True}
    whole = complete(server, **body)["choices"]
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert "".join(c["text"] for c in mine) == whole[index]["text"]
        assert [t for c in mine for t in c["logprobs"]["token_logprobs"]] == \
            pytest.approx(whole[index]["logprobs"]["token_logprobs"], abs=1e-5)


def test_vllm_prompt_logprobs_field(server, continuous):
    choice = complete(server, prompt=PROMPTS[1], prompt_logprobs=2, max_tokens=1)["choices"][0]
    engine = generate(continuous, [PROMPTS[1]], prompt_logprobs=2)[0].prompt_logprobs
    served = choice["prompt_logprobs"]
    assert served[0] is None and len(served) == len(PROMPTS[1]) and choice["logprobs"] is None
    for position, (entry, local) in enumerate(zip(served[1:], engine[1:])):
        token = PROMPTS[1][position + 1]
        assert list(entry)[0] == str(token) and set(entry) == {str(t) for t in local}
        assert all(entry[str(t)]["logprob"] == pytest.approx(v, abs=1e-5) for t, v in local.items())
        ranks = sorted(e["rank"] for t, e in entry.items() if t != str(token))
        assert ranks[0] == 1 and entry[str(token)]["rank"] >= 1
        assert all(isinstance(e["decoded_token"], str) for e in entry.values())


@pytest.mark.parametrize("path, extra, param", [
    ("/v1/completions", {"max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ("/v1/completions", {"prompt_logprobs": MAX_LOGPROBS + 1}, "prompt_logprobs"),
    ("/v1/completions", {"echo": "yes"}, "echo"),
    ("/v1/chat/completions", {"prompt_logprobs": 1}, "prompt_logprobs"),
    ("/v1/chat/completions", {"echo": True}, "echo"),
])
def test_bad_combinations_get_a_400_naming_the_field(server, path, extra, param):
    base = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"}
    response = httpx.post(server.url + path, json={"model": "tiny", **base, **extra}, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
