"""The engine's own Llama forward pass over a packed (ragged, unpadded) batch.

All sequences of a step are concatenated into one row of T tokens, whatever mix of prefill
chunks and single decode tokens they are. Every layer is RMSNorm -> attention (rotary positions,
grouped-query heads, reading and writing the paged KV cache) -> residual -> RMSNorm -> SwiGLU
MLP -> residual. Only the rows that produce a token go through the LM head.

Weights come from a Hugging Face checkpoint (transformers is the loader); the projections that
read the same input are fused (q|k|v, gate|up) so a layer makes fewer, larger matrix products,
each a `Linear` that stores its weight the way this machine multiplies fastest
(`minibatch.engine.models.linear`: prepacked for oneDNN on CPU), or with `quantization` set a
`QuantizedLinear` over blocks of 8 or 4 bits (`minibatch.engine.models.weights`). In float32 on a
CPU the small parts run as compiled loops (`kernels.fused_cpu`), and a decode step runs each layer
as one compiled call of the same kernels (`kernels.layer_cpu`), with no Python between its parts,
whether its weights are float32 or blocks.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from minibatch.engine.kernels import fused_cpu, layer_cpu
from minibatch.engine.models import LoadedModel, rope_theta
from minibatch.engine.models.linear import Linear
from minibatch.engine.models.shape import ModelShape
from minibatch.engine.models.weights import linear_builder


def rms_norm(x, weight, eps):
    """x (T, C) scaled to unit root-mean-square, computed in fp32 as Llama does, times weight (C,).

    One fused operator; in fp32 it is bit for bit transformers' x * rsqrt(mean(x^2) + eps) * weight.
    In lower precisions transformers rounds before the weight multiplies, so the weight stays apart.
    """
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    return weight * F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype)


class LlamaModel(ModelShape):
    """Weights on the device and a forward pass over packed tokens."""

    def __init__(self, loaded: LoadedModel, dtype: torch.dtype, device: torch.device, max_positions: int,
                 quantization: str | None = None):
        cfg = loaded.config
        super().__init__(cfg)
        self.eps = cfg.rms_norm_eps
        self.scale = self.head_dim ** -0.5
        sd = loaded.state_dict
        # Copies, never views: a view of a loaded weight would keep the whole checkpoint file mapped, and
        # resident, for as long as the engine lives (the packed copies are all a step reads).
        put = lambda t: t.to(device=device, dtype=dtype, memory_format=torch.contiguous_format, copy=True)
        linear = linear_builder(loaded, quantization, put)                  # names of stacked weights -> product
        self.tied = sd["lm_head.weight"].data_ptr() == sd["model.embed_tokens.weight"].data_ptr()
        self.embed = put(sd["model.embed_tokens.weight"])                  # (V, C), stays plain for lookups
        self.lm_head = linear(["lm_head.weight"])                           # (V, C), tied or not
        self.final_norm = put(sd["model.norm.weight"])                      # (C,)
        self.layers = []
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            attn = [p + f"self_attn.{n}_proj.weight" for n in ("q", "k", "v")]
            mlp = [p + f"mlp.{n}_proj.weight" for n in ("gate", "up")]
            self.layers.append({
                "attn_norm": put(sd[p + "input_layernorm.weight"]),          # (C,)
                "qkv": linear(attn),                                        # ((Hq + 2 Hkv) D, C)
                "o": linear([p + "self_attn.o_proj.weight"]),               # (C, Hq D)
                "mlp_norm": put(sd[p + "post_attention_layernorm.weight"]),  # (C,)
                "gate_up": linear(mlp),                                     # (2 I, C)
                "down": linear([p + "mlp.down_proj.weight"]),               # (C, I)
            })
        self.fused = fused_cpu.supports(self.embed)  # float32 on CPU: the small parts run as compiled loops
        self.whole_layers = self.fused               # ...and a decode step's layers as one compiled call each
        self._compiled_operands = {}                 # (layers, rows, backend) -> layer_cpu.operands
        # Rotary tables, computed in fp32 like transformers, then cast.
        inv_freq = 1.0 / (rope_theta(cfg) ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)  # (P, D/2)
        angles = torch.cat((freqs, freqs), dim=-1)                                       # (P, D)
        self.cos = angles.cos().to(device=device, dtype=dtype)
        # rotate_half(x) * sin == roll(x, D/2) * sin with its first half negated: one roll, no slices or cat
        sin = angles.sin()
        self.signed_sin = torch.cat((-sin[:, :self.head_dim // 2], sin[:, self.head_dim // 2:]), dim=-1).to(
            device=device, dtype=dtype)

    def linears(self) -> list[Linear]:  # or QuantizedLinear
        """Every weight matrix a decode step multiplies by: each layer's four, then the LM head."""
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

    def forward(self, input_ids, positions, slot_mapping, meta, kv_cache, backend, logits_rows, num_layers=None):
        """Run T packed tokens through the model; returns logits (S, V) for the S rows in logits_rows.

        num_layers runs only the first layers before the final norm and LM head (a layer-skip draft).
        """
        x, rotary = self.embed_inputs(input_ids, positions)                # (T, C), see embed_inputs
        layers = self.layers[:num_layers]
        products = self.compiled_operands(len(layers), x.shape[0], backend) if self.whole_layers else None
        if products is not None:                                            # see kernels/layer_cpu.py
            x = layer_cpu.run_layers(x, layers, products, kv_cache, rotary, slot_mapping, meta, self.eps, self.scale,
                                     self.num_heads)
        else:
            for layer, k_cache, v_cache in zip(layers, kv_cache.k, kv_cache.v):
                h = self.norm(x, layer["attn_norm"])
                x = self.attention(h, x, layer, rotary, k_cache, v_cache, slot_mapping, meta, backend)
                h = self.norm(x, layer["mlp_norm"])
                x = self.mlp(h, x, layer)
        return self.lm_head_logits(self.norm(x[logits_rows], self.final_norm))  # (S, V)

    def compiled_operands(self, num_layers: int, rows: int, backend) -> list[tuple] | None:
        """`layer_cpu.operands` of the first num_layers layers, asked once per step shape (the products do not
        change after the model is built; asking 120 of them each step cost a decode step a few percent)."""
        key = (num_layers, rows, getattr(backend, "__name__", None))
        if key not in self._compiled_operands:
            self._compiled_operands[key] = layer_cpu.operands(self.layers[:num_layers], rows, backend)
        return self._compiled_operands[key]

    # The kinds of work in a forward pass, one method each, so the step profiler can time them.
    def embed_inputs(self, input_ids, positions):
        """Token embeddings (T, C) and the rotary inputs: positions (T,) with the cos/signed sin (T, 1, D) of
        each position, or with the whole (P, D) tables when the fused CPU kernels look positions up themselves."""
        x = self.embed[input_ids]                                           # (T, C)
        if self.fused:
            return x, (positions, self.cos, self.signed_sin)               # the (P, D) tables, read by position
        return x, (positions, self.cos[positions][:, None], self.signed_sin[positions][:, None])

    def norm(self, x, weight):
        if self.fused:
            return fused_cpu.rms_norm(x, weight, self.eps)
        return rms_norm(x, weight, self.eps)

    def attention(self, h, residual, layer, rotary, k_cache, v_cache, slot_mapping, meta, backend):
        """residual (T, C) plus the self-attention of the normed rows h (T, C): q|k|v, rotary, KV write,
        paged attention, output projection (the residual added by the product itself where it can)."""
        T = h.shape[0]
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        positions, cos, sin = rotary
        if self.fused and fused_cpu.writes_plain_kv(backend):               # one compiled loop: rotate, write K/V
            q = fused_cpu.rotary_write_kv(layer["qkv"](h), positions, cos, sin, k_cache, v_cache, slot_mapping, H)
        else:
            if self.fused:                                                  # another backend: its own KV write
                cos, sin = cos[positions][:, None], sin[positions][:, None]   # (T, 1, D) each
            qk, v = layer["qkv"](h).split([(H + Hkv) * D, Hkv * D], dim=-1)
            qk = qk.reshape(T, H + Hkv, D)
            qk = qk * cos + qk.roll(D // 2, dims=-1) * sin                  # (T, H + Hkv, D): q and k rotated together
            q, k, v = qk[:, :H], qk[:, H:], v.reshape(T, Hkv, D)            # (T, H, D), (T, Hkv, D), (T, Hkv, D)
            backend.write_kv(k, v, k_cache, v_cache, slot_mapping)
        attn = backend.attention(q, k_cache, v_cache, meta, self.scale)      # (T, H, D)
        return layer["o"].add_to(residual, attn.reshape(T, H * D))          # (T, C)

    def mlp(self, h, residual, layer):
        """residual (T, C) plus SwiGLU of h (T, C): down(silu(gate(h)) * up(h))."""
        gate_up = layer["gate_up"](h)                                       # (T, 2 I) = gate | up
        if self.fused:
            return layer["down"].add_to(residual, fused_cpu.silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)                                 # (T, I) each
        return layer["down"].add_to(residual, F.silu(gate) * up)

    def lm_head_logits(self, h):
        """Logits (S, V) in fp32 for the final-normed rows h (S, C)."""
        return self.lm_head(h).float()
