"""The fast path: the same operations as the reference, each a compiled CPU loop (Numba), and a decode
step's layers each one compiled call.

What it does differently, in the course's terms: each weight is read once per step, in order, for all
the rows of the batch (the streamed products of `ops.products`); the small parts between the products
(norm, rotary + KV write, SwiGLU) are one loop each instead of a dozen torch operators; and when every
product of a layer runs a routine the compiled layer can run (`Product.operands`) and attention is the
Numba kernel's, the whole layer is one call (`kernels.layer_cpu`), so the fixed cost per step shrinks.
Any other step (a long prefill chunk, another attention backend) runs the layers part by part with the
same kernels. Float32 or bfloat16 on a CPU (engine/resolve.py refuses anything else).
"""
from __future__ import annotations

from minibatch.engine.kernels import fused_cpu, layer_cpu, numba_cpu
from minibatch.engine.ops.products import Product
from minibatch.engine.ops.reference import ReferenceOps

PRODUCTS = ("qkv", "o", "gate_up", "down")   # a layer's products, in the order the compiled layer takes them


class FastOps(ReferenceOps):
    """Compiled CPU operations; whole compiled layers where the step allows."""

    name = "fast"

    def __init__(self, backend):
        super().__init__(backend)
        self.compiled_attention = backend is numba_cpu     # the compiled layer has the Numba kernel built in
        self.whole_layers = True                           # False: every step part by part (to compare the two)
        self._operands = {}                                # (first layer, layers, rows) -> their operands, or None

    def product(self, weight, alone: bool = False) -> Product:
        """The product by a weight, its routine for each band of rows from the table (`ops.products`);
        alone: multiplied on its own, never inside a compiled layer (the LM head)."""
        return Product(weight, alone)

    def rms_norm(self, x, weight, eps):
        return fused_cpu.rms_norm(x, weight, eps)

    def rotary_write_kv(self, qkv, positions, cos, signed_sin, k_cache, v_cache, slot_mapping, num_heads):
        # every CPU backend keeps the plain (N, bs, Hkv, D) cache this loop writes
        return fused_cpu.rotary_write_kv(qkv, positions, cos, signed_sin, k_cache, v_cache, slot_mapping, num_heads)

    def silu_mul(self, gate_up):
        return fused_cpu.silu_mul(gate_up)

    def decoder_layers(self, model, x, layers, kv_cache, step):
        operands = self.layer_operands(layers, x.shape[0]) if self.whole_layers else None
        if operands is None:                               # part by part, the same kernels
            return super().decoder_layers(model, x, layers, kv_cache, step)
        return layer_cpu.run_layers(x, layers, operands, kv_cache, (step.positions, step.cos, step.signed_sin),
                                    step.slot_mapping, step.meta, model.eps, model.scale, model.num_heads)

    def layer_operands(self, layers: list[dict], rows: int) -> list[tuple] | None:
        """Each layer's four product operands for a step of `rows` tokens, or None where the layers cannot run
        as whole compiled calls. Asked once per model and row count (the products never change)."""
        key = (id(layers[0]) if layers else None, len(layers), rows)
        if key not in self._operands:
            found = None
            if self.compiled_attention and layers and rows > 0:
                found = [tuple(layer[n].operands(rows) for n in PRODUCTS) for layer in layers]
                if any(o is None for products in found for o in products):
                    found = None
            self._operands[key] = found
        return self._operands[key]
