"""Models the engine can serve: the registry of names, and loaders for the weights the engine's
own forward pass reads (`load_model`), for the transformers reference (`load_hf`), and without
weights (`load_model_spec`); the sizes the engine reads from any of them (`ModelShape`).

Set up the default model once with `python -m minibatch prepare`.
"""

from minibatch.engine.models.loader import (LoadedModel, check_supported, load_hf, load_model, load_model_spec,
                                           rope_theta)
from minibatch.engine.models.registry import DEFAULT_MODEL, KNOWN_MODELS
from minibatch.engine.models.shape import ModelShape
from minibatch.engine.models.smollm2 import model_cache_dir, prepare_default_model

__all__ = [
    "DEFAULT_MODEL",
    "KNOWN_MODELS",
    "LoadedModel",
    "ModelShape",
    "check_supported",
    "load_hf",
    "load_model",
    "load_model_spec",
    "model_cache_dir",
    "prepare_default_model",
    "rope_theta",
]
