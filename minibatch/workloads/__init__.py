"""Workloads: requests that arrive over time, how to draw them, and their JSONL trace format.

A workload is a list of `WorkloadRequest`s, each an arrival time in seconds from the start of
the run, a prompt (text, token ids or a chat) and its sampling parameters. On disk it is JSON
Lines, one request per line, with the sampling fields flattened:

    {"arrival_s": 0.25, "prompt": "Tell me about tides.", "max_new_tokens": 64, "temperature": 0.0}

`make_workload` draws one from an arrival process and length distributions
(`minibatch.workloads.distributions`) with a seed, using the prompt texts shipped with the package:

    make_workload(200, Poisson(rate=4.0), output_len=LogNormal(median=32, sigma=0.6, cap=256), seed=0)

`ClosedLoop(users, think_s)` is the other arrival process: N users who each send a request, wait for
the answer, think, and send the next, so the load follows the server's speed. Its arrival times are
known only while the workload is served: `llm.run(workload, arrival=ClosedLoop(users=4))`.
"""
from __future__ import annotations

import heapq
import json
from collections import deque
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from minibatch.config import ConfigError, SamplingParams
from minibatch.engine.arrivals import Arrivals
from minibatch.workloads.distributions import (AllAtOnce, Bursts, Empirical, Exponential, Fixed, LogNormal,  # noqa: F401
                                               Poisson, Uniform)
from minibatch.validate import check_int, check_number

PROMPTS_FILE = Path(__file__).resolve().parent / "prompts" / "prompts.json"

_PARAM_FIELDS = {f.name for f in fields(SamplingParams)}


@dataclass
class WorkloadRequest:
    arrival_s: float                 # seconds after the start of the run
    prompt: str | list               # text, token ids, or chat messages
    params: SamplingParams

    def __post_init__(self):
        check_number("WorkloadRequest", "arrival_s", self.arrival_s, 0.0)

    def to_json(self) -> dict:
        params = {k: v for k, v in asdict(self.params).items() if v != getattr(SamplingParams(), k)}
        return {"arrival_s": self.arrival_s, "prompt": self.prompt, **params}

    @classmethod
    def from_json(cls, obj: dict) -> "WorkloadRequest":
        if not isinstance(obj, dict):
            raise ConfigError(f"a workload line must be a JSON object, not {type(obj).__name__}")
        unknown = set(obj) - _PARAM_FIELDS - {"arrival_s", "prompt"}
        if unknown:
            raise ConfigError(f"unknown field {sorted(unknown)[0]!r}: allowed are arrival_s, prompt, "
                              + ", ".join(sorted(_PARAM_FIELDS)))
        if "prompt" not in obj:
            raise ConfigError("field 'prompt' is missing")
        params = {k: v for k, v in obj.items() if k in _PARAM_FIELDS}
        if "stop_token_ids" in params and isinstance(params["stop_token_ids"], list):
            params["stop_token_ids"] = tuple(params["stop_token_ids"])
        if isinstance(params.get("logit_bias"), dict):          # JSON keys are strings; token ids are ints
            params["logit_bias"] = {int(t) if str(t).isdigit() else t: b for t, b in params["logit_bias"].items()}
        return cls(obj.get("arrival_s", 0.0), obj["prompt"], SamplingParams(**params))


def save_workload(workload: list[WorkloadRequest], path) -> None:
    with open(path, "w") as f:
        for request in workload:
            f.write(json.dumps(request.to_json()) + "\n")


def load_workload(path) -> list[WorkloadRequest]:
    """Read a JSONL trace; a bad line raises ConfigError naming the file and line number."""
    workload = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            workload.append(WorkloadRequest.from_json(json.loads(line)))
        except (json.JSONDecodeError, ConfigError, TypeError) as error:
            raise ConfigError(f"{path}, line {number}: {error}") from None
    return workload


def load_prompts(kind: str | None = None) -> list[str]:
    """The prompt texts shipped with the package (questions, code, long passages, ...), or those of one kind."""
    entries = json.loads(PROMPTS_FILE.read_text())
    kinds = sorted({e["kind"] for e in entries})
    if kind is not None and kind not in kinds:
        raise ConfigError(f"kind={kind!r} is not allowed: choose one of {', '.join(map(repr, kinds))} or None")
    return [e["text"] for e in entries if kind in (None, e["kind"])]


