"""Load a model by name: the transformers model that serves as the reference (`load_hf`), the
plain weights, config and tokenizer that the engine's own forward pass reads (`load_model`), and
the same without weights for the simulator and the memory arithmetic (`load_model_spec`). All
three find the model through one dispatch (`_find`) and stop at the same end-of-sequence tokens.

The engine reads a local checkpoint's safetensors files directly (`_read_checkpoint`): its weights
are the same tensors transformers would load, and skipping transformers' modelling code saves
seconds of imports in every process that never builds the reference. Random models, hub ids and
checkpoints in other formats go through transformers.

Only the Llama architecture is supported (and Mistral without sliding-window attention, which is
the same network): RMSNorm, rotary position embeddings without scaling, grouped-query attention,
a SwiGLU MLP, no biases; embeddings tied or untied. Anything else is refused with a clear error
before weights are read.
"""

import functools
import json
import pathlib
from dataclasses import dataclass

import torch
from safetensors.torch import load_file
from transformers import GenerationConfig, PretrainedConfig, PreTrainedTokenizerFast
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from minibatch.engine.models.registry import KNOWN_MODELS, resolve
from minibatch.engine.models.smollm2 import prepare_default_model
from minibatch.engine.models.tiny import random_llama, smollm2_shaped_config, tiny_config, tiny_tokenizer

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")
FAST_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")  # a tokenizer.json, read as it is
# Every field of config.json the engine reads. A local Llama whose config.json names them all is read as written;
# otherwise transformers fills in its defaults (AutoConfig: a second or more of imports, so only when needed).
ENGINE_CONFIG_FIELDS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                        "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "max_position_embeddings",
                        "hidden_act", "tie_word_embeddings")


@dataclass
class LoadedModel:
    """Everything the engine needs to run a model; weights keep Hugging Face names."""

    name: str
    config: PretrainedConfig  # hidden_size, num_attention_heads, num_key_value_heads, head_dim, ...
    state_dict: dict[str, torch.Tensor]  # includes lm_head.weight (the embedding itself when tied)
    tokenizer: PreTrainedTokenizerBase | None  # None: the checkpoint has no tokenizer files
    eos_token_ids: list[int]  # generation stops at any of these


def rope_theta(config) -> float:
    """The RoPE base of a config, wherever this transformers version keeps it.

    transformers 5 keeps {"rope_type", "rope_theta", ...} in config.rope_parameters; 4.x kept
    config.rope_theta and a separate config.rope_scaling. Only plain RoPE is supported.
    """
    params = getattr(config, "rope_parameters", None)
    if params and "rope_theta" not in params:
        raise ValueError(f"rope_parameters={params!r}: RoPE that differs per layer type is not supported")
    if params:  # transformers 5
        theta, kind = params["rope_theta"], params.get("rope_type", params.get("type", "default"))
        partial = params.get("partial_rotary_factor", 1.0)
    else:  # transformers 4
        scaling = getattr(config, "rope_scaling", None) or {}
        theta, kind = getattr(config, "rope_theta", None), scaling.get("rope_type", scaling.get("type", "default"))
        partial = getattr(config, "partial_rotary_factor", 1.0)
    if kind != "default":
        raise ValueError(f"rope_type={kind!r} (scaled RoPE) is not supported; allowed: 'default' (plain RoPE)")
    if partial not in (None, 1.0):
        raise ValueError(f"partial_rotary_factor={partial!r} is not supported; allowed: 1.0 (RoPE on every dim)")
    if theta is None:
        raise ValueError("the model config has no rope_theta")
    return float(theta)


