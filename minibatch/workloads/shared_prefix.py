"""A chat workload whose requests open with one of a few system prompts: what prefix caching reuses.

Every request to an assistant starts with the same instructions (the system prompt) and then the
user's own words. `shared_prompt_workload` draws such requests as token ids, so lengths are exact:
`num_system_prompts` system prompts of `system_len` tokens each (cut from the shipped texts at
different places, so no two share even their first block), each request taking one of them at
random and then a user turn of its own (one of the shipped questions, after the user's number, so no
two requests share more than their system prompt), arriving as `arrival` says.

    shared_prompt_workload(llm.tokenizer, 40, system_len=256, num_system_prompts=2, arrival=Poisson(4.0))
"""
from __future__ import annotations

import numpy as np

from minibatch.config import ConfigError, SamplingParams
from minibatch.workloads import WorkloadRequest, load_prompts
from minibatch.workloads.distributions import AllAtOnce, Fixed


def system_prompts(tokenizer, count: int, length: int) -> list[list[int]]:
    """`count` system prompts of exactly `length` token ids, from the shipped texts, each starting elsewhere."""
    stream = tokenizer.encode("\n\n".join(load_prompts()), add_special_tokens=False)
    step = len(stream) // count
    return [[stream[(i * step + j) % len(stream)] for j in range(length)] for i in range(count)]


def shared_prompt_workload(tokenizer, num_requests: int, system_len: int = 256, num_system_prompts: int = 1,
                           arrival=AllAtOnce(), output_len=Fixed(16), seed: int = 0) -> list[WorkloadRequest]:
    """Requests of one of `num_system_prompts` system prompts (`system_len` tokens) and a shipped question."""
    for name, value, low in (("num_requests", num_requests, 1), ("system_len", system_len, 0),
                             ("num_system_prompts", num_system_prompts, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{name}={value!r} is not allowed: an integer >= {low}")
    rng_arrival, rng_prompt, rng_out = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    systems = system_prompts(tokenizer, num_system_prompts, system_len)
    questions = load_prompts("question")
    times = arrival.times(rng_arrival, num_requests)
    which = rng_prompt.integers(0, num_system_prompts, size=num_requests)
    asked = rng_prompt.integers(0, len(questions), size=num_requests)
    outputs = output_len.sample(rng_out, num_requests)
    turns = [tokenizer.encode(f"\n\nUser {i}: {questions[q]}\nAssistant:", add_special_tokens=False)
             for i, q in enumerate(asked)]
    return [WorkloadRequest(float(t), systems[s] + turn, SamplingParams(max_new_tokens=int(n), ignore_eos=True))
            for t, s, turn, n in zip(times, which, turns, outputs)]
