"""The prompt in a completions response: OpenAI's `echo` and vLLM's `prompt_logprobs`.

How an evaluation harness scores a model through a server: it sends a context and a continuation
as one prompt with `echo: true, logprobs: 1, max_tokens: 0` and sums the continuation tokens'
log-probabilities. With `echo`, each choice's text starts with the prompt's; with `logprobs` as
well, its legacy log-probabilities start with the prompt's tokens, the first with null (nothing
predicts it), the others from the engine's `SamplingParams.prompt_logprobs` (vLLM scores the echoed
prompt with the same N). With `max_tokens` 0 a choice is the prompt alone: the engine computes one
token, which the response leaves out, as vLLM does. vLLM's own field `prompt_logprobs: N` adds
`choices[i].prompt_logprobs`: null, then per position {token id: {"logprob", "rank",
"decoded_token"}} with the prompt's token first and the top-N after it. Both are built on the event
loop, with its own tokenizer, from what the engine kept for the request.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from minibatch.serving.responses import TokenLogprob, finite, token_entry


@dataclass
class PromptEcho:
    """What a completions request asked about its prompt, and the means to write it out."""

    token_ids: list[int]
    text: str | None                     # prepended to each choice's text (echo), else None
    only: bool                           # max_tokens 0: the choices are the prompt alone
    num_logprobs: int | None             # the legacy logprobs' N: with echo, the prompt's entries come first
    vllm_field: bool                     # the choices carry vLLM's prompt_logprobs
    decode: Callable[[list[int]], str]

    @classmethod
    def of(cls, body, token_ids: list[int], decode) -> PromptEcho | None:
        """The echo a CompletionRequest asks for; None when it asks for nothing about its prompt."""
        if not body.echo and body.prompt_logprobs is None:
            return None
        text = (body.prompt if isinstance(body.prompt, str) else decode(token_ids)) if body.echo else None
        return cls(token_ids, text, body.echo_only, body.logprobs if body.echo else None,
                   body.prompt_logprobs is not None, decode)

    def entries(self, scores: list) -> list[TokenLogprob]:
        """The prompt's tokens as legacy log-probability entries; scores: the engine's prompt_logprobs."""
        first = TokenLogprob(self.decode([self.token_ids[0]]), None, None)
        return [first] + [token_entry(token, logprobs, self.num_logprobs, self.decode)
                          for token, logprobs in zip(self.token_ids[1:], scores[1:])]

    def vllm(self, scores: list, ranks: list) -> list:
        """vLLM's choices[i].prompt_logprobs: None, then {token id: {logprob, rank, decoded_token}} per position."""
        out = [None]
        for token, logprobs, rank in zip(self.token_ids[1:], scores[1:], ranks[1:]):
            item = lambda t, r: {"logprob": finite(logprobs[t]), "rank": r, "decoded_token": self.decode([t])}
            ranked = sorted(logprobs, key=lambda t: -logprobs[t])      # the top-N in order (and the token)
            out.append({str(token): item(token, rank)} |
                       {str(t): item(t, i + 1) for i, t in enumerate(ranked) if t != token})
        return out
