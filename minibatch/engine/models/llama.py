"""The engine's own Llama forward pass over a packed (ragged, unpadded) batch.

All sequences of a step are concatenated into one row of T tokens, whatever mix of prefill chunks and
single decode tokens they are. Every layer is RMSNorm -> attention (rotary positions, grouped-query heads,
reading and writing the paged KV cache) -> residual -> RMSNorm -> SwiGLU MLP -> residual. Only the rows
that produce a token go through the LM head.

Weights come from a Hugging Face checkpoint (transformers is the loader); the projections that read the
same input are stacked (q|k|v, gate|up) so a layer makes fewer, larger products. Every operation is the
path's (`engine/ops`: `reference` in plain torch, `fast` compiled for the CPU), so this file reads the
same whichever runs.
"""
from __future__ import annotations

import torch

from minibatch.engine.models import LoadedModel, rope_theta
from minibatch.engine.models.shape import ModelShape
from minibatch.engine.models.weights import weight_builder
from minibatch.engine.ops import StepInputs


class LlamaModel(ModelShape):
    """Weights on the device and a forward pass over packed tokens, by the operations of `ops`."""

    def __init__(self, loaded: LoadedModel, ops, dtype: torch.dtype, device: torch.device, max_positions: int,
                 quantization: str | None = None):
        cfg = loaded.config
        super().__init__(cfg)
        self.ops = ops
        self.eps = cfg.rms_norm_eps
        self.scale = self.head_dim ** -0.5
        sd = loaded.state_dict
        # Copies, never views: a view of a loaded weight would keep the whole checkpoint file mapped, and
        # resident, for as long as the engine lives (the packed copies are all a step reads).
        put = lambda t: t.to(device=device, dtype=dtype, memory_format=torch.contiguous_format, copy=True)
        weight = weight_builder(loaded, quantization, put)                  # names of stacked weights -> weight
        product = lambda names: ops.product(weight(names))                  # ... -> its product (engine/ops)
        self.tied = sd["lm_head.weight"].data_ptr() == sd["model.embed_tokens.weight"].data_ptr()
        self.embed = put(sd["model.embed_tokens.weight"])                  # (V, C), stays plain for lookups
        self.lm_head = ops.product(weight(["lm_head.weight"]), alone=True)  # (V, C), tied or not
        self.final_norm = put(sd["model.norm.weight"])                      # (C,)
        self.layers = []
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            attn = [p + f"self_attn.{n}_proj.weight" for n in ("q", "k", "v")]
            mlp = [p + f"mlp.{n}_proj.weight" for n in ("gate", "up")]
            self.layers.append({
                "attn_norm": put(sd[p + "input_layernorm.weight"]),          # (C,)
                "qkv": product(attn),                                       # ((Hq + 2 Hkv) D, C)
                "o": product([p + "self_attn.o_proj.weight"]),              # (C, Hq D)
                "mlp_norm": put(sd[p + "post_attention_layernorm.weight"]),  # (C,)
                "gate_up": product(mlp),                                    # (2 I, C)
                "down": product([p + "mlp.down_proj.weight"]),              # (C, I)
            })
        # Rotary tables, computed in fp32 like transformers, then cast.
        inv_freq = 1.0 / (rope_theta(cfg) ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)  # (P, D/2)
        angles = torch.cat((freqs, freqs), dim=-1)                                       # (P, D)
        self.cos = angles.cos().to(device=device, dtype=dtype)
        # rotate_half(x) * sin == roll(x, D/2) * sin with its first half negated: one roll, no slices or cat
        sin = angles.sin()
        self.signed_sin = torch.cat((-sin[:, :self.head_dim // 2], sin[:, self.head_dim // 2:]), dim=-1).to(
            device=device, dtype=dtype)

    def forward(self, input_ids, positions, slot_mapping, meta, kv_cache, logits_rows, num_layers=None):
        """Run T packed tokens through the model; returns logits (S, V) for the S rows in logits_rows.

        num_layers runs only the first layers before the final norm and LM head (a layer-skip draft).
        """
        x = self.embed[input_ids]                                           # (T, C)
        step = StepInputs(positions, self.cos, self.signed_sin, slot_mapping, meta)
        x = self.ops.decoder_layers(self, x, self.layers[:num_layers], kv_cache, step)    # (T, C)
        h = self.ops.rms_norm(x[logits_rows], self.final_norm, self.eps)   # (S, C)
        return self.lm_head(h).float()                                      # (S, V) in fp32

    def decoder_layer(self, x, layer, k_cache, v_cache, step: StepInputs):
        """x (T, C) plus the layer's attention, then plus its MLP: (T, C)."""
        ops, T = self.ops, x.shape[0]
        h = ops.rms_norm(x, layer["attn_norm"], self.eps)                  # (T, C)
        q = ops.rotary_write_kv(layer["qkv"](h), step.positions, step.cos, step.signed_sin, k_cache, v_cache,
                                step.slot_mapping, self.num_heads)          # (T, Hq, D); K/V into the cache
        attn = ops.attention(q, k_cache, v_cache, step.meta, self.scale)   # (T, Hq, D)
        x = layer["o"](attn.reshape(T, -1), residual=x)                     # (T, C)
        h = ops.rms_norm(x, layer["mlp_norm"], self.eps)                   # (T, C)
        return layer["down"](ops.silu_mul(layer["gate_up"](h)), residual=x)   # (T, C)

    def linears(self) -> list:
        """Every weight matrix a decode step multiplies by: each layer's four products, then the LM head."""
        return [layer[n] for layer in self.layers for n in ("qkv", "o", "gate_up", "down")] + [self.lm_head]

    def num_parameters(self) -> int:
        """Every weight of the checkpoint once (a tied LM head is the embedding, counted once)."""
        norms = self.final_norm.numel() + sum(layer["attn_norm"].numel() + layer["mlp_norm"].numel()
                                              for layer in self.layers)
        matrices = sum(w.numel() for w in self.linears()) - (self.lm_head.numel() if self.tied else 0)
        return self.embed.numel() + norms + matrices

    def decode_weight_bytes(self) -> int:
        """Bytes of weights a decode step reads: every matrix (in its storage format) and norm (the
        embedding is only looked up)."""
        norms = [self.final_norm] + [layer[n] for layer in self.layers for n in ("attn_norm", "mlp_norm")]
        return sum(w.nbytes() for w in self.linears()) + sum(t.numel() * t.element_size() for t in norms)
