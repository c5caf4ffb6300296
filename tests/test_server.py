"""The OpenAI-compatible server on `tiny`, over loopback: the official client, 64 concurrent streams,
disconnects, bad requests, a full queue, and shutdown (SIGTERM to a real server process)."""
import asyncio
import json
import signal

import httpx
import pytest
from openai import BadRequestError, NotFoundError, OpenAI
from prometheus_client.parser import text_string_to_metric_families

from minibatch import LLM, EngineConfig, SamplingParams
from minibatch.serving.server import ServerProcess, ServerThread

TINY = dict(model="tiny", max_batch_size=16, num_kv_blocks=256)


@pytest.fixture(scope="module")
def server():
    with ServerThread(EngineConfig(**TINY), max_waiting=256, max_body_bytes=64 << 10) as running:
        yield running


def scrape(url: str) -> dict[str, float]:
    """/metrics as {sample name (labels summed over): value}, plus {name{reason}: value} for finish reasons."""
    values = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
            if "finished_reason" in sample.labels:
                values[f"{sample.name}{{{sample.labels['finished_reason']}}}"] = sample.value
    return values


def body(i: int, stream: bool) -> tuple[str, dict]:
    """Request i of the concurrency test: completions or chat, sampled with seed i."""
    common = {"model": "tiny", "max_tokens": 6 + i % 5, "temperature": 0.8, "seed": i, "stream": stream,
              "ignore_eos": True}
    if i % 2:
        return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": f"Question {i}?"}]}
    return "/v1/completions", {**common, "prompt": f"Request {i}: tell me about tides."}


async def streamed(client: httpx.AsyncClient, path: str, payload: dict, stop_after: int | None = None) -> dict:
    """Read one SSE response: its text, finish reason, error and whether [DONE] came."""
    out = {"text": "", "finish_reason": None, "error": None, "usage": None, "done": False, "chunks": 0}
    async with client.stream("POST", path, json=payload) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                out["done"] = True
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk or not chunk["choices"]:    # an error, or the closing usage chunk
                out["error"] = chunk.get("error")
                out["usage"] = chunk.get("usage")
                continue
            choice = chunk["choices"][0]
            out["text"] += choice.get("text") or choice.get("delta", {}).get("content") or ""
            out["finish_reason"] = choice["finish_reason"] or out["finish_reason"]
            out["chunks"] += 1
            if stop_after is not None and out["chunks"] >= stop_after:
                break                       # leaving the block closes the connection mid-stream
    return out


async def wait_idle(url: str) -> dict[str, float]:
    """Poll /metrics until no request runs or waits (bounded), then return the scrape."""
    for _ in range(2000):
        values = scrape(url)
        if values["minibatch:num_requests_running"] == values["minibatch:num_requests_waiting"] == 0:
            return values
        await asyncio.sleep(0.05)
    raise AssertionError("the engine never went idle")


def test_openai_client_streaming_and_not(server):
    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == ["tiny"]
    kw = dict(model="tiny", prompt="The tide", max_tokens=7, temperature=0.7, seed=3)
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 7
    assert whole.usage.prompt_tokens == len("The tide") and whole.choices[0].finish_reason == "length"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, seed=1, temperature=0.9)
    parts = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, seed=1,
                                                temperature=0.9, stream=True))
    assert parts[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in parts) == chat.choices[0].message.content
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens == 5
    with pytest.raises(BadRequestError, match="max_tokens"):
        client.completions.create(model="tiny", prompt="x", max_tokens=5000)
    with pytest.raises(NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt="x")