def check_supported(config: PretrainedConfig, name: str) -> None:
    """Raise ValueError unless `config` describes a network the engine's Llama forward pass computes."""
    kind = config.model_type
    if kind not in ("llama", "mistral"):
        raise ValueError(
            f"model={name!r} has model_type={kind!r}; allowed: 'llama' (or 'mistral' without sliding window)"
        )
    if getattr(config, "sliding_window", None) is not None:
        raise ValueError(f"model={name!r}: sliding_window={config.sliding_window} is not supported; allowed: None")
    for field in ("attention_bias", "mlp_bias"):
        if getattr(config, field, False):
            raise ValueError(f"model={name!r}: {field}=True (weights with biases) is not supported; allowed: False")
    if config.hidden_act != "silu":
        raise ValueError(f"model={name!r}: hidden_act={config.hidden_act!r} is not supported; allowed: 'silu'")
    rope_theta(config)
    if getattr(config, "head_dim", None) is None:  # older configs leave it implicit; every reader takes it from here
        config.head_dim = config.hidden_size // config.num_attention_heads


@dataclass
class _Found:
    config: PretrainedConfig
    tokenizer: PreTrainedTokenizerBase | None
    weights: str | None          # the folder or hub id holding the weights; None: random weights from the config


def _find(name: str) -> _Found:
    """Where `name`'s config, tokenizer and weights come from: the one dispatch over model sources."""
    source = resolve(name)
    if source.ref == "tiny":
        found = _Found(tiny_config(), tiny_tokenizer(), None)
    elif source.kind == "builtin" and source.ref != "smollm2-135m":  # smollm2-*-random: SmolLM2 shapes and tokenizer
        size = source.ref.removeprefix("smollm2-").removesuffix("-random")
        found = _Found(smollm2_shaped_config(size), _tokenizer(str(prepare_default_model()), from_hub=False), None)
    else:  # a local folder, a hub id, or the converted SmolLM2-135M-Instruct
        ref = str(prepare_default_model()) if source.kind == "builtin" else source.ref
        found = _Found(_config(ref, from_hub=source.kind == "hub"), _tokenizer(ref, from_hub=source.kind == "hub"), ref)
    check_supported(found.config, str(name))
    return found


def _config(ref: str, from_hub: bool) -> PretrainedConfig:
    fields = _json_file(pathlib.Path(ref) / "config.json") if not from_hub else {}
    if (fields.get("model_type") in ("llama", "mistral") and all(f in fields for f in ENGINE_CONFIG_FIELDS)
            and ("rope_parameters" in fields or "rope_theta" in fields)):
        return PretrainedConfig.from_dict(fields)        # every field the engine reads, as the checkpoint wrote it
    from transformers import AutoConfig
    try:
        return AutoConfig.from_pretrained(ref)
    except OSError as err:
        if not from_hub:
            raise
        raise OSError(
            f"model={ref!r} could not be fetched from the Hugging Face hub (offline?): {err}\n"
            f"Use one of {', '.join(KNOWN_MODELS)} or a local folder instead."
        ) from err


def _tokenizer(ref: str, from_hub: bool) -> PreTrainedTokenizerBase | None:
    folder = pathlib.Path(ref)
    if not from_hub and not any((folder / f).is_file() for f in TOKENIZER_FILES):
        return None
    settings = {} if from_hub else _json_file(folder / "tokenizer_config.json")
    if (folder / "tokenizer.json").is_file() and settings.get("tokenizer_class") in FAST_TOKENIZER_CLASSES:
        return PreTrainedTokenizerFast.from_pretrained(ref)   # the class AutoTokenizer picks, without its lookup
    from transformers import AutoTokenizer   # it looks through every model family's code: a second, so only here
    try:
        return AutoTokenizer.from_pretrained(ref)
    except OSError:
        if not from_hub:
            raise
        return None                             # the hub repository has no tokenizer files


def _json_file(path: pathlib.Path) -> dict:
    """A JSON file's object; {} when there is no such file."""
    return json.loads(path.read_text()) if path.is_file() else {}


def eos_token_ids(generation: GenerationConfig, tokenizer) -> list[int]:
    """Stop tokens from the generation config and the tokenizer, deduplicated, in that order."""
    ids = generation.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return list(dict.fromkeys(ids))


def load_hf(name: str, dtype: torch.dtype = torch.float32):
    """The transformers model (eval mode) and tokenizer (None if the checkpoint has none) for `name`.

    Its generation_config stops at the same eos_token_ids as LoadedModel, so generate() is a fair reference.
    """
    _check_dtype(dtype)
    return _transformers_model(_find(name), dtype)


