"""The FastAPI application: OpenAI's endpoints in front of the engine thread.

A request is checked completely on the event loop (schema, model name, prompt length, KV room)
before the engine sees it, so a bad one costs the engine nothing and gets a 400 that names the
field. An accepted one becomes a `Job`; the handler then reads the job's updates as they arrive,
either streaming each as a server-sent event or collecting them into one response. If the client
goes away first, the job is aborted and its KV blocks return to the pool before the next step.
"""
from __future__ import annotations

import asyncio
import copy
import json
import re
import reprlib
import time
from contextlib import asynccontextmanager
from dataclasses import replace

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from minibatch.config import ConfigError, SamplingParams
from minibatch.engine.llm_engine import LLMEngine
from minibatch.serving.monitoring import CONTENT_TYPE
from minibatch.serving.echo import PromptEcho
from minibatch.serving.engine_thread import EngineThread, Job
from minibatch.serving.protocol import APIError, ChatCompletionRequest, CompletionRequest
from minibatch.serving.reply import Reply
from minibatch.serving.responses import choice, new_id
from minibatch.serving.utilities import add_utility_routes
from minibatch.engine.tokens import PromptEncoder

DEFAULT_COMPLETION_TOKENS = 16   # OpenAI's default max_tokens for /v1/completions


def event(body) -> str:
    """One server-sent event in OpenAI's framing."""
    return f"data: {body if isinstance(body, str) else json.dumps(body)}\n\n"


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def validation_error(exc: RequestValidationError) -> APIError:
    """The first pydantic error as a 400 naming the field, the value and what is allowed."""
    first = exc.errors()[0]
    if first["type"] == "json_invalid":
        return APIError(400, f"the body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}")
    loc = [str(part) for part in first["loc"] if part != "body"]
    param = ".".join(loc) or None
    got = f" (got {reprlib.repr(first['input'])})" if first["type"] != "missing" and loc else ""
    return APIError(400, f"{param or 'body'}: {first['msg']}{got}", param=param)


