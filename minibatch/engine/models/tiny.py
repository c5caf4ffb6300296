"""Random-initialised Llama models built locally: `tiny` for fast tests, and models shaped like
SmolLM2-360M and SmolLM2-1.7B for chapters that need bigger shapes (timing, memory) but not
meaningful text.

Weights come from a per-tensor `torch.Generator` seeded from (seed, tensor name), so they are the
same on every machine, never touch the global torch RNG, and a tensor's values do not depend on
how many other tensors the model has. The `tiny` tokenizer is byte-level: token id = byte + 3,
after three special tokens, so any UTF-8 text round-trips and a prompt of n bytes is n tokens.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

if TYPE_CHECKING:   # the Llama code takes seconds to import: the functions that need it import it
    from transformers import LlamaConfig, PreTrainedModel

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
CHAT_TEMPLATE = (  # ChatML, the format SmolLM2 uses
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
DEFAULT_SEED = 0  # every random model is built from this seed unless told otherwise


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: 3 special tokens, then one token per byte (no merges)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_chars = bytes_to_unicode()  # byte -> the printable character byte-level BPE uses for it
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({byte_chars[b]: len(SPECIAL_TOKENS) + b for b in range(256)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
        chat_template=CHAT_TEMPLATE,
    )


def tiny_config() -> LlamaConfig:
    """A 4-layer Llama with grouped-query attention (4 query heads share 2 KV heads)."""
    from transformers import LlamaConfig
    return LlamaConfig(
        vocab_size=len(SPECIAL_TOKENS) + 256,  # 259: the byte-level tokenizer above
        hidden_size=128,  # model width
        num_hidden_layers=4,  # transformer blocks
        num_attention_heads=4,  # query heads
        num_key_value_heads=2,  # KV heads: each serves 2 query heads (GQA)
        head_dim=32,  # hidden_size / num_attention_heads
        intermediate_size=256,  # SwiGLU MLP width
        max_position_embeddings=1024,  # longest sequence
        rms_norm_eps=1e-5,  # as SmolLM2
        rope_theta=10000.0,  # the original RoPE base
        tie_word_embeddings=True,  # lm_head shares the embedding matrix, as SmolLM2
        # std of the random weights: larger than the usual 0.02 so that attention is peaked and
        # greedy outputs depend on the context, which makes correctness tests sensitive to it
        initializer_range=0.1,
        bos_token_id=None,  # prompts get no BOS token
        eos_token_id=0,  # <|endoftext|>
        pad_token_id=0,
    )


def smollm2_shaped_config(size: str) -> LlamaConfig:
    """The architecture of SmolLM2-360M or SmolLM2-1.7B (`size` "360m" or "1.7b"), for random weights."""
    shapes = {  # hidden, layers, query heads, KV heads, MLP width, RoPE base (from the published configs)
        "360m": (960, 32, 15, 5, 2560, 100000.0),
        "1.7b": (2048, 24, 32, 32, 8192, 130000.0),
    }
    if size not in shapes:
        raise ValueError(f"size={size!r} is not a SmolLM2 shape; allowed: {sorted(shapes)}")
    hidden, layers, heads, kv_heads, inter, theta = shapes[size]
    from transformers import LlamaConfig
    return LlamaConfig(
        vocab_size=49152,  # SmolLM2's tokenizer
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,  # 64 in both
        intermediate_size=inter,
        max_position_embeddings=8192,  # SmolLM2's context length
        rms_norm_eps=1e-5,
        rope_theta=theta,
        tie_word_embeddings=True,
        initializer_range=0.02,  # as the published configs
        bos_token_id=1,  # SmolLM2's special ids: <|im_start|>, <|im_end|>
        eos_token_id=2,
        pad_token_id=2,
    )


def random_llama(config: LlamaConfig, seed: int = DEFAULT_SEED, dtype=torch.float32) -> PreTrainedModel:
    """A transformers Llama with weights drawn from `seed`: norms are 1, matrices N(0, initializer_range)."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    with no_init_weights():  # allocate only; every parameter is filled below
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()  # skipped with the initialisation; a no-op unless tie_word_embeddings
    with torch.no_grad():
        for name, param in model.named_parameters():  # tied weights appear once
            if name.endswith("norm.weight"):
                param.fill_(1.0)
                continue
            gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            values = torch.empty(param.shape, dtype=torch.float32)  # drawn in fp32, then cast
            param.copy_(values.normal_(0.0, config.initializer_range, generator=gen))
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model.eval()