def make_workload(num_requests: int, arrival=AllAtOnce(), output_len=Fixed(32), prompt_len=None, prompts=None,
                  tokenizer=None, as_chat: bool = False, ignore_eos: bool = True, temperature: float = 0.0,
                  seed: int = 0) -> list[WorkloadRequest]:
    """Draw a workload. Prompts are the shipped texts (or `prompts`) in a seeded random order; with
    `prompt_len` (a length distribution) each becomes exactly that many token ids of the texts, cut
    with `tokenizer`. `ignore_eos=True` (the default) makes every request produce its drawn output length."""
    if isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests < 1:
        raise ConfigError(f"num_requests={num_requests!r} is not allowed: an integer >= 1")
    if not hasattr(arrival, "times"):
        raise ConfigError(f"arrival={arrival!r} is not allowed: use AllAtOnce(), Poisson(rate) or Bursts(size, "
                          "every_s); serve a closed loop with llm.run(workload, arrival=ClosedLoop(users, think_s))")
    texts = list(prompts) if prompts is not None else load_prompts()
    if not texts or not all(isinstance(t, str) and t for t in texts):
        raise ConfigError("prompts is not allowed: give a non-empty list of non-empty strings")
    if prompt_len is not None and tokenizer is None:
        raise ConfigError("prompt_len needs tokenizer=... (e.g. llm.tokenizer) to cut prompts to exact token counts")
    rng_arrival, rng_prompt, rng_in, rng_out = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4))
    times = arrival.times(rng_arrival, num_requests)
    order = rng_prompt.permutation(num_requests) % len(texts)
    outputs = output_len.sample(rng_out, num_requests)
    chosen = [texts[i] for i in order]
    if prompt_len is not None:
        shuffled = "\n\n".join(texts[i] for i in rng_prompt.permutation(len(texts)))
        stream = tokenizer.encode(shuffled, add_special_tokens=False)
        lengths = prompt_len.sample(rng_in, num_requests)
        starts = rng_prompt.integers(0, len(stream), size=num_requests)
        chosen = [[stream[(s + j) % len(stream)] for j in range(n)] for s, n in zip(starts, lengths)]
    elif as_chat:
        chosen = [[{"role": "user", "content": t}] for t in chosen]
    return [WorkloadRequest(float(t), p,
                            SamplingParams(max_new_tokens=int(n), ignore_eos=ignore_eos, temperature=temperature))
            for t, p, n in zip(times, chosen, outputs)]


@dataclass(frozen=True)
class ClosedLoop:
    """N users, each sending a request, waiting for its answer, then thinking before the next one."""

    users: int           # concurrent users
    think_s: float = 0.0  # mean think time in seconds (exponentially distributed); 0 asks again at once
    seed: int = 0        # seed of the think times

    def __post_init__(self):
        check_int("ClosedLoop", "users", self.users, 1)
        check_number("ClosedLoop", "think_s", self.think_s, 0.0)

    def arrivals(self, items: list[tuple], start: float, on_step=None) -> Arrivals:
        """The requests' source for `LLMEngine.serve`, as `LLM.run(workload, arrival=...)` asks for it: `items`
        are (arrival_s, prompt ids, params), sent in order (their arrival_s is ignored) from `start` on."""
        return _Users(self, [(prompt_ids, params) for _, prompt_ids, params in items], start, on_step)


class _Users(Arrivals):
    """A closed loop's arrivals: a user asks when ready, and is ready again a think time after the answer."""

    def __init__(self, loop: ClosedLoop, todo: list[tuple], start: float, on_step=None):
        self.todo, self.on_step = deque(enumerate(todo)), on_step or (lambda finished: None)
        self.think_s, self.rng = loop.think_s, np.random.default_rng(loop.seed)
        self.ready = [(start, user) for user in range(loop.users)]   # heap: (when the user asks next, user)
        self.owner, self.requests = {}, {}                             # request id -> user; index -> Request

    def admit(self, engine) -> bool:
        while self.todo and self.ready and self.ready[0][0] <= engine.clock.now():
            when, user = heapq.heappop(self.ready)
            i, (prompt_ids, params) = self.todo.popleft()
            self.requests[i] = engine.add_request(prompt_ids, params, arrival_time=when)
            self.owner[self.requests[i].request_id] = user
        return bool(self.todo)

    def next_event(self) -> float | None:
        return self.ready[0][0] if self.todo and self.ready else None

    def after_step(self, finished: list) -> None:
        for r in finished:
            think = self.rng.exponential(self.think_s) if self.think_s > 0 else 0.0
            heapq.heappush(self.ready, (r.finish_time + think, self.owner[r.request_id]))
        self.on_step(finished)
