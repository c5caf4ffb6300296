"""The sizes the engine reads from a model, in one place: the engine's Llama, the simulator's
weightless stand-in and the memory arithmetic all take them from here.

head_dim is the config's own (`check_supported` fills it in as hidden_size // num_heads for the
older configs that leave it implicit).
"""
from __future__ import annotations

from transformers import PretrainedConfig


class ModelShape:
    """Layers, query and KV heads, head size and vocabulary of a (checked) model config."""

    def __init__(self, config: PretrainedConfig):
        self.num_layers = config.num_hidden_layers
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.vocab_size = config.vocab_size