def _transformers_model(found: _Found, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM   # the modelling code: seconds to import, so only when needed

    if found.weights is None:
        model = random_llama(found.config, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(found.weights, dtype=dtype)   # with transformers' own config
    eos = eos_token_ids(model.generation_config, found.tokenizer)
    model.generation_config.eos_token_id = eos
    if model.generation_config.pad_token_id is None and eos:
        model.generation_config.pad_token_id = eos[0]  # generate() would otherwise warn
    return model.eval(), found.tokenizer


def load_model(name: str, dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Config, weights (Hugging Face names), tokenizer and stop tokens of `name`, for the engine."""
    _check_dtype(dtype)
    found = _find(name)
    state_dict = _read_checkpoint(found.weights, found.config, dtype)
    if state_dict is not None:
        return LoadedModel(str(name), found.config, state_dict, found.tokenizer, _stop_tokens(found))
    model, tokenizer = _transformers_model(found, dtype)
    state_dict = model.state_dict()  # detached tensors that share the model's storage
    _check_weight_names(state_dict, model.config, name)
    return LoadedModel(str(name), model.config, dict(state_dict), tokenizer, model.generation_config.eos_token_id)


def _check_dtype(dtype: torch.dtype) -> None:
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; allowed: {', '.join(map(str, SUPPORTED_DTYPES))}")


def _read_checkpoint(ref: str | None, config: PretrainedConfig, dtype: torch.dtype) -> dict | None:
    """A local folder's weights read from its safetensors file(s) in `dtype`, with Hugging Face names and the
    LM head tied as transformers ties it; None where transformers must load them (random weights, a hub id,
    another file format, or names that are not exactly a Llama's)."""
    folder = pathlib.Path(ref) if ref is not None else None
    if folder is None or not folder.is_dir():
        return None
    index = folder / "model.safetensors.index.json"
    if index.is_file():                                        # sharded: the index names each tensor's file
        files = sorted({folder / f for f in json.loads(index.read_text())["weight_map"].values()})
    else:
        files = [folder / "model.safetensors"]
    if not all(f.is_file() for f in files):
        return None
    state_dict = {}
    for file in files:
        state_dict.update((k, v.to(dtype)) for k, v in load_file(file).items())
    if config.tie_word_embeddings and "model.embed_tokens.weight" in state_dict:
        state_dict["lm_head.weight"] = state_dict["model.embed_tokens.weight"]   # one tensor, as transformers ties it
    try:
        _check_weight_names(state_dict, config, str(ref))
    except ValueError:                                  # e.g. buffers saved by old versions, which transformers drops
        return None
    return state_dict


def _stop_tokens(found: _Found) -> list[int]:
    """The stop tokens transformers' generate() would use: the generation config's (the model config's
    when the folder has none), then the tokenizer's end of sequence."""
    generation = GenerationConfig.from_model_config(found.config)  # what transformers falls back to
    if found.weights is not None:
        try:
            generation = GenerationConfig.from_pretrained(found.weights)
        except OSError:  # no generation_config.json
            pass
    return eos_token_ids(generation, found.tokenizer)


@functools.lru_cache(maxsize=8)
def load_model_spec(name: str) -> LoadedModel:
    """`load_model` without the weights (an empty state_dict): config, tokenizer and the same stop tokens."""
    found = _find(name)
    return LoadedModel(str(name), found.config, {}, found.tokenizer, _stop_tokens(found))


def _check_weight_names(state_dict: dict, config: PretrainedConfig, name: str) -> None:
    expected = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(config.num_hidden_layers):
        layer = f"model.layers.{i}."
        expected |= {f"{layer}self_attn.{p}_proj.weight" for p in "qkvo"}
        expected |= {f"{layer}mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
        expected |= {f"{layer}input_layernorm.weight", f"{layer}post_attention_layernorm.weight"}
    missing, extra = sorted(expected - state_dict.keys()), sorted(state_dict.keys() - expected)
    if missing or extra:
        raise ValueError(f"model={name!r} has weights the Llama forward pass does not expect: "
                         f"missing {missing[:5]}, unexpected {extra[:5]}")
