"""The server speaks vLLM's dialect: the exact bodies vLLM's benchmark client and the openai client send,
every vLLM extra at its neutral value, the implemented extras over HTTP, and vLLM's utility endpoints."""
import json

import httpx
import pytest
from openai import OpenAI

from minibatch import LLM, EngineConfig, SamplingParams
from minibatch.serving.server import ServerThread
from minibatch.serving.protocol import CHAT_NEUTRAL, COMPLETION_NEUTRAL, LABELS, NEUTRAL

TINY = dict(model="tiny", max_batch_size=16, num_kv_blocks=256)


@pytest.fixture(scope="module")
def server():
    with ServerThread(EngineConfig(**TINY)) as running:
        yield running


def sse(url: str, path: str, body: dict) -> list:
    """The data of every server-sent event of a streamed response, [DONE] as the string."""
    with httpx.stream("POST", url + path, json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        return [line[6:] if line == "data: [DONE]" else json.loads(line[6:])
                for line in response.iter_lines() if line.startswith("data: ")]


def prompt_tokens(url: str, **body) -> int:
    return httpx.post(url + "/tokenize", json=body).json()["count"]


# what `vllm bench serve --backend openai` (completions) and `--backend openai-chat` send, vLLM 0.32
def bench_completions(prompt: str, output_len: int) -> dict:
    return {"model": "tiny", "prompt": prompt, "repetition_penalty": 1.0, "max_tokens": output_len, "logprobs": None,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}


def bench_chat(prompt: str, output_len: int) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": prompt}]}],
            "max_completion_tokens": output_len, "stream": True, "stream_options": {"include_usage": True},
            "ignore_eos": True}


@pytest.mark.parametrize("path, make", [("/v1/completions", bench_completions), ("/v1/chat/completions", bench_chat)])
def test_vllm_bench_bodies_stream_text_then_usage(server, path, make):
    events = sse(server.url, path, make("The tide comes in and the tide goes out", 7))
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 7
    tide = "The tide comes in and the tide goes out"
    expected_prompt = (prompt_tokens(server.url, prompt=tide, add_special_tokens=False)
                       if "messages" not in make("x", 1) else
                       prompt_tokens(server.url, messages=[{"role": "user", "content": tide}]))
    assert usage_chunk["usage"]["prompt_tokens"] == expected_prompt
    assert usage_chunk["usage"]["total_tokens"] == expected_prompt + 7
    assert all(e["choices"] for e in events[:-2]) and events[-3]["choices"][0]["finish_reason"] == "length"


def test_openai_client_with_every_extra_at_neutral(server):
    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    neutral = lambda table: {name: values[0] for name, values in table.items()}
    vllm_extras = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "min_tokens": 0, "stop_token_ids": [],
                   "ignore_eos": True, "priority": 0, "request_id": "abc", "cache_salt": "s"}
    done = client.completions.create(model="tiny", prompt="hello", max_tokens=5, n=1, best_of=1, echo=False,
                                     frequency_penalty=0.0, presence_penalty=0.0, logit_bias={}, logprobs=None,
                                     seed=1, stop=None, suffix=None, temperature=0.0, top_p=1.0, user="me",
                                     extra_body={**neutral(NEUTRAL), **neutral(COMPLETION_NEUTRAL), **vllm_extras})
    assert done.usage.completion_tokens == 5 and len(done.choices) == 1
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                          max_completion_tokens=4, logprobs=False, n=1, frequency_penalty=0.0,
                                          presence_penalty=0.0, temperature=0.0, top_p=1.0, seed=3, user="me",
                                          metadata={"k": "v"}, store=False, parallel_tool_calls=True,
                                          extra_body={**neutral(NEUTRAL), **neutral(CHAT_NEUTRAL), **vllm_extras})
    assert chat.usage.completion_tokens == 4 and chat.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 3 and chunks[-1].choices == []


@pytest.mark.parametrize("path, table", [("/v1/completions", {**NEUTRAL, **COMPLETION_NEUTRAL}),
                                         ("/v1/chat/completions", {**NEUTRAL, **CHAT_NEUTRAL})])
def test_each_unimplemented_field_is_refused_beyond_its_neutral_value(server, path, table):
    base = ({"prompt": "hi"} if "chat" not in path else {"messages": [{"role": "user", "content": "hi"}]})
    for name, neutral in table.items():
        refused = httpx.post(server.url + path, json={"model": "tiny", "max_tokens": 1, **base, name: "not-neutral"})
        assert refused.status_code == 400, name
        error = refused.json()["error"]
        assert error["param"] == name and "not-neutral" in error["message"] and repr(neutral[0]) in error["message"]
    labels = httpx.post(server.url + path, json={"model": "tiny", "max_tokens": 1, **base, **{k: "x" for k in LABELS}})
    assert labels.status_code == 200, labels.text


@pytest.mark.parametrize("extra, param", [({"priority": 1}, "priority"), ({"top_k": -2}, "top_k"),
                                          ({"min_p": 1.5}, "min_p"), ({"repetition_penalty": 0}, "repetition_penalty"),
                                          ({"presence_penalty": 2.5}, "presence_penalty"),
                                          ({"logprobs": 21}, "logprobs"), ({"min_tokens": 9}, "min_tokens"),
                                          ({"best_of": 3}, "best_of"), ({"logit_bias": {"x": 1}}, "logit_bias"),
                                          ({"stream_options": {"include_usage": True}}, "stream_options"),
                                          ({"n": 0}, "n"), ({"beam_width": 2}, "beam_width")])
def test_rejected_values_name_their_field(server, extra, param):
    response = httpx.post(server.url + "/v1/completions",
                          json={"model": "tiny", "prompt": "hi", "max_tokens": 4, **extra})
    assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
    assert param in response.json()["error"]["message"]


