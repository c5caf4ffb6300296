"""One HTTP response as its continuations' updates arrive: texts, log-probabilities, finish reasons, usage.

The n continuations of a request (its choices) run as separate engine requests and report into one
queue; `Reply` keeps what each has produced, so the handler can stream every update as a chunk of
its choice, or wait until all have ended and answer with the whole response. Usage counts the
prompt once and the completion tokens of every choice, as vLLM does, and the prompt tokens the
prefix cache held (`prompt_tokens_details.cached_tokens`). A completions request that echoes its
prompt or asks for its log-probabilities carries a `PromptEcho` (`serving/echo.py`): each choice
then starts with the prompt (in its first chunk, when streamed).
"""
from __future__ import annotations

from minibatch.serving.echo import PromptEcho
from minibatch.serving.responses import chat_logprobs, choice, completion_body, completion_logprobs, usage


class Reply:
    def __init__(self, rid: str, model: str, chat: bool, num_prompt: int, n: int, echo: PromptEcho | None = None):
        self.rid, self.model, self.chat, self.num_prompt, self.echo = rid, model, chat, num_prompt, echo
        self.prompt_scores = None                       # the engine's (prompt_logprobs, ranks), when asked for
        self.echoed = [False] * n                       # the choice's first chunk (with the prompt) went out
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

    @property
    def only_prompt(self) -> bool:
        """max_tokens 0 with echo: the one token the engine computed is left out."""
        return self.echo is not None and self.echo.only

    def take(self, update) -> None:
        i = update.index
        if update.prompt_logprobs is not None and self.prompt_scores is None:
            self.prompt_scores = update.prompt_logprobs
        if not self.only_prompt:
            self.texts[i].append(update.text)
            self.num_tokens[i] = update.num_tokens
            if update.logprobs is not None:
                self.logprobs[i] = (self.logprobs[i] or []) + update.logprobs
        if update.finish_reason:
            self.finish_reasons[i] = "length" if self.only_prompt else update.finish_reason
            self.ended[i] = True
        if i == 0:
            self.num_cached_tokens = update.num_cached_tokens

    def usage(self) -> dict:
        return usage(self.num_prompt, sum(self.num_tokens), self.num_cached_tokens)

    def _logprobs(self, entries, offset: int) -> dict | None:
        if entries is None:
            return None
        return chat_logprobs(entries) if self.chat else completion_logprobs(entries, offset)

    def _with_prompt(self, text: str, entries):
        """A choice's text and log-probability entries with the echoed prompt first (and alone with max_tokens 0)."""
        if self.only_prompt:
            text, entries = "", None if entries is None else []
        if self.echo is None or self.echo.text is None:
            return text, entries
        if self.echo.num_logprobs is not None:
            entries = self.echo.entries(self.prompt_scores[0]) + (entries or [])
        return self.echo.text + text, entries

    def choice(self, update, stream: bool) -> dict:
        """The chunk choice for one update (its new text and log-probabilities; the prompt first, if echoed)."""
        i = update.index
        text, entries = update.text, update.logprobs
        if not self.echoed[i]:
            self.echoed[i] = True
            text, entries = self._with_prompt(text, entries)
        elif self.only_prompt:
            text, entries = "", None if entries is None else []
        logprobs = self._logprobs(entries, self._offset[i])
        self._offset[i] += sum(len(e.token) for e in entries or ())
        return choice(self.chat, stream, i, text, self.finish_reasons[i] if update.finish_reason else None, logprobs)

    def chunk(self, choices: list[dict], with_usage: bool = False) -> dict:
        return completion_body(self.rid, self.model, self.chat, choices, self.usage() if with_usage else None,
                               stream=True)

    def whole(self) -> dict:
        choices = []
        for i in range(len(self.texts)):
            text, entries = self._with_prompt("".join(self.texts[i]), self.logprobs[i])
            choices.append(choice(self.chat, False, i, text, self.finish_reasons[i], self._logprobs(entries, 0)))
            if self.echo is not None and self.echo.vllm_field:
                choices[-1]["prompt_logprobs"] = self.echo.vllm(*self.prompt_scores)
        return completion_body(self.rid, self.model, self.chat, choices, self.usage())
