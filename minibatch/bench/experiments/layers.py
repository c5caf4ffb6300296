"""What does a layer's Python cost, and what takes it away? Whole compiled layers, fused parts, torch.compile.

Feeds docs/performance.md, sections "Whole compiled layers", "Fused small parts" and "torch.compile"
(and the decode steps quoted in "Streamed products" and "Blocks of rows"). Three measurements:

    steps    decode steps of the fast path (`EngineConfig(kernels="fast")`) with each layer as one compiled
             call (`kernels.layer_cpu`) against the same layers part by part: one engine, its operations'
             `FastOps.whole_layers` switch flipped between interleaved rounds, so both run on the same
             weights; each round generates greedy tokens for a batch of prompts, and its decode-only steps
             give the step times. Prints the median step of each way per batch size, their ratio, and
             whether the tokens were the same.
    parts    each fused loop of `kernels.fused_cpu` (`rms_norm`, `rotary_write_kv`, `silu_mul`) against
             the same computation in torch operators, one layer's call at SmolLM2's shapes, with the
             largest difference between the two
    compile  `torch.compile` (Inductor, weights frozen, one dynamic graph) of the 30 layers' dense parts
             (norms, products, residuals, SwiGLU: everything but the attention, which it has no paged
             kernel for; the attention's output is a fixed input) against the fast path's calls part by
             part (`Product`, `fused_cpu`) and eager torch, with the compile time and the largest
             difference from eager torch relative to the output's largest value

    python -m minibatch.bench.experiments.layers steps [--dtype bfloat16 | --quantization q4_1] [--batch-sizes 1 8]
    python -m minibatch.bench.experiments.layers parts [--rows 1 8 32 368]
    python -m minibatch.bench.experiments.layers compile [--rows 1 8 32 512]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from minibatch import LLM, EngineConfig, SamplingParams
from minibatch.bench.experiments import check_positive, fused_weights, interleaved, threads_line
from minibatch.engine.kernels import fused_cpu
from minibatch.engine.models import load_model
from minibatch.engine.ops.products import Product

HIDDEN, INNER, HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 576, 1536, 9, 3, 64, 16   # SmolLM2-135M's shapes


def steps(args) -> None:
    llm = LLM(EngineConfig(model=args.model, dtype=args.dtype, quantization=args.quantization, kernels="fast",
                           max_batch_size=max(args.batch_sizes)))
    ops = llm.engine.model.ops                  # FastOps: `whole_layers` switches between the two ways
    params = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True)

    def run(whole: bool, prompts, sampling=params):
        ops.whole_layers = whole
        first = len(llm.engine.step_records)
        outs = llm.generate(prompts, sampling, use_tqdm=False)
        decode = [s.duration for s in llm.engine.step_records[first:] if s.num_prefill_tokens == 0]
        return decode, [o.token_ids for o in outs]

    print(f"{args.model}, {args.dtype}, weights {args.quantization or args.dtype}, {threads_line()}: median decode "
          f"step over {args.rounds} interleaved rounds")
    print(f"{'batch':>5} {'whole layers':>13} {'part by part':>13} {'ratio':>6}  same tokens")
    try:
        for batch in args.batch_sizes:
            prompts = [f"Write a short note about the number {i}." for i in range(batch)]
            times, tokens = {True: [], False: []}, {True: [], False: []}
            for whole in (True, False):                                # warm-up: compile both ways
                run(whole, prompts, SamplingParams(max_new_tokens=4, ignore_eos=True))
            for _ in range(args.rounds):
                for whole in (True, False):
                    decode, ids = run(whole, prompts)
                    times[whole] += decode
                    tokens[whole].append(ids)
            whole_ms, parts_ms = (1e3 * statistics.median(times[w]) for w in (True, False))
            same = all(t == tokens[True][0] for t in tokens[True] + tokens[False])
            print(f"{batch:5d} {whole_ms:10.1f} ms {parts_ms:10.1f} ms {whole_ms / parts_ms:6.2f}  {same}")
    finally:
        ops.whole_layers = True


def rotary_tables(positions: int, theta: float = 10000.0):
    """cos and signed_sin (P, D) by position, as the model builds them (signed_sin's first half negated)."""
    inverse = 1.0 / theta ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM)          # (D/2,)
    angles = torch.outer(torch.arange(positions).float(), inverse)                      # (P, D/2)
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    return cos, torch.cat((-sin[:, :HEAD_DIM // 2], sin[:, HEAD_DIM // 2:]), -1)


def torch_rotary_write_kv(qkv, positions, cos, signed_sin, k_cache, v_cache, slot_mapping):
    """`fused_cpu.rotary_write_kv` in torch operators: rotated queries (T, Hq, D); keys and values to the caches."""
    rows, half = qkv.shape[0], HEAD_DIM // 2
    q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
    c, s = cos[positions][:, None], signed_sin[positions][:, None]                     # (T, 1, D)

    def rotate(t):                                                                       # (T, H, D)
        return t * c + torch.cat((t[..., half:], t[..., :half]), -1) * s
    k_cache.view(-1, KV_HEADS, HEAD_DIM)[slot_mapping] = rotate(k.reshape(rows, KV_HEADS, HEAD_DIM))
    v_cache.view(-1, KV_HEADS, HEAD_DIM)[slot_mapping] = v.reshape(rows, KV_HEADS, HEAD_DIM)
    return rotate(q.reshape(rows, HEADS, HEAD_DIM))


def parts(args) -> None:
    generator = torch.Generator().manual_seed(0)
    weight, eps = 1 + 0.1 * torch.randn(HIDDEN, generator=generator), 1e-5                # (C,)
    print(f"one layer's call at SmolLM2's shapes, float32, {threads_line()}: median us of {args.reps} "
          f"interleaved calls, each fused loop against torch's operators")
    print(f"{'part':>16} {'rows':>5} {'fused':>9} {'torch':>9}  max |diff|")
    with torch.inference_mode():
        for rows in args.rows:
            x = torch.randn(rows, HIDDEN, generator=generator)                             # (T, C)
            gate_up = torch.randn(rows, 2 * INNER, generator=generator)                    # (T, 2 I)
            qkv = torch.randn(rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=generator)
            cos, signed_sin = rotary_tables(rows)
            positions = slots = torch.arange(rows)                                          # (T,) int64
            blocks = -(-rows // BLOCK_SIZE)
            caches = [torch.zeros(blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM) for _ in range(4)]  # (N, bs, Hkv, D)
            cases = {
                "rms_norm": (lambda: fused_cpu.rms_norm(x, weight, eps),
                             lambda: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight),
                "silu_mul": (lambda: fused_cpu.silu_mul(gate_up),
                             lambda: F.silu(gate_up[:, :INNER]) * gate_up[:, INNER:]),
                "rotary_write_kv": (lambda: fused_cpu.rotary_write_kv(qkv, positions, cos, signed_sin, caches[0],
                                                                       caches[1], slots, HEADS),
                                    lambda: torch_rotary_write_kv(qkv, positions, cos, signed_sin, caches[2],
                                                                  caches[3], slots)),
            }
            for name, (fused, plain) in cases.items():
                ms = interleaved({"fused": fused, "torch": plain}, args.reps)
                diff = (fused() - plain()).abs().max().item()
                if name == "rotary_write_kv":                                       # the caches written too
                    diff = max(diff, *((caches[i] - caches[i + 2]).abs().max().item() for i in (0, 1)))
                print(f"{name:>16} {rows:>5} {1e3 * ms['fused']:>6.1f} us {1e3 * ms['torch']:>6.1f} us  {diff:.1e}")


class DenseParts(nn.Module):
    """The layers' dense parts in plain torch: (x (T, C), a (T, C)) -> (x after every layer, each layer's q|k|v)."""

    def __init__(self, weights: list[dict], norms: list[tuple], eps: float):
        super().__init__()
        keep = lambda t: nn.Parameter(t, requires_grad=False)
        self.weights = nn.ParameterList([keep(w[n]) for w in weights for n in ("qkv", "o", "gate_up", "down")])
        self.norms = nn.ParameterList([keep(n) for pair in norms for n in pair])      # attention, MLP: (C,) each
        self.eps, self.num_layers = eps, len(weights)

    def forward(self, x, a):
        outputs = []
        for i in range(self.num_layers):
            qkv_w, o_w, gate_up_w, down_w = self.weights[4 * i: 4 * i + 4]
            attn_norm, mlp_norm = self.norms[2 * i], self.norms[2 * i + 1]
            outputs.append(F.linear(F.rms_norm(x, attn_norm.shape, attn_norm, self.eps), qkv_w))
            x1 = x + F.linear(a, o_w)
            gate, up = F.linear(F.rms_norm(x1, mlp_norm.shape, mlp_norm, self.eps), gate_up_w).chunk(2, -1)
            x = x1 + F.linear(F.silu(gate) * up, down_w)
        return x, outputs


def engine_parts(weights: list[dict], norms: list[tuple], eps: float):
    """The same computation through the fast path's calls part by part: `Product` and `fused_cpu`."""
    products = [{n: Product(w) for n, w in layer.items()} for layer in weights]

    def run(x, a):
        outputs = []
        for p, (attn_norm, mlp_norm) in zip(products, norms):
            outputs.append(p["qkv"](fused_cpu.rms_norm(x, attn_norm, eps)))
            x1 = p["o"](a, residual=x)
            x = p["down"](fused_cpu.silu_mul(p["gate_up"](fused_cpu.rms_norm(x1, mlp_norm, eps))), residual=x1)
        return x, outputs
    return run


def largest_difference(got, want) -> float:
    """The largest difference from eager torch over every output, relative to that output's largest value."""
    pairs = [(got[0], want[0])] + list(zip(got[1], want[1]))
    return max(((g - w).abs().max() / w.abs().max()).item() for g, w in pairs)


def compiled(args) -> None:
    import torch._inductor.config as inductor_config
    loaded = load_model(args.model)
    cfg, sd = loaded.config, loaded.state_dict
    weights = fused_weights(sd, cfg.num_hidden_layers, torch.float32)
    norms = [tuple(sd[f"model.layers.{i}.{n}.weight"].float().contiguous()
                   for n in ("input_layernorm", "post_attention_layernorm")) for i in range(cfg.num_hidden_layers)]
    eager = DenseParts(weights, norms, cfg.rms_norm_eps).eval()
    arms = {"engine": engine_parts(weights, norms, cfg.rms_norm_eps), "eager": eager}
    inductor_config.freezing = True                          # weights as constants, prepacked where Inductor can
    graph = torch.compile(eager, dynamic=True)
    hidden = cfg.hidden_size
    with torch.inference_mode():
        start = time.perf_counter()
        for rows in sorted({2, max(args.rows)}):               # one dynamic graph; a second size checks it is reused
            graph(torch.randn(rows, hidden), torch.randn(rows, hidden))
        compile_s = time.perf_counter() - start
        arms["compiled"] = graph
        print(f"{args.model}, float32, {threads_line()}: the dense parts of {cfg.num_hidden_layers} layers; "
              f"torch.compile (dynamic, frozen weights) took {compile_s:.1f} s before its first result")
        print(f"{'rows':>5} " + " ".join(f"{name:>10} ms" for name in arms)
              + " " + " ".join(f"{name + ' vs eager':>18}" for name in arms if name != "eager"))
        for rows in args.rows:
            x, a = torch.randn(rows, hidden), torch.randn(rows, hidden)               # (T, C) each
            ms = interleaved({name: (lambda run=run: run(x, a)) for name, run in arms.items()}, args.reps)
            want = eager(x, a)
            diffs = [largest_difference(run(x, a), want) for name, run in arms.items() if name != "eager"]
            print(f"{rows:>5} " + " ".join(f"{ms[name]:>13.1f}" for name in arms)
                  + " " + " ".join(f"{d:>18.1e}" for d in diffs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minibatch.bench.experiments.layers",
                                     description=__doc__.splitlines()[0])
    what = parser.add_subparsers(dest="what", required=True)
    s = what.add_parser("steps", help="decode steps, whole compiled layers against part by part")
    s.add_argument("--model", default="smollm2-135m")
    s.add_argument("--quantization", default=None, choices=[None, "q8_0", "q4_1"])
    s.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    s.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8])
    s.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians are printed")
    s.add_argument("--new-tokens", type=int, default=32)
    p = what.add_parser("parts", help="the fused small parts against torch's operators, one layer's call")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 368])
    p.add_argument("--reps", type=int, default=200, help="interleaved calls; medians are printed")
    c = what.add_parser("compile", help="torch.compile of the dense parts against the engine's calls")
    c.add_argument("--model", default="smollm2-135m")
    c.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 512])
    c.add_argument("--reps", type=int, default=7, help="interleaved rounds per row count; medians are printed")
    args = parser.parse_args(argv)
    if args.what == "steps":
        for name in ("batch_sizes", "rounds", "new_tokens"):
            value = getattr(args, name)
            check_positive(parser, name.replace("_", "-"), value if isinstance(value, list) else [value])
    else:
        check_positive(parser, "rows", args.rows)
        check_positive(parser, "reps", [args.reps])
    {"steps": steps, "parts": parts, "compile": compiled}[args.what](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
