"""vLLM's utility endpoints: /tokenize, /detokenize and /version, with vLLM's request and response shapes.

    POST /tokenize   {"prompt": "Hello"} or {"messages": [...]}  ->  {"count", "max_model_len", "tokens", "token_strs"}
    POST /detokenize {"tokens": [9906]}                           ->  {"prompt": "Hello"}
    GET  /version                                                 ->  {"version": "0.1.0"}

They run on the event loop with the server's own copy of the tokenizer; the engine never sees them.
"""
from __future__ import annotations

from importlib import metadata

from fastapi import Body
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, model_validator

from minibatch.serving.protocol import CHAT_NEUTRAL, NEUTRAL, APIError, ChatMessage, drop_neutral


class TokenizeCompletion(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    model: StrictStr | None = None
    prompt: StrictStr
    add_special_tokens: bool = True                     # as vLLM: the tokenizer's BOS and the like
    return_token_strs: bool | None = False              # also the tokens' strings


class TokenizeChat(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    model: StrictStr | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True                  # end with the assistant's turn, as generation does
    add_special_tokens: bool = False                    # the chat template already holds them
    return_token_strs: bool | None = False
    continue_final_message: bool = False

    @model_validator(mode="before")
    @classmethod
    def _neutral_extras(cls, data):
        neutral = {**NEUTRAL, **CHAT_NEUTRAL}
        return drop_neutral(data, {k: neutral[k] for k in ("chat_template", "chat_template_kwargs", "tools",
                                                           "mm_processor_kwargs", "media_io_kwargs", "documents")})


class Detokenize(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    model: StrictStr | None = None
    tokens: list[StrictInt]


def minibatch_version() -> str:
    try:
        return metadata.version("minibatch")
    except metadata.PackageNotFoundError:
        return "unknown"


def add_utility_routes(app, server) -> None:
    """Add /tokenize, /detokenize and /version to `app`, served by `server` (an OpenAIServer)."""

    def tokenizer():
        if server.encoder.tokenizer is None:
            raise APIError(400, "this model has no tokenizer files: it serves token ids only")
        return server.encoder.tokenizer

    @app.post("/tokenize")
    async def tokenize(raw: dict = Body(...)):
        try:      # a chat has messages, a completion a prompt: vLLM's two request shapes
            body = (TokenizeChat if "messages" in raw else TokenizeCompletion).model_validate(raw)
        except ValidationError as error:
            raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in error.errors()]) from None
        server.check_model(body.model)
        tok = tokenizer()
        if isinstance(body, TokenizeChat):
            if body.continue_final_message and body.add_generation_prompt:
                raise APIError(400, "continue_final_message=true is not allowed with add_generation_prompt=true",
                               param="continue_final_message")
            text = tok.apply_chat_template([m.plain() for m in body.messages], tokenize=False,
                                           add_generation_prompt=body.add_generation_prompt,
                                           continue_final_message=body.continue_final_message)
        else:
            text = body.prompt
        ids = tok.encode(text, add_special_tokens=body.add_special_tokens)
        return {"count": len(ids), "max_model_len": server.engine.max_model_len, "tokens": ids,
                "token_strs": tok.convert_ids_to_tokens(ids) if body.return_token_strs else None}

    @app.post("/detokenize")
    async def detokenize(body: Detokenize):
        server.check_model(body.model)
        vocab = server.engine.model.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"tokens holds token id {bad[0]}: token ids are integers in [0, {vocab})",
                           param="tokens")
        return {"prompt": tokenizer().decode(body.tokens)}

    @app.get("/version")
    async def version():
        return {"version": minibatch_version()}