def test_stop_strings_and_stop_tokens(server):
    offline = LLM(EngineConfig(**TINY)).generate("Tides", SamplingParams(max_new_tokens=12), use_tqdm=False)[0]
    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    greedy = dict(model="tiny", prompt="Tides", max_tokens=12, temperature=0)
    assert client.completions.create(**greedy).choices[0].text == offline.text
    text = offline.text
    at = next(k for k in range(2, len(text) - 1) if "\ufffd" not in text[k:k + 2])
    stop = text[at:at + 2]                           # a piece of the greedy output: it must end there
    cut = client.completions.create(**greedy, stop=["never", stop])
    streamed_cut = "".join(c.choices[0].text for c in client.completions.create(**greedy, stop=stop, stream=True))
    assert cut.choices[0].text == streamed_cut == text[:text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    token = offline.token_ids[5]
    by_token = client.completions.create(**greedy, extra_body={"stop_token_ids": [token]})
    assert by_token.choices[0].finish_reason == "stop"
    assert by_token.usage.completion_tokens == offline.token_ids.index(token) + 1


def test_64_concurrent_streaming_clients(server):
    async def main():
        before = scrape(server.url)
        limits = httpx.Limits(max_connections=None)
        async with httpx.AsyncClient(base_url=server.url, timeout=300, limits=limits) as client:
            streams = await asyncio.gather(*(streamed(client, *body(i, True)) for i in range(64)))
        middle = await wait_idle(server.url)
        # a fresh client: on a busy machine the wait can outlast uvicorn's 5 s keep-alive, and a pooled
        # connection the server is closing just then fails with ReadError
        async with httpx.AsyncClient(base_url=server.url, timeout=300, limits=limits) as client:
            wholes = await asyncio.gather(*(client.post(path, json=payload) for path, payload in
                                            (body(i, False) for i in range(64))))
        return before, middle, streams, [w.json() for w in wholes]

    before, middle, streams, wholes = asyncio.run(main())
    for i, (s, w) in enumerate(zip(streams, wholes)):
        choice = w["choices"][0]
        assert s["done"] and s["error"] is None, i
        assert s["text"] == choice.get("text", choice.get("message", {}).get("content")), i
        assert s["finish_reason"] == choice["finish_reason"] == "length", i
        assert w["usage"]["completion_tokens"] == 6 + i % 5, i
    steps = middle["minibatch:iteration_tokens_total_count"] - before["minibatch:iteration_tokens_total_count"]
    tokens = middle["minibatch:generation_tokens_total"] - before["minibatch:generation_tokens_total"]
    assert tokens == sum(6 + i % 5 for i in range(64))
    assert tokens / steps > 1, "no step produced tokens for more than one request: nothing was batched"
    after = scrape(server.url)
    assert after["minibatch:kv_cache_usage_perc"] == 0
    assert server.engine.blocks.num_free_blocks == server.engine.blocks.num_blocks


def test_a_chunk_for_every_token_even_without_text(server):
    """Tokens with no text (here <|im_start|>, skipped as special) still stream a chunk each, as vLLM
    streams them: a client times the first token when it comes, not when text first shows."""
    payload = {"model": "tiny", "prompt": "Hi", "max_tokens": 5, "ignore_eos": True, "logit_bias": {"1": 100},
               "stream": True, "stream_options": {"include_usage": True}}

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            return await streamed(client, "/v1/completions", payload)
    out = asyncio.run(main())
    assert out["done"] and out["text"] == "" and out["finish_reason"] == "length"
    assert out["chunks"] == out["usage"]["completion_tokens"] == 5


def test_a_steps_updates_reach_the_event_loop_in_one_call(monkeypatch):
    """The engine thread wakes the event loop once per step, whatever the number of streams."""
    from minibatch.serving import engine_thread
    calls, deliver = [], engine_thread.deliver

    def counted(updates):
        calls.append(len(updates))
        deliver(updates)
    monkeypatch.setattr(engine_thread, "deliver", counted)

    async def main(url):
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            return await asyncio.gather(*(streamed(client, *body(2 * i, True)) for i in range(8)))   # completions

    with ServerThread(EngineConfig(**TINY)) as running:
        streams = asyncio.run(main(running.url))
        steps = len(running.engine.step_records)
    assert all(s["done"] and s["error"] is None for s in streams)
    assert sum(calls) >= sum(s["chunks"] for s in streams)    # every chunk came through a hand-over
    assert len(calls) <= steps, f"{len(calls)} hand-overs for {steps} steps"
    assert calls and max(calls) > 1, "no step handed over the updates of several requests at once"


def test_disconnect_mid_stream_aborts_and_frees(server):
    long = {"model": "tiny", "prompt": "Go on", "max_tokens": 400, "ignore_eos": True, "stream": True}
    short = {"model": "tiny", "prompt": "Meanwhile", "max_tokens": 16, "temperature": 0.8, "seed": 5}

    async def main():
        before = scrape(server.url)
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as client:
            gone, other = await asyncio.gather(streamed(client, "/v1/completions", long, stop_after=2),
                                               client.post("/v1/completions", json=short))
            with pytest.raises(httpx.ReadTimeout):      # a non-streaming client that gives up
                await client.post("/v1/completions", json={**long, "stream": False, "max_tokens": 1000}, timeout=0.3)
            after = await wait_idle(server.url)
            alone = await client.post("/v1/completions", json=short)
        return before, after, gone, other.json(), alone.json()

    before, after, gone, other, alone = asyncio.run(main())
    assert gone["chunks"] == 2 and not gone["done"]
    key = "minibatch:request_success_total{abort}"
    assert after.get(key, 0) - before.get(key, 0) == 2          # both abandoned requests ended early
    assert other["choices"][0]["text"] == alone["choices"][0]["text"] and other["usage"]["completion_tokens"] == 16
    assert after["minibatch:kv_cache_usage_perc"] == 0
    assert server.engine.blocks.num_free_blocks == server.engine.blocks.num_blocks


GOOD = {"model": "tiny", "prompt": "hello", "max_tokens": 4}
BAD_REQUESTS = [  # (raw body, status, param the error names)
    ("{not json", 400, None),
    ("[1, 2]", 400, None),
    (json.dumps({"model": "tiny", "max_tokens": 4}), 400, "prompt"),
    (json.dumps({**GOOD, "max_tokens": "four"}), 400, "max_tokens"),
    (json.dumps({**GOOD, "max_tokens": 0}), 400, "max_tokens"),
    (json.dumps({**GOOD, "max_tokens": 1024}), 400, "max_tokens"),    # prompt + max_tokens beyond the context
    (json.dumps({**GOOD, "temperature": -0.5}), 400, "temperature"),
    (json.dumps({**GOOD, "top_p": 0}), 400, "top_p"),
    (json.dumps({**GOOD, "stream": "yes"}), 400, "stream"),
    (json.dumps({**GOOD, "n": 0}), 400, "n"),
    (json.dumps({**GOOD, "stop": ["a", "b", "c", "d", "e"]}), 400, "stop"),
    (json.dumps({**GOOD, "frobnicate": 1}), 400, "frobnicate"),
    (json.dumps({**GOOD, "prompt": ""}), 400, "prompt"),
    (json.dumps({**GOOD, "prompt": [1, 100000]}), 400, "prompt"),
    (json.dumps({**GOOD, "prompt": "x" * 2000}), 400, "prompt"),       # longer than the context
    (json.dumps({**GOOD, "model": "gpt-4"}), 404, "model"),
]


@pytest.mark.parametrize("raw, status, param", BAD_REQUESTS, ids=[f"{i}-{p}" for i, (_, _, p) in enumerate(BAD_REQUESTS)])
def test_bad_requests_get_openai_errors(server, raw, status, param):
    response = httpx.post(server.url + "/v1/completions", content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert httpx.post(server.url + "/v1/completions", json=GOOD).status_code == 200   # and the server still serves


def test_bad_chat_and_oversized_bodies(server):
    chat = httpx.post(server.url + "/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "robot", "content": "hi"}]})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages.0.role"
    big = json.dumps({**GOOD, "prompt": "x" * (65 << 10)})
    assert httpx.post(server.url + "/v1/completions", content=big).status_code == 413

    def chunked():                                      # no Content-Length: counted as it arrives
        for _ in range(80):
            yield b"x" * 1024
    refused = httpx.post(server.url + "/v1/completions", content=chunked())
    assert refused.status_code == 413 and refused.json()["error"]["code"] == "body_too_large"
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


def test_full_queue_answers_429():
    long = {"model": "tiny", "prompt": "wait", "max_tokens": 300, "ignore_eos": True, "stream": True}

    async def main(url):
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            async def try_one():
                async with client.stream("POST", "/v1/completions", json=long) as r:
                    return r.status_code, r.headers.get("retry-after"), (await r.aread()) if r.status_code != 200 else None
            return await asyncio.gather(*(try_one() for _ in range(6)))   # the accepted ones disconnect at once

    with ServerThread(EngineConfig(model="tiny", max_batch_size=1, num_kv_blocks=64), max_waiting=2) as small:
        results = asyncio.run(main(small.url))
        refused = [r for r in results if r[0] == 429]
        assert 3 <= len(refused) and all(r[0] in (200, 429) for r in results)   # 1 running + 2 waiting fit
        assert all(retry is not None and int(retry) >= 1 for _, retry, _ in refused)
        assert json.loads(refused[0][2])["error"]["type"] == "rate_limit_error"
        asyncio.run(wait_idle(small.url))
        assert small.engine.blocks.num_free_blocks == small.engine.blocks.num_blocks


def test_shutdown_errors_requests_it_cannot_finish():
    long = {"model": "tiny", "prompt": "long", "max_tokens": 500, "ignore_eos": True}

    async def main(server):
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as client:
            tasks = [asyncio.ensure_future(streamed(client, "/v1/completions", {**long, "stream": True})),
                     asyncio.ensure_future(client.post("/v1/completions", json=long))]
            while scrape(server.url)["minibatch:num_requests_running"] < 2:
                await asyncio.sleep(0.02)
            await asyncio.to_thread(server.stop)            # what SIGTERM does, with no grace time
            return await asyncio.gather(*tasks)

    server = ServerThread(EngineConfig(**TINY), shutdown_timeout_s=0.0)
    stream, whole = asyncio.run(main(server))
    assert stream["error"]["type"] == "server_error" and stream["done"] and stream["finish_reason"] is None
    assert whole.status_code == 503 and "shut down" in whole.json()["error"]["message"]
    assert not server.engine.has_unfinished()
    assert server.engine.blocks.num_free_blocks == server.engine.blocks.num_blocks


def test_sigterm_lets_inflight_requests_finish_then_exits_0():
    payload = {"model": "tiny", "prompt": "almost done", "max_tokens": 24, "ignore_eos": True, "stream": True,
               "stream_options": {"include_usage": True}}

    async def main(proc):
        async with httpx.AsyncClient(base_url=proc.url, timeout=300) as client:
            tasks = [asyncio.ensure_future(streamed(client, "/v1/completions", payload)) for _ in range(2)]
            while scrape(proc.url)["minibatch:generation_tokens_total"] < 2:
                await asyncio.sleep(0.02)
            proc.process.send_signal(signal.SIGTERM)
            return await asyncio.gather(*tasks)

    with ServerProcess("--model", "tiny", "--num-kv-blocks", "64") as proc:
        results = asyncio.run(main(proc))
        assert proc.process.wait(timeout=120) == 0, proc.output()
    for r in results:
        assert r["done"] and r["error"] is None and r["finish_reason"] == "length"
        assert r["usage"]["completion_tokens"] == 24
    with pytest.raises(httpx.ConnectError):
        httpx.get(proc.url + "/health")
