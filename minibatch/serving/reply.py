"""One HTTP response as its continuations' updates arrive: texts, log-probabilities, finish reasons, usage.

The n continuations of a request (its choices) run as separate engine requests and report into one
queue; `Reply` keeps what each has produced, so the handler can stream every update as a chunk of
its choice, or wait until all have ended and answer with the whole response. Usage counts the
prompt once and the completion tokens of every choice, as vLLM does, and the prompt tokens the
prefix cache held (`prompt_tokens_details.cached_tokens`).
"""
from __future__ import annotations

from minibatch.serving.responses import chat_logprobs, choice, completion_body, completion_logprobs, usage


class Reply:
    def __init__(self, rid: str, model: str, chat: bool, num_prompt: int, n: int):
        self.rid, self.model, self.chat, self.num_prompt = rid, model, chat, num_prompt
        self.texts = [[] for _ in range(n)]             # text pieces per choice
        self.logprobs = [None] * n                      # TokenLogprob entries per choice, when asked for
        self.finish_reasons: list[str | None] = [None] * n
        self.num_tokens = [0] * n
        self.ended = [False] * n
        self._offset = [0] * n                          # characters of the choice's text already streamed
        self.num_cached_tokens = 0                      # prompt tokens the prefix cache held (the first choice's)

    @property
    def finished(self) -> bool:
        return all(self.ended)

    def take(self, update) -> None:
        i = update.index
        self.texts[i].append(update.text)
        self.num_tokens[i] = update.num_tokens
        if update.logprobs is not None:
            self.logprobs[i] = (self.logprobs[i] or []) + update.logprobs
        if update.finish_reason:
            self.finish_reasons[i], self.ended[i] = update.finish_reason, True
        if i == 0:
            self.num_cached_tokens = update.num_cached_tokens

    def usage(self) -> dict:
        return usage(self.num_prompt, sum(self.num_tokens), self.num_cached_tokens)

    def _logprobs(self, entries, offset: int) -> dict | None:
        if entries is None:
            return None
        return chat_logprobs(entries) if self.chat else completion_logprobs(entries, offset)

    def choice(self, update, stream: bool) -> dict:
        """The chunk choice for one update (its new text and log-probabilities)."""
        logprobs = self._logprobs(update.logprobs, self._offset[update.index])
        self._offset[update.index] += sum(len(e.token) for e in update.logprobs or ())
        return choice(self.chat, stream, update.index, update.text, update.finish_reason, logprobs)

    def chunk(self, choices: list[dict], with_usage: bool = False) -> dict:
        return completion_body(self.rid, self.model, self.chat, choices, self.usage() if with_usage else None,
                               stream=True)

    def whole(self) -> dict:
        choices = [choice(self.chat, False, i, "".join(self.texts[i]), self.finish_reasons[i],
                          self._logprobs(self.logprobs[i], 0)) for i in range(len(self.texts))]
        return completion_body(self.rid, self.model, self.chat, choices, self.usage())
