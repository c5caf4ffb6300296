"""Prompts in, text out: turning what a user sends into checked token ids, and back.

A prompt is a string, a list of token ids, or a chat (a list of {"role", "content"} messages,
rendered with the model's own chat template). A checkpoint without tokenizer files still serves
token-id prompts, as vLLM's `skip_tokenizer_init` does. Output text grows token by token through
an `OutputDecoder`, which decodes only the newest tokens (tokenizers' `DecodeStream`), never the
whole output again.
"""
from __future__ import annotations

from tokenizers.decoders import DecodeStream

from minibatch.config import ConfigError


def is_chat(prompt) -> bool:
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(m, dict) for m in prompt)


class PromptEncoder:
    def __init__(self, tokenizer, vocab_size: int, max_model_len: int):
        self.tokenizer, self.vocab_size, self.max_model_len = tokenizer, vocab_size, max_model_len

    def _need_tokenizer(self, what: str):
        if self.tokenizer is None:
            raise ConfigError(f"prompt is {what}, but this model has no tokenizer files: pass token ids instead")

    def encode(self, prompt, field: str = "prompt") -> list[int]:
        """Checked token ids for a string, token-id or chat prompt."""
        if isinstance(prompt, str):
            if not prompt:
                raise ConfigError(f"{field}='' is not allowed: a prompt needs at least one token")
            self._need_tokenizer("a string")
            ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        elif is_chat(prompt):
            self._need_tokenizer("a chat")
            if any(set(m) - {"role", "content"} or not isinstance(m.get("content"), str) for m in prompt):
                raise ConfigError(f"{field} is not allowed: chat messages are {{'role': str, 'content': str}} dicts")
            text = self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        elif isinstance(prompt, (list, tuple)):
            if not prompt:
                raise ConfigError(f"{field}=[] is not allowed: a prompt needs at least one token")
            bad = [t for t in prompt if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size]
            if bad:
                raise ConfigError(f"{field} holds token id {bad[0]!r}: "
                                  f"token ids are integers in [0, {self.vocab_size})")
            ids = list(prompt)
        else:
            raise ConfigError(f"{field}={prompt!r} is not allowed: pass a string, a list of token ids or a chat")
        if not ids:
            raise ConfigError(f"{field}={prompt!r} encodes to no tokens")
        if len(ids) >= self.max_model_len:
            raise ConfigError(f"{field} has {len(ids)} tokens: the model's context (max_model_len) allows at most "
                              f"{self.max_model_len - 1} prompt tokens")
        return ids

    def decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def output_decoder(self) -> OutputDecoder:
        return OutputDecoder(self)


class OutputDecoder:
    """One request's output text as its tokens arrive, in constant work per token.

    A token that ends inside a multi-byte character (an emoji split over byte tokens) yields no text
    until the character completes; `finish` flushes what such an unfinished tail decodes to (U+FFFD),
    so the pushed texts, joined, are exactly `decode(all the tokens)`.
    """

    def __init__(self, prompts: PromptEncoder):
        self.prompts = prompts
        self.stream = DecodeStream(skip_special_tokens=True)
        self.last_ids: list[int] = []    # the tokens of the last text the stream gave: context for a flush
        self.held_ids: list[int] = []    # tokens pushed since, whose text the stream still holds back

    def push(self, token_ids: list[int]) -> str:
        """The text the new tokens complete."""
        if self.prompts.tokenizer is None:
            return ""
        backend, pieces = self.prompts.tokenizer.backend_tokenizer, []
        for token_id in token_ids:
            piece = self.stream.step(backend, token_id)
            self.held_ids.append(token_id)
            if piece is not None:
                pieces.append(piece)
                self.last_ids, self.held_ids = self.held_ids, []
        return "".join(pieces)

    def finish(self) -> str:
        """The text of the tokens still held back, once no more will come."""
        if not self.held_ids:
            return ""
        context = self.prompts.decode(self.last_ids)
        return self.prompts.decode(self.last_ids + self.held_ids)[len(context):]
