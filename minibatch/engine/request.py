"""A request's life in the engine: its tokens, its status and the moments that make its latency.

A request is WAITING in the queue, RUNNING once the scheduler has given it a slot, PREEMPTED when
its KV blocks were taken back (it waits again and recomputes what it had), and FINISHED exactly
once, with a finish reason ("stop", "length" or "abort"). Time stamps are in seconds on the
engine's clock; the latency metrics (TTFT, TPOT, e2e) are computed from them in `minibatch.analysis.metrics`.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from minibatch.config import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """One prompt being served: what it asked for, what it has produced, and when."""

    request_id: int
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0        # tokens whose K/V are in the cache
    num_cached_tokens: int = 0          # tokens found in the prefix cache at first admission (vLLM)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)  # when each output token was produced
    output_logprobs: list[dict[int, float]] = field(default_factory=list)  # per output token, if params.logprobs
    # per prompt token, if params.prompt_logprobs: None for the first (nothing predicts it), then the token's and the
    # top-N log-probabilities at its position, and the token's rank there (1: the most likely); filled as prefill runs
    prompt_logprobs: list[dict[int, float] | None] | None = None
    prompt_token_ranks: list[int | None] | None = None
    finish_time: float | None = None
    finish_reason: str | None = None    # "stop" (EOS or stop token), "length" (max_new_tokens), "abort"
    num_preemptions: int = 0

    def __post_init__(self):
        if self.params.prompt_logprobs is not None:
            self.prompt_logprobs, self.prompt_token_ranks = [None], [None]

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens: what the cache must hold to produce the next token."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def max_total_tokens(self) -> int:
        """The most tokens this request can ever hold in the cache."""
        return len(self.prompt_token_ids) + self.params.max_new_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def finish(self, reason: str, now: float) -> None:
        assert self.status is not RequestStatus.FINISHED, f"request {self.request_id} finished twice"
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason
        self.finish_time = now
