"""Workloads: requests that arrive over time, and their JSONL trace format.

A workload is a list of `WorkloadRequest`s, each an arrival time in seconds from the start of
the run, a prompt (text, token ids or a chat) and its sampling parameters. On disk it is JSON
Lines, one request per line, with the sampling fields flattened:

    {"arrival_s": 0.25, "prompt": "Tell me about tides.", "max_new_tokens": 64, "temperature": 0.0}
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from minibatch.config import ConfigError, SamplingParams

_PARAM_FIELDS = {f.name for f in fields(SamplingParams)}


@dataclass
class WorkloadRequest:
    arrival_s: float                 # seconds after the start of the run
    prompt: str | list               # text, token ids, or chat messages
    params: SamplingParams

    def __post_init__(self):
        if isinstance(self.arrival_s, bool) or not isinstance(self.arrival_s, (int, float)) or not self.arrival_s >= 0:
            raise ConfigError(f"WorkloadRequest.arrival_s={self.arrival_s!r} is not allowed: a number >= 0")

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