def test_chat_top_logprobs_needs_logprobs(server):
    response = httpx.post(server.url + "/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2})
    assert response.status_code == 400 and response.json()["error"]["param"] == "top_logprobs"


def test_logprobs_over_http_are_the_engines(server):
    body = {"model": "tiny", "prompt": [7, 8, 9], "max_tokens": 4, "temperature": 0, "logprobs": 3, "ignore_eos": True}
    served = httpx.post(server.url + "/v1/completions", json=body).json()["choices"][0]["logprobs"]
    local = LLM(EngineConfig(**TINY)).generate([[7, 8, 9]], SamplingParams(max_new_tokens=4, logprobs=3,
                                                                            ignore_eos=True),
                                               use_tqdm=False)[0].outputs[0].logprobs
    chosen = [lp[t] for lp, t in zip(local, [next(iter(d)) for d in local])]
    assert served["token_logprobs"] == pytest.approx(chosen, abs=1e-5)
    assert all(1 <= len(top) <= 4 for top in served["top_logprobs"]) and served["text_offset"][0] == 0   # keyed by text
    chat = httpx.post(server.url + "/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "logprobs": True,
        "top_logprobs": 2, "ignore_eos": True}).json()["choices"][0]["logprobs"]["content"]
    assert len(chat) == 3 and all(len(c["top_logprobs"]) == 2 and c["logprob"] <= 0 for c in chat)
    assert all(c["top_logprobs"][0]["logprob"] >= c["logprob"] for c in chat)
    streamed = sse(server.url, "/v1/completions", {**body, "stream": True})
    tokens = [t for e in streamed[:-1] for t in (e["choices"][0]["logprobs"] or {}).get("token_logprobs", [])]
    assert tokens == pytest.approx(served["token_logprobs"], abs=1e-5)


def test_n_choices_are_indexed_seeded_and_counted(server):
    body = {"model": "tiny", "prompt": "tides", "max_tokens": 5, "temperature": 1.0, "n": 3, "seed": 11,
            "ignore_eos": True}
    first = httpx.post(server.url + "/v1/completions", json=body).json()
    again = httpx.post(server.url + "/v1/completions", json=body).json()
    assert [c["index"] for c in first["choices"]] == [0, 1, 2] and first["choices"] == again["choices"]
    assert first["usage"]["completion_tokens"] == 15 and first["usage"]["prompt_tokens"] == prompt_tokens(
        server.url, prompt="tides", add_special_tokens=False)
    events = sse(server.url, "/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    texts = {}
    for e in events[:-2]:
        for c in e["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
    assert texts == {c["index"]: c["text"] for c in first["choices"]} and events[-2]["usage"]["completion_tokens"] == 15


def test_continuous_usage_stats_count_as_they_go(server):
    events = sse(server.url, "/v1/completions", {"model": "tiny", "prompt": "a", "max_tokens": 4, "ignore_eos": True,
                                                 "stream": True, "stream_options": {"continuous_usage_stats": True}})
    counts = [e["usage"]["completion_tokens"] for e in events[:-1]]
    assert counts == sorted(counts) and counts[-1] == 4


def test_tokenize_detokenize_version(server):
    tokens = httpx.post(server.url + "/tokenize", json={"prompt": "hello tides", "return_token_strs": True}).json()
    assert tokens["count"] == len(tokens["tokens"]) == len(tokens["token_strs"]) and tokens["max_model_len"] > 0
    back = httpx.post(server.url + "/detokenize", json={"tokens": tokens["tokens"]}).json()
    assert back == {"prompt": "hello tides"}
    chat = httpx.post(server.url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] > 1
    assert httpx.post(server.url + "/detokenize", json={"tokens": [10 ** 9]}).json()["error"]["param"] == "tokens"
    assert httpx.post(server.url + "/tokenize", json={"prompt": "x", "model": "gpt-4"}).status_code == 404
    assert isinstance(httpx.get(server.url + "/version").json()["version"], str)


def test_priority_in_the_body_reaches_the_engine():
    """vLLM's `priority` extra: with scheduling_policy="priority" each request carries it into the engine."""
    with ServerThread(EngineConfig(**TINY, scheduling_policy="priority")) as running:
        seen, add = [], running.engine.add_request
        running.engine.add_request = lambda ids, params, **kw: seen.append(params.priority) or add(ids, params, **kw)
        done = httpx.post(running.url + "/v1/completions",
                          json={"model": "tiny", "prompt": "hi", "max_tokens": 2, "priority": -3}, timeout=60)
        chat = httpx.post(running.url + "/v1/chat/completions", timeout=60,
                          json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                "priority": 5})
        assert done.status_code == 200 and chat.status_code == 200, (done.text, chat.text)
    assert seen == [-3, 5]


def test_usage_reports_the_prompt_tokens_the_prefix_cache_held():
    system = "You are a careful assistant who answers in one short sentence. " * 2      # tiny: one token per byte
    with ServerThread(EngineConfig(**TINY, enable_prefix_caching=True, block_size=16)) as running:
        cached = []
        for question in ("Why is the sky blue?", "Why is the sea salty?"):
            body = {"model": "tiny", "max_tokens": 3, "messages": [{"role": "system", "content": system},
                                                                    {"role": "user", "content": question}]}
            cached.append(httpx.post(running.url + "/v1/chat/completions", json=body, timeout=60).json()
                          ["usage"]["prompt_tokens_details"]["cached_tokens"])
            streamed = sse(running.url, "/v1/chat/completions", {**body, "stream": True,
                                                                   "stream_options": {"include_usage": True}})
            assert streamed[-2]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0   # the same prompt again
    assert cached[0] == 0 and cached[1] >= 16 * (len(system) // 16 - 1)    # the shared system prompt's full blocks