class OpenAIServer:
    """The app's state: the engine thread, a tokenizer for the event loop, and the limits."""

    def __init__(self, engine: LLMEngine, model_name: str, max_waiting: int, shutdown_grace_s: float, on_abort=None):
        self.engine, self.model_name, self.shutdown_grace_s = engine, model_name, shutdown_grace_s
        self.worker = EngineThread(engine, max_waiting, on_abort)
        # a fast tokenizer must not be used from two threads at once: the event loop gets its own copy
        self.encoder = PromptEncoder(copy.deepcopy(engine.tokenizer), engine.model.vocab_size, engine.max_model_len)

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(404, f"model={model!r} does not exist: this server serves {self.model_name!r}",
                           param="model", code="model_not_found")

    def prepare(self, body, chat: bool) -> tuple[list[Job], int]:
        """Check a request and turn it into one Job per continuation; raises APIError. Returns (jobs, prompt tokens)."""
        self.check_model(body.model)
        field = "messages" if chat else "prompt"
        prompt = [m.plain() for m in body.messages] if chat else body.prompt
        try:
            ids = self.encoder.encode(prompt, field=field)
        except ConfigError as error:
            raise APIError(400, str(error), param=field) from None
        room = self.engine.max_model_len - len(ids)
        wanted = body.wanted_tokens
        max_tokens = wanted if wanted is not None else (room if chat else min(DEFAULT_COMPLETION_TOKENS, room))
        if max_tokens > room:
            raise APIError(400, f"max_tokens={max_tokens} is too large: the prompt has {len(ids)} tokens and the "
                           f"context (max_model_len) is {self.engine.max_model_len}, so at most {room} fit",
                           param="max_completion_tokens" if chat and body.max_completion_tokens else "max_tokens")
        try:
            params = SamplingParams(max_new_tokens=max_tokens, **body.sampling_fields())
            self.engine.check_request(ids, params.for_sample(0))
        except ConfigError as error:
            named = re.match(r"SamplingParams\.(\w+)=", str(error))
            raise APIError(400, str(error), param=named and {"max_new_tokens": "max_tokens"}.get(named[1], named[1])) from None
        # stamped now, not when the engine thread takes it in at the next step: that wait is part of its TTFT
        loop, arrival, updates = asyncio.get_running_loop(), self.engine.clock.now(), asyncio.Queue()
        samples = [params.for_sample(i) for i in range(params.n)]        # the first scores the prompt (if asked)
        if body.stream and params.prompt_logprobs is not None:           # each streamed choice echoes it at once
            samples = [replace(p, prompt_logprobs=params.prompt_logprobs) for p in samples]
        return [Job(ids, p, body.stop_strings, loop, arrival, i, updates) for i, p in enumerate(samples)], len(ids)

    async def complete(self, body, request: Request, chat: bool):
        jobs, num_prompt = self.prepare(body, chat)
        self.worker.submit(jobs)
        echo = None if chat else PromptEcho.of(body, jobs[0].prompt_ids, self.encoder.decode)
        reply = Reply(new_id("chatcmpl" if chat else "cmpl"), self.model_name, chat, num_prompt, len(jobs), echo)
        if body.stream:
            return StreamingResponse(self.stream(jobs, reply, body.include_usage, body.continuous_usage),
                                     media_type="text/event-stream")
        return await self.collect(jobs, reply, request)

    async def stream(self, jobs: list[Job], reply: Reply, include_usage: bool, continuous_usage: bool):
        updates = jobs[0].updates
        try:
            named = set()
            while not reply.finished:
                update = await updates.get()
                if update.error:
                    yield event(APIError(503, update.error, "server_error").body())
                    break
                if reply.chat and update.index not in named:   # a choice's first chunk names the role (as
                    named.add(update.index)                     # vLLM, once the first token is out)
                    yield event(reply.chunk([choice(True, True, update.index, "", None, first=True)]))
                reply.take(update)
                yield event(reply.chunk([reply.choice(update, stream=True)], continuous_usage))
            else:
                if include_usage:
                    yield event(reply.chunk([], True))
            yield event("[DONE]")
        finally:
            for job in jobs:
                if not reply.ended[job.index]:       # the client went away (or the server is cancelling)
                    self.worker.abort(job)

    async def collect(self, jobs: list[Job], reply: Reply, request: Request):
        gone = asyncio.ensure_future(wait_disconnect(request))
        try:
            while not reply.finished:
                get = asyncio.ensure_future(jobs[0].updates.get())
                await asyncio.wait([get, gone], return_when=asyncio.FIRST_COMPLETED)
                if not get.done():
                    get.cancel()
                    return Response(status_code=499)  # nobody is listening any more
                update = get.result()
                if update.error:
                    return error_response(APIError(503, update.error, "server_error"))
                reply.take(update)
            return reply.whole()
        finally:
            gone.cancel()
            for job in jobs:
                if not reply.ended[job.index]:       # gone, or another continuation failed
                    self.worker.abort(job)


async def wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def build_app(server: OpenAIServer, metrics_text) -> FastAPI:
    """The FastAPI app around `server`; `metrics_text()` returns the Prometheus exposition."""

    @asynccontextmanager
    async def lifespan(app):
        server.worker.start()
        yield
        server.worker.stop(server.shutdown_grace_s)
        await asyncio.to_thread(server.worker.join)

    app = FastAPI(title="minibatch", lifespan=lifespan)
    app.state.server = server
    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def bad_body(request, exc: RequestValidationError):
        return error_response(validation_error(exc))

    @app.exception_handler(HTTPException)
    async def http_error(request, exc: HTTPException):   # unknown path, wrong method
        return error_response(APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}"))

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await server.complete(body, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await server.complete(body, request, chat=True)

    @app.get("/v1/models")
    async def models():
        card = {"id": server.model_name, "object": "model", "created": int(time.time()), "owned_by": "minibatch",
                "max_model_len": server.engine.max_model_len}
        return {"object": "list", "data": [card]}

    add_utility_routes(app, server)

    @app.get("/health")
    async def health():
        if not server.worker.alive:
            return error_response(APIError(503, "the engine is not running", "server_error"))
        return {"status": "ok"}

    @app.get("/metrics")
    def metrics():                               # a plain def: FastAPI runs it on a worker thread
        return Response(metrics_text(), media_type=CONTENT_TYPE)

    return app
