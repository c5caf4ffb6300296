"""The OpenAI wire format with vLLM's extensions: request bodies as pydantic models.

Request models are strict (a string is not a number) and forbid unknown fields, so a typo gets a
400 naming the field instead of being silently ignored. They take the sampling fields vLLM's
OpenAI server takes, with vLLM's names and meanings (`top_k`, `min_p`, the penalties, `min_tokens`,
`stop_token_ids`, `ignore_eos`, `logprobs`, `n`, `priority`, ...); on completions, OpenAI's `echo`
(with `max_tokens` 0 too) and vLLM's `prompt_logprobs` as well. Fields that OpenAI's or vLLM's
clients send but this server does not implement (beam search, guided decoding, tools, ...) are
accepted at their neutral value and answered with a 400 naming the field otherwise (`NEUTRAL`).
Labels that change nothing (`user`, `metadata`, `request_id`, ...) are accepted and ignored.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, model_validator

from minibatch.config import MAX_LOGPROBS


class APIError(Exception):
    """An error the client caused (or a busy server), returned as OpenAI's error JSON."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# field -> the values that leave it without effect: accepted, anything else is a 400
NEUTRAL = {
    "use_beam_search": (False,), "length_penalty": (1.0,), "include_stop_str_in_output": (False,),
    "skip_special_tokens": (True,), "spaces_between_special_tokens": (True,), "truncate_prompt_tokens": (None,),
    "allowed_token_ids": (None,), "bad_words": (None, []), "logits_processors": (None,),
    "return_tokens_as_token_ids": (False, None), "return_token_ids": (False, None), "kv_transfer_params": (None,),
    "vllm_xargs": (None, {}), "response_format": (None, {"type": "text"}), "structured_outputs": (None,),
    "guided_json": (None,), "guided_regex": (None,), "guided_choice": (None,), "guided_grammar": (None,),
    "guided_decoding_backend": (None,), "guided_whitespace_pattern": (None,), "mm_processor_kwargs": (None, {}),
    "watermarking": (None, False), "truncation_side": (None, "left", "right"), "logprob_token_ids": (None,),
    "prompt_embeds": (None,), "routed_experts_prompt_start": (0,), "return_token_offsets": (None, False),
    "mm_payload": ("tensors",), "return_mm_kwargs": (None, False), "ec_transfer_params": (None,),
    "repetition_detection": (None,), "thinking_token_budget": (None, -1), "stream_interval": (None, 1),
    "media_io_kwargs": (None, {}),
}
COMPLETION_NEUTRAL = {"suffix": (None,), "add_special_tokens": (True,)}
CHAT_NEUTRAL = {
    "tools": (None, []), "tool_choice": (None, "none", "auto"), "parallel_tool_calls": (None, True, False),
    "functions": (None, []), "function_call": (None, "none", "auto"), "add_generation_prompt": (True,),
    "continue_final_message": (False,), "echo": (False,), "add_special_tokens": (False,), "chat_template": (None,),
    "chat_template_kwargs": (None, {}), "documents": (None,), "reasoning_effort": (None,), "audio": (None,),
    "modalities": (None, ["text"]), "prediction": (None,), "web_search_options": (None,), "verbosity": (None,),
    "include_reasoning": (True, False), "return_prompt_text": (None, False), "prompt_logprobs": (None,),
}
# labels for the caller or for caches elsewhere: accepted with any value, they change nothing here
LABELS = ("user", "metadata", "request_id", "session_id", "cache_salt", "store", "service_tier", "prompt_cache_key",
          "safety_identifier")


def drop_neutral(data, neutral: dict):
    """Drop from a body the fields accepted only at a neutral value (and the labels); raises APIError."""
    if not isinstance(data, dict):
        return data
    for name in [k for k in data if k in neutral or k in LABELS]:
        value = data.pop(name)
        if name in neutral and value not in neutral[name]:
            allowed = " or ".join(repr(v) for v in neutral[name])
            raise APIError(400, f"{name}={value!r} is not supported by this server: leave it out or set it "
                           f"to {allowed}", param=name)
    return data


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    include_usage: bool | None = False           # send a last chunk carrying the token counts
    continuous_usage_stats: bool | None = False  # vLLM: every chunk carries the token counts so far


