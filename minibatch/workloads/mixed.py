"""A mixed workload: interactive chats and long document jobs sharing one server.

Two classes of request, drawn with a seed so every run sees the same traffic:
- "chat": a person waiting for the first words; short prompts (`CHAT_PROMPT` tokens), short
  answers, Poisson arrivals at `chat_rate`, plus a rush hour at `rush_rate` during `rush`;
- "document": a batch job over a long text (`DOC_PROMPT` tokens: summarise, extract, answer),
  Poisson arrivals at `doc_rate`.
`long_prompt_burst` draws another day: chats that are still decoding when a burst of long
documents (`BURST_PROMPT` tokens, short answers) arrives within a few seconds.
Chats carry priority 0 and documents priority 1 (lower is served first with
`scheduling_policy="priority"`, vLLM's convention; the engine refuses it under the other policies,
so `minibatch.tools.fairness.compare_policies` sends priority 0 to them).
Prompts are token ids (the simulated clock needs only their lengths); they are meant for
`EngineConfig(clock="simulated", sim_skip_model=True)` and fit any model with 1,000 ids or more.
"""
from __future__ import annotations

import numpy as np

from minibatch.config import ConfigError, SamplingParams
from minibatch.workloads import WorkloadRequest
from minibatch.workloads.distributions import Poisson, Uniform

CHAT_PROMPT, CHAT_OUTPUT = Uniform(16, 64), Uniform(16, 48)       # tokens: a question, an answer of a few lines
DOC_PROMPT, DOC_OUTPUT = Uniform(600, 1400), Uniform(32, 64)     # tokens: a few pages in, a summary out
BURST_CHAT_OUTPUT = Uniform(48, 96)                                # tokens: answers long enough to span a burst
BURST_PROMPT, BURST_OUTPUT = Uniform(800, 1200), Uniform(8, 16)    # tokens: a long document in, a short answer out
PRIORITY = {"chat": 0, "document": 1}


def _draw(kind: str, times: np.ndarray, prompt_len: Uniform, output_len: Uniform, rng) -> list[WorkloadRequest]:
    lengths, outputs = prompt_len.sample(rng, len(times)), output_len.sample(rng, len(times))
    return [WorkloadRequest(float(t), rng.integers(100, 1000, size=int(n)).tolist(),
                            SamplingParams(max_new_tokens=int(m), ignore_eos=True, priority=PRIORITY[kind]))
            for t, n, m in zip(times, lengths, outputs)]


def chat_and_documents(duration_s: float = 300.0, chat_rate: float = 0.25, doc_rate: float = 0.03,
                       rush: tuple[float, float] = (120.0, 60.0), rush_rate: float = 1.2,
                       seed: int = 0) -> tuple[list[WorkloadRequest], list[str]]:
    """(requests in arrival order, each one's class): chats and documents over `duration_s` seconds,
    with chats at `rush_rate` per second during `rush` = (start_s, length_s). Each part draws from its
    own seed, so the documents and the chats before the rush stay the same when the rush changes."""
    rush_start, rush_length = rush
    if not 0 <= rush_start <= rush_start + rush_length <= duration_s:
        raise ConfigError(f"rush={rush!r} is not allowed: (start_s, length_s) with 0 <= start_s and "
                          f"start_s + length_s <= duration_s={duration_s!r}")
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)]

    def arrivals(rng, rate: float, start: float, length: float) -> np.ndarray:
        times = Poisson(rate).times(rng, int(rate * length * 3) + 10) + start
        return times[times < start + length]

    parts = [("document", arrivals(rngs[0], doc_rate, 0.0, duration_s), rngs[0]),
             ("chat", arrivals(rngs[1], chat_rate, 0.0, rush_start), rngs[1]),
             ("chat", arrivals(rngs[2], rush_rate, rush_start, rush_length), rngs[2]),
             ("chat", arrivals(rngs[3], chat_rate, rush_start + rush_length, duration_s - rush_start - rush_length),
              rngs[3])]
    tagged = [(w, kind) for kind, times, rng in parts
              for w in _draw(kind, times, *((CHAT_PROMPT, CHAT_OUTPUT) if kind == "chat" else (DOC_PROMPT, DOC_OUTPUT)),
                             rng)]
    tagged.sort(key=lambda pair: pair[0].arrival_s)
    return [w for w, _ in tagged], [kind for _, kind in tagged]


def long_prompt_burst(chat_rate: float = 0.8, burst_at_s: float = 15.0, num_documents: int = 6,
                      burst_length_s: float = 3.0, seed: int = 0) -> tuple[list[WorkloadRequest], list[str]]:
    """(requests in arrival order, each one's class): chats arriving at `chat_rate` per second until
    `burst_at_s`, answering `BURST_CHAT_OUTPUT` tokens so that they are still decoding when
    `num_documents` long prompts arrive, uniformly within `burst_length_s` seconds from `burst_at_s`."""
    if num_documents < 1 or burst_at_s <= 0 or burst_length_s < 0:
        raise ConfigError(f"num_documents={num_documents!r}, burst_at_s={burst_at_s!r}, burst_length_s="
                          f"{burst_length_s!r}: at least one document, a burst after some chats (> 0 s) and a "
                          "length >= 0 s")
    chat_rng, doc_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    chat_times = Poisson(chat_rate).times(chat_rng, int(chat_rate * burst_at_s * 3) + 10)
    chat_times = chat_times[chat_times < burst_at_s]
    doc_times = np.sort(doc_rng.uniform(burst_at_s, burst_at_s + burst_length_s, num_documents))
    tagged = [(w, "chat") for w in _draw("chat", chat_times, CHAT_PROMPT, BURST_CHAT_OUTPUT, chat_rng)]
    tagged += [(w, "document") for w in _draw("document", doc_times, BURST_PROMPT, BURST_OUTPUT, doc_rng)]
    tagged.sort(key=lambda pair: pair[0].arrival_s)
    return [w for w, _ in tagged], [kind for _, kind in tagged]
