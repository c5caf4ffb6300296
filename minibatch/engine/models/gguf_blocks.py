"""A GGUF file's own quantised blocks, under Hugging Face weight names and in transformers' row order.

The default model ships as a GGUF file (`models.smollm2`): its matrices are stored in ggml block
formats. In SmolLM2-135M-Instruct.Q4_1.gguf every layer's seven matrices (attn_q, attn_k, attn_v,
attn_output, ffn_gate, ffn_up, ffn_down) are Q4_1; the token embedding, which is also the tied LM
head, is Q8_0; the norms are F32. `quantization="q4_1"` multiplies by the Q4_1 blocks and by the
embedding's Q8_0 blocks as the file holds them: both are exactly what transformers dequantised
when it converted the file, so nothing is requantised. A matrix in any other type (F32, F16, K-quants
in other files) stays on the engine's ordinary fp32 path.

Two things differ from the converted checkpoint, and both are undone here:

- names: `blk.{i}.attn_q.weight` is `model.layers.{i}.self_attn.q_proj.weight` (`GGUF_NAMES`);
- row order of q and k: llama.cpp's converter interleaves each head's rows for its rotary kernel
  (row 2i and 2i+1 of a head are the two halves' i-th rows), and transformers reverses that
  permutation when it loads the file. A block lies inside one row, so reordering whole rows of
  blocks (`unpermute_rows`) gives the rows transformers loaded, exactly.

Parsing the file's metadata (its 49,152-token vocabulary above all) takes the `gguf` package about
5 s, so the blocks read once are kept beside the converted model as a safetensors file
(`<cache>/<file stem>.blocks.safetensors`, codes, scales and minimums as stored); later processes
load that in a fraction of a second. The cache is rebuilt when the GGUF file's size or time changes.
"""
from __future__ import annotations

import functools
import pathlib

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from minibatch.engine.models.quantized import QuantizedWeight
from minibatch.engine.models.registry import resolve
from minibatch.engine.models.smollm2 import gguf_path, model_cache_dir

GGUF_NAMES = {  # Hugging Face name inside layer i -> GGUF name inside block i
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
FORMATS = {"Q8_0": "q8_0", "Q4_1": "q4_1"}  # GGUF block types read as they are


def gguf_file(model: str) -> pathlib.Path | None:
    """The GGUF file the model's weights were converted from, or None (random, local or hub checkpoints)."""
    source = resolve(model)
    return gguf_path() if source.kind == "builtin" and source.ref == "smollm2-135m" else None


def unpermute_rows(num_rows: int, num_heads: int) -> torch.Tensor:
    """Index (num_rows,): Hugging Face row r of a q or k matrix is GGUF row index[r].

    transformers' reverse permutation: reshape rows (heads, D/2, 2), swap the last two axes.
    """
    return torch.arange(num_rows).reshape(num_heads, num_rows // num_heads // 2, 2).transpose(1, 2).reshape(-1)


def _from_bytes(data: np.ndarray, kind: str) -> QuantizedWeight:
    """GGUF block bytes (N, K/32 * block bytes) uint8 -> a QuantizedWeight (the bytes regrouped, not changed)."""
    rows = data.shape[0]
    raw = torch.from_numpy(np.array(data, dtype=np.uint8)).reshape(rows, -1, 34 if kind == "q8_0" else 20)
    scales = raw[..., 0:2].contiguous().view(torch.float16).reshape(rows, -1)       # (N, K/32)
    if kind == "q8_0":                                                               # d, then 32 int8 codes
        return QuantizedWeight(kind, raw[..., 2:].contiguous().view(torch.int8).reshape(rows, -1), scales)
    mins = raw[..., 2:4].contiguous().view(torch.float16).reshape(rows, -1)         # d, m, then 16 bytes
    return QuantizedWeight(kind, raw[..., 4:].contiguous().reshape(rows, -1), scales, mins)


@functools.lru_cache(maxsize=2)
def read_blocks(path: pathlib.Path) -> dict[str, QuantizedWeight | None]:
    """Every weight matrix of the file under its Hugging Face name: blocks, or None if its type has none here."""
    stat = path.stat()
    stamp = {"source": str(path), "size": str(stat.st_size), "mtime_ns": str(stat.st_mtime_ns)}
    cache = model_cache_dir() / f"{path.stem}.blocks.safetensors"
    if cache.exists():
        from safetensors import safe_open
        with safe_open(cache, "pt") as f:
            fresh = f.metadata() == stamp
        if fresh:
            return _unflatten(load_file(cache))
    blocks = _parse(path)
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_suffix(".partial")
    save_file(_flatten(blocks), partial, metadata=stamp)
    partial.replace(cache)                           # whole or not at all, even if two processes race
    return blocks


def _flatten(blocks: dict) -> dict[str, torch.Tensor]:
    """{name: QuantizedWeight or None} -> flat tensors "name|format|part" (a None matrix is left out)."""
    flat = {}
    for name, weight in blocks.items():
        if weight is not None:
            parts = {"codes": weight.codes, "scales": weight.scales, "mins": weight.mins}
            flat |= {f"{name}|{weight.format}|{part}": t.contiguous() for part, t in parts.items() if t is not None}
    return flat


def _unflatten(flat: dict[str, torch.Tensor]) -> dict:
    grouped: dict = {}
    for key, tensor in flat.items():
        name, kind, part = key.split("|")
        grouped.setdefault((name, kind), {})[part] = tensor
    return {name: QuantizedWeight(kind, p["codes"], p["scales"], p.get("mins")) for (name, kind), p in grouped.items()}


def _parse(path: pathlib.Path) -> dict[str, QuantizedWeight | None]:
    from gguf import GGUFReader

    reader = GGUFReader(path)
    heads = int(reader.fields["llama.attention.head_count"].parts[-1][0])
    kv_heads = int(reader.fields["llama.attention.head_count_kv"].parts[-1][0])
    tensors = {t.name: t for t in reader.tensors}
    names = {"lm_head.weight": "output.weight" if "output.weight" in tensors else "token_embd.weight"}
    layers = sum(name.endswith(".attn_q.weight") for name in tensors)
    for i in range(layers):
        names |= {f"model.layers.{i}.{hf}": f"blk.{i}.{gg}" for hf, gg in GGUF_NAMES.items()}
    blocks = {}
    for hf_name, gguf_name in names.items():
        tensor = tensors[gguf_name]
        kind = FORMATS.get(tensor.tensor_type.name)
        weight = None if kind is None else _from_bytes(tensor.data, kind)
        if weight is not None and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            num_heads = heads if hf_name.endswith("q_proj.weight") else kv_heads
            weight = weight.rows(unpermute_rows(weight.shape[0], num_heads))
        blocks[hf_name] = weight
    return blocks