class _Sampling(BaseModel):
    """Fields shared by both endpoints."""

    model_config = ConfigDict(strict=True, extra="forbid")
    model: StrictStr | None = None                      # None: the served model
    max_tokens: StrictInt | None = Field(None, ge=1)    # None: 16 for completions, the rest of the context for chat
    min_tokens: StrictInt = Field(0, ge=0)              # vLLM: no EOS or stop token before this many tokens
    # null means the default, as in vLLM: temperature 1 (OpenAI's), top_p 1, top_k off, min_p 0, no penalties
    temperature: float | None = Field(None, ge=0.0, le=2.0)  # 0 is greedy
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: StrictInt | None = Field(None, ge=-1)        # vLLM: 0 or -1 keeps every token
    min_p: float | None = Field(None, ge=0.0, le=1.0)   # vLLM: drop tokens below min_p x the top probability
    repetition_penalty: float | None = Field(None, gt=0.0)  # vLLM/HF: > 1 discourages tokens of the prompt and output
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[StrictStr, float] | None = None    # token id (as a string) -> bias in [-100, 100]
    seed: StrictInt | None = Field(None, ge=0)          # the same seed gives the same output, whatever the batch
    stop: StrictStr | list[StrictStr] | None = None     # up to 4 strings; the output ends before the first one
    stop_token_ids: list[StrictInt] | None = None       # vLLM: token ids that end the output
    ignore_eos: bool = False                            # vLLM: keep going past EOS, for benchmarks
    n: StrictInt | None = Field(1, ge=1)                # continuations of the prompt, as choices 0..n-1
    priority: StrictInt = 0                             # vLLM: only 0 unless the engine schedules by priority
    stream: bool | None = False
    stream_options: StreamOptions | None = None

    @model_validator(mode="before")
    @classmethod
    def _neutral_extras(cls, data):
        return drop_neutral(data, cls._neutral())

    @classmethod
    def _neutral(cls) -> dict:
        return NEUTRAL

    @model_validator(mode="after")
    def _supported(self):
        """Checks across fields; raises APIError (not ValueError) so the 400 names the field."""
        stops = self.stop_strings
        if len(stops) > 4 or not all(stops):
            raise APIError(400, f"stop={self.stop!r} is not allowed: at most 4 non-empty strings", param="stop")
        if any(t < 0 for t in self.stop_token_ids or ()):
            raise APIError(400, f"stop_token_ids={self.stop_token_ids!r} is not allowed: token ids are >= 0",
                           param="stop_token_ids")
        if self.logit_bias and not all(k.isdigit() and -100 <= b <= 100 for k, b in self.logit_bias.items()):
            raise APIError(400, f"logit_bias={self.logit_bias!r} is not allowed: keys are token ids (strings of "
                           "digits), values are in [-100, 100]", param="logit_bias")
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed with stream=true", param="stream_options")
        return self

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)

    def sampling_fields(self) -> dict:
        """SamplingParams keywords (max_new_tokens aside) with vLLM's names; null takes the default."""
        given = lambda value, default: default if value is None else value
        return dict(min_tokens=self.min_tokens, n=given(self.n, 1), temperature=given(self.temperature, 1.0),
                    top_k=given(self.top_k, 0), top_p=given(self.top_p, 1.0), min_p=given(self.min_p, 0.0),
                    repetition_penalty=given(self.repetition_penalty, 1.0),
                    presence_penalty=given(self.presence_penalty, 0.0),
                    frequency_penalty=given(self.frequency_penalty, 0.0),
                    logit_bias={int(k): b for k, b in self.logit_bias.items()} if self.logit_bias else None,
                    seed=self.seed, stop_token_ids=tuple(self.stop_token_ids or ()), ignore_eos=self.ignore_eos,
                    logprobs=self.num_logprobs, prompt_logprobs=self.num_prompt_logprobs, priority=self.priority)

    @property
    def num_prompt_logprobs(self) -> int | None:
        return None


class CompletionRequest(_Sampling):
    prompt: StrictStr | list[StrictInt]                 # text, or token ids
    max_tokens: StrictInt | None = Field(None, ge=0)    # None: 16; 0 only with echo (the prompt alone is scored)
    logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)  # top log-probabilities per token
    echo: bool = False                                  # the prompt's text (and with logprobs, its tokens) first
    prompt_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)  # vLLM: choices[i].prompt_logprobs
    best_of: StrictInt | None = None                    # accepted when it equals n: one sample per choice

    @classmethod
    def _neutral(cls) -> dict:
        return {**NEUTRAL, **COMPLETION_NEUTRAL}

    @model_validator(mode="after")
    def _best_of(self):
        if self.best_of not in (None, self.n or 1):
            raise APIError(400, f"best_of={self.best_of} is not supported by this server: leave it out or set it "
                           f"to n={self.n or 1}", param="best_of")
        if self.max_tokens == 0 and not self.echo:
            raise APIError(400, "max_tokens=0 is only allowed with echo=true (the prompt alone, scored with "
                           "logprobs); ask for at least 1 token", param="max_tokens")
        if self.prompt_logprobs is not None and self.stream:
            raise APIError(400, f"prompt_logprobs={self.prompt_logprobs} is not allowed with stream=true (vLLM): "
                           "leave it out, or use echo=true with logprobs", param="prompt_logprobs")
        return self

    @property
    def echo_only(self) -> bool:
        """max_tokens 0 with echo: the engine computes one token, which the response leaves out (vLLM)."""
        return self.echo and self.max_tokens == 0

    @property
    def num_prompt_logprobs(self) -> int | None:
        """vLLM's rule: prompt_logprobs if given, else with echo the logprobs' N (the echoed tokens are scored)."""
        return self.prompt_logprobs if self.prompt_logprobs is not None or not self.echo else self.logprobs

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def wanted_tokens(self) -> int | None:
        return 1 if self.echo_only else self.max_tokens


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
    logprobs: bool | None = False                       # return the chosen tokens' log-probabilities
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)  # and the N most likely at each position

    @classmethod
    def _neutral(cls) -> dict:
        return {**NEUTRAL, **CHAT_NEUTRAL}

    @model_validator(mode="after")
    def _top_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise APIError(400, f"top_logprobs={self.top_logprobs} is only allowed with logprobs=true",
                           param="top_logprobs")
        return self

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def wanted_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens
