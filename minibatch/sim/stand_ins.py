"""What the engine runs instead of the model when `EngineConfig(clock="simulated", sim_skip_model=True)`.

Scheduling, KV accounting and metrics need only the model's shape (layers, KV heads, head size,
vocabulary, context) and its tokenizer, never its weights. So this mode reads the config and the
tokenizer, keeps the KV tensors on PyTorch's "meta" device (sizes without memory), and replaces
the forward pass and the sampler with stand-ins: every sequence that samples gets a placeholder
token that is neither an end-of-sequence token nor one of its stop tokens, so each request runs to
exactly `max_new_tokens`, as with `ignore_eos=True`. Time comes from the simulated clock.
"""
from __future__ import annotations

import functools
import pathlib

from minibatch.engine.models import LoadedModel, check_supported, prepare_default_model
from minibatch.engine.models.loader import TOKENIZER_FILES
from minibatch.engine.models.registry import resolve
from minibatch.engine.models.tiny import smollm2_shaped_config, tiny_config, tiny_tokenizer
from minibatch.engine.sampling import SampledToken


@functools.lru_cache(maxsize=8)
def load_model_spec(name: str) -> LoadedModel:
    """A LoadedModel with config, tokenizer and stop tokens but no weights (an empty state_dict)."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    source = resolve(name)
    generation = None
    if source.ref == "tiny":
        config, tokenizer = tiny_config(), tiny_tokenizer()
    elif source.ref.endswith("-random"):
        config = smollm2_shaped_config(source.ref.removeprefix("smollm2-").removesuffix("-random"))
        tokenizer = AutoTokenizer.from_pretrained(prepare_default_model())
    else:
        folder = str(prepare_default_model()) if source.ref == "smollm2-135m" else source.ref
        config = AutoConfig.from_pretrained(folder)
        has_tokenizer = source.kind == "hub" or any((pathlib.Path(folder) / f).is_file() for f in TOKENIZER_FILES)
        tokenizer = AutoTokenizer.from_pretrained(folder) if has_tokenizer else None
        try:
            generation = GenerationConfig.from_pretrained(folder)
        except OSError:  # no generation_config.json
            pass
    check_supported(config, str(name))
    eos = [getattr(generation, "eos_token_id", None), config.eos_token_id,
           tokenizer.eos_token_id if tokenizer is not None else None]
    flat = [i for e in eos if e is not None for i in ([e] if isinstance(e, int) else e)]
    return LoadedModel(str(name), config, {}, tokenizer, list(dict.fromkeys(flat)))


class ShapeOnlyModel:
    """The sizes the engine reads from a model (as LlamaModel has them), without weights."""

    def __init__(self, loaded: LoadedModel):
        cfg = loaded.config
        self.num_layers = cfg.num_hidden_layers
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.vocab_size = cfg.vocab_size


class PlaceholderRunner:
    """Runs nothing: a step's only effect is the time the simulated clock charges for it."""

    def execute(self, plan) -> None:
        return None


class PlaceholderSampler:
    """Gives each sampling sequence the smallest token id that would not stop it."""

    def __init__(self, eos_token_ids):
        self.eos_token_ids = set(eos_token_ids)
        self._token: dict[tuple, int] = {}   # stop_token_ids -> the placeholder for requests with them

    def _placeholder(self, stop_token_ids: tuple) -> int:
        if stop_token_ids not in self._token:
            avoid = self.eos_token_ids | set(stop_token_ids)
            self._token[stop_token_ids] = min(set(range(len(avoid) + 1)) - avoid)
        return self._token[stop_token_ids]

    def sample(self, logits, requests: list) -> list[SampledToken]:
        return [SampledToken(self._placeholder(r.params.stop_token_ids)) for r in requests]

    def release(self, request_id: int) -> None:
        pass
