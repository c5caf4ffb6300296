"""The OpenAI wire format: request bodies as pydantic models, response bodies as plain dicts.

Request models are strict (a string is not a number) and forbid unknown fields, so a typo gets a
400 naming the field instead of being silently ignored. Fields that OpenAI defines but this server
does not implement (logprobs, penalties, several choices) are accepted only at their default
value. `top_k`, `ignore_eos` and `stop_token_ids` are extensions with vLLM's names.
"""
from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, model_validator


class APIError(Exception):
    """An error the client caused (or a busy server), returned as OpenAI's error JSON."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    include_usage: bool = False           # send a last chunk carrying the token counts


class _Sampling(BaseModel):
    """Fields shared by both endpoints."""

    model_config = ConfigDict(strict=True, extra="forbid")
    model: StrictStr
    max_tokens: StrictInt | None = Field(None, ge=1)    # None: 16 for completions, the rest of the context for chat
    temperature: float = Field(1.0, ge=0.0, le=2.0)     # OpenAI's default and range; 0 is greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: StrictInt = Field(0, ge=0)                   # extension (vLLM): 0 keeps every token
    seed: StrictInt | None = Field(None, ge=0)          # the same seed gives the same output, whatever the batch
    stop: StrictStr | list[StrictStr] | None = None     # up to 4 strings; the output ends before the first one
    stop_token_ids: list[StrictInt] = Field(default_factory=list)  # extension (vLLM)
    ignore_eos: bool = False                            # extension (vLLM): keep going past EOS, for benchmarks
    n: StrictInt = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: StrictStr | None = None                       # accepted and ignored, as a label for the caller
    # accepted only at their defaults: this server does not implement them
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict | None = None

    @model_validator(mode="after")
    def _supported(self):
        """Checks across fields; raises APIError (not ValueError) so the 400 names the field."""
        if self.n != 1:
            raise APIError(400, f"n={self.n} is not supported: this server returns exactly one choice (n=1)", param="n")
        stops = self.stop_strings
        if len(stops) > 4 or not all(stops):
            raise APIError(400, f"stop={self.stop!r} is not allowed: at most 4 non-empty strings", param="stop")
        if any(t < 0 for t in self.stop_token_ids):
            raise APIError(400, f"stop_token_ids={self.stop_token_ids!r} is not allowed: token ids are >= 0",
                           param="stop_token_ids")
        for name, default in self._unsupported().items():
            if getattr(self, name) not in default:
                raise APIError(400, f"{name}={getattr(self, name)!r} is not supported by this server; leave it "
                               f"out or set it to {default[0]!r}", param=name)
        return self

    def _unsupported(self) -> dict:
        return {"frequency_penalty": (0.0,), "presence_penalty": (0.0,), "logit_bias": (None, {})}

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    prompt: StrictStr | list[StrictInt]                 # text, or token ids
    echo: bool = False
    logprobs: StrictInt | None = None
    best_of: StrictInt | None = None
    suffix: StrictStr | None = None

    def _unsupported(self) -> dict:
        return {**super()._unsupported(), "echo": (False,), "logprobs": (None,), "best_of": (None, 1),
                "suffix": (None,)}


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")  # e.g. `name`, which the chat template ignores
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart]

    def plain(self) -> dict:
        """{"role", "content"} with the content as one string, as chat templates expect."""
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)  # the newer name of max_tokens
    logprobs: bool = False
    top_logprobs: StrictInt | None = None
    tools: list | None = None
    response_format: dict | None = None

    def _unsupported(self) -> dict:
        return {**super()._unsupported(), "logprobs": (False,), "top_logprobs": (None,), "tools": (None, []),
                "response_format": (None, {"type": "text"})}

    @property
    def wanted_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


# ---- responses: dicts shaped like OpenAI's ------------------------------------------------------

def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_body(rid: str, model: str, chat: bool, text: str | None, finish_reason: str | None,
                    use: dict | None = None, stream: bool = False, first: bool = False) -> dict:
    """A whole response (stream=False) or one streamed chunk; text=None makes a usage-only chunk."""
    if chat:
        if stream:
            delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish_reason}
        kind = "chat.completion.chunk" if stream else "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        kind = "text_completion"
    body = {"id": rid, "object": kind, "created": int(time.time()), "model": model,
            "choices": [] if text is None and stream else [choice], "system_fingerprint": None}
    if use is not None:
        body["usage"] = use
    return body
