"""torch.compile of a layer's dense parts against the engine's own path, on the model's weights.

Fewer torch operator calls per layer can come two ways: let `torch.compile` (Inductor) fuse the
small operators around the products and generate the code, or write those parts as compiled loops
by hand (`engine.kernels.fused_cpu`; in a decode step the whole layer is one compiled call,
`engine.kernels.layer_cpu`). This times the first against the second on the dense parts of the
model's 30 layers, everything but the attention itself:

    h = rms_norm(x); qkv = h W_qkv^T;  x1 = x + a W_o^T;  x2 = x1 + W_down (silu(g) * u), [g | u] = rms_norm(x1) W_gu^T

(a, the attention's output, is a fixed input here: torch.compile has no paged attention, and it would be the
same kernel either way). Three arms, interleaved, medians printed, at decode and prefill row counts:

- engine: the engine's calls part by part (`Linear`: the streamed loop up to STREAM_ROWS rows, oneDNN with
  its prepacked weight above; `fused_cpu`'s norm and SwiGLU). A decode step runs them as whole compiled
  layers, which is faster again, so this arm is the engine's slower way.
- eager: the same layers as torch modules, `F.linear` and torch's operators.
- compiled: those modules through `torch.compile(dynamic=True)` with Inductor's `freezing` (weights taken as
  constants and prepacked for oneDNN), one compile for every row count; its compile time is printed.

The largest difference from eager torch, relative to the output's largest value, is printed per arm (fp32:
only the order of the additions differs).

    OMP_NUM_THREADS=2 NUMBA_NUM_THREADS=2 python scripts/compile_ab.py [--rows 1 8 32 512] [--reps 7]
"""
import argparse
import statistics
import time

import torch
import torch._inductor.config as inductor_config
import torch.nn.functional as F
from torch import nn

from minibatch.engine.kernels import fused_cpu
from minibatch.engine.models import load_model
from minibatch.engine.models.linear import Linear


class DenseParts(nn.Module):
    """One layer's dense parts in plain torch: (x (T, C), a (T, C)) -> x2 (T, C), and q|k|v (T, (Hq + 2 Hkv) D)."""

    def __init__(self, sd, i: int, eps: float):
        super().__init__()
        p = f"model.layers.{i}."
        cat = lambda names: nn.Parameter(torch.cat([sd[p + n + ".weight"] for n in names]), requires_grad=False)
        self.eps = eps
        self.attn_norm = nn.Parameter(sd[p + "input_layernorm.weight"], requires_grad=False)            # (C,)
        self.qkv = cat(["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"])                   # (3 ..., C)
        self.o = cat(["self_attn.o_proj"])                                                              # (C, Hq D)
        self.mlp_norm = nn.Parameter(sd[p + "post_attention_layernorm.weight"], requires_grad=False)   # (C,)
        self.gate_up = cat(["mlp.gate_proj", "mlp.up_proj"])                                            # (2 I, C)
        self.down = cat(["mlp.down_proj"])                                                              # (C, I)

    def forward(self, x, a):
        qkv = F.linear(F.rms_norm(x, self.attn_norm.shape, self.attn_norm, self.eps), self.qkv)
        x1 = x + F.linear(a, self.o)
        gate, up = F.linear(F.rms_norm(x1, self.mlp_norm.shape, self.mlp_norm, self.eps), self.gate_up).chunk(2, -1)
        return x1 + F.linear(F.silu(gate) * up, self.down), qkv


class Layers(nn.Module):
    """Every layer's dense parts, each fed the last one's x2 and the same stand-in attention output a."""

    def __init__(self, layers):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x, a):
        outputs = []
        for layer in self.layers:
            x, qkv = layer(x, a)
            outputs.append(qkv)
        return x, outputs


def engine_path(module: Layers):
    """The same computation through the engine's own calls: Linear (streamed loop or oneDNN) and fused_cpu."""
    products = [{n: Linear(getattr(m, n).detach()) for n in ("qkv", "o", "gate_up", "down")} for m in module.layers]

    def run(x, a):
        outputs = []
        for m, p in zip(module.layers, products):
            outputs.append(p["qkv"](fused_cpu.rms_norm(x, m.attn_norm, m.eps)))
            x1 = p["o"].add_to(x, a)
            x = p["down"].add_to(x1, fused_cpu.silu_mul(p["gate_up"](fused_cpu.rms_norm(x1, m.mlp_norm, m.eps))))
        return x, outputs
    return run


def largest_difference(got, want) -> float:
    """The largest difference from eager torch over every output, relative to that output's largest value."""
    pairs = [(got[0], want[0])] + list(zip(got[1], want[1]))
    return max(((g - w).abs().max() / w.abs().max()).item() for g, w in pairs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 512])
    parser.add_argument("--reps", type=int, default=7, help="interleaved repetitions per row count")
    args = parser.parse_args()
    if min(args.rows) < 1:
        parser.error(f"--rows {args.rows}: every row count must be at least 1")
    loaded = load_model(args.model)
    cfg = loaded.config
    sd = {k: v.float().contiguous() for k, v in loaded.state_dict.items()}
    eager = Layers([DenseParts(sd, i, cfg.rms_norm_eps) for i in range(cfg.num_hidden_layers)]).eval()
    arms = {"engine": engine_path(eager), "eager": eager}
    inductor_config.freezing = True                       # weights as constants, prepacked where Inductor can
    compiled = torch.compile(eager, dynamic=True)
    hidden = cfg.hidden_size
    with torch.inference_mode():
        start = time.perf_counter()
        for rows in sorted({2, max(args.rows)}):            # one dynamic graph; a second size checks it is reused
            compiled(torch.randn(rows, hidden), torch.randn(rows, hidden))
        compile_s = time.perf_counter() - start
        arms["compiled"] = compiled
        print(f"{args.model}, float32, {torch.get_num_threads()} threads: the dense parts of {len(eager.layers)} "
              f"layers; torch.compile (dynamic, frozen weights) took {compile_s:.1f} s before its first result")
        print(f"{'rows':>5} " + " ".join(f"{name:>10} ms" for name in arms)
              + " " + " ".join(f"{name + ' vs eager':>18}" for name in arms if name != "eager"))
        for rows in args.rows:
            x, a = torch.randn(rows, hidden), torch.randn(rows, hidden)         # (T, C) each
            want = eager(x, a)
            times = {name: [] for name in arms}
            for name, run in arms.items():                  # warm-up: the first call of a new shape
                run(x, a)
            for _ in range(args.reps):
                for name, run in arms.items():
                    started = time.perf_counter()
                    run(x, a)
                    times[name].append((time.perf_counter() - started) * 1e3)
            diffs = [largest_difference(arms[name](x, a), want) for name in arms if name != "eager"]
            print(f"{rows:>5} " + " ".join(f"{statistics.median(times[name]):>13.1f}" for name in arms)
                  + " " + " ".join(f"{d:>18.1e}" for d in diffs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
