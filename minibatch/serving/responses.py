"""Response bodies shaped like OpenAI's (and vLLM's): whole responses, streamed chunks, usage, logprobs.

A response carries one choice per continuation (`n`), indexed from 0. Log-probabilities come in
two shapes: the legacy completions one (parallel lists `tokens`, `token_logprobs`, `top_logprobs`
as {token: logprob} dicts that include the chosen token, `text_offset`), and the chat one (a
`content` list with each token, its logprob, its UTF-8 bytes and its `top_logprobs`). An echoed
prompt's first token has no log-probability: null in both lists, as OpenAI and vLLM send it.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

LOWEST_LOGPROB = -9999.0   # JSON has no -infinity: impossible tokens get this, as in vLLM


@dataclass
class TokenLogprob:
    token: str                          # the chosen token's text
    logprob: float | None               # None for a prompt's first token: nothing predicts it
    top: list[tuple[str, float]] | None  # the N most likely tokens at this position, most likely first


def token_entry(token_id: int, logprobs: dict[int, float], n: int, decode) -> TokenLogprob:
    """One token's entry from the engine's {token id: log-probability} (the token's and the top-N's)."""
    top = sorted(logprobs.items(), key=lambda item: -item[1])[:n]
    return TokenLogprob(decode([token_id]), logprobs[token_id], [(decode([t]), lp) for t, lp in top])


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def finite(logprob: float | None) -> float | None:
    return None if logprob is None else max(logprob, LOWEST_LOGPROB)


def completion_logprobs(entries: list[TokenLogprob], offset: int) -> dict:
    """The legacy completions shape; offset: characters of output text before the first entry."""
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e.token)
    return {"tokens": [e.token for e in entries], "token_logprobs": [finite(e.logprob) for e in entries],
            "top_logprobs": [None if e.top is None else {e.token: finite(e.logprob)} | {t: finite(lp)
                                                                                        for t, lp in e.top}
                             for e in entries],
            "text_offset": offsets}


def chat_logprobs(entries: list[TokenLogprob]) -> dict:
    item = lambda token, logprob: {"token": token, "logprob": finite(logprob), "bytes": list(token.encode())}
    return {"content": [{**item(e.token, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
                        for e in entries]}


def choice(chat: bool, stream: bool, index: int, text: str, finish_reason: str | None,
           logprobs: dict | None = None, first: bool = False) -> dict:
    """One choice of a response (stream=False) or of a streamed chunk."""
    if not chat:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
    if stream:
        delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
            "finish_reason": finish_reason}


def completion_body(rid: str, model: str, chat: bool, choices: list[dict], use: dict | None = None,
                    stream: bool = False) -> dict:
    """A whole response or one streamed chunk; a chunk with no choices carries only the usage."""
    kind = ("chat.completion.chunk" if stream else "chat.completion") if chat else "text_completion"
    body = {"id": rid, "object": kind, "created": int(time.time()), "model": model, "choices": choices,
            "system_fingerprint": None}
    if use is not None:
        body["usage"] = use
    return body
