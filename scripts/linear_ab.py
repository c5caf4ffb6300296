"""Time every path of a weight product for the model's own shapes, side by side.

`F.linear(x, W)` (MKL, rows first), the weight-first orientation (W @ x^T)^T, oneDNN with the
weight prepacked (`minibatch.engine.models.linear.Linear`'s paths) and, in float32, the streamed loop
`Linear` takes for up to STREAM_ROWS rows (`engine.kernels.gemv_cpu`), for every row count a step can have:
the 30 layers' weights of the model (cold in cache, as in a real step: each layer's weights are
read once per step) and its LM head. Runs alternate (A B A B ...); the medians are printed, with
the largest difference from F.linear's output.

    python scripts/linear_ab.py [--model smollm2-135m] [--dtype float32] [--rows 1 2 4 8 16 32 64 128] [--reps 7]
                                [--products qkv o gate_up down]
"""
import argparse
import statistics
import time

import torch

from minibatch.engine.models import load_model
from minibatch.engine.models.linear import PATHS, Linear, onednn_supports


def time_ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def layer_weights(sd, num_layers):
    """Each layer's weights as the model fuses them: q|k|v, o, gate|up, down."""
    cat = lambda i, names: torch.cat([sd[f"model.layers.{i}.{n}.weight"] for n in names])
    return [{"qkv": cat(i, ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]),
             "o": cat(i, ["self_attn.o_proj"]), "gate_up": cat(i, ["mlp.gate_proj", "mlp.up_proj"]),
             "down": cat(i, ["mlp.down_proj"])} for i in range(num_layers)]


PRODUCTS = ("qkv", "o", "gate_up", "down")


def every_layer(layers, x_in, x_mid, products=PRODUCTS):
    """One step's worth of layer products: q|k|v, o, gate|up and down of every layer (or those named)."""
    inputs = {"qkv": x_in, "o": x_in, "gate_up": x_in, "down": x_mid}
    def run():
        for layer in layers:
            for name in products:
                layer[name](inputs[name])
    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
    parser.add_argument("--reps", type=int, default=7, help="interleaved repetitions per row count")
    parser.add_argument("--products", nargs="+", choices=PRODUCTS, default=list(PRODUCTS),
                        help="which of each layer's products to time (all four by default)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    loaded = load_model(args.model)
    sd = {k: v.to(dtype).contiguous() for k, v in loaded.state_dict.items()}
    weights = layer_weights(sd, loaded.config.num_hidden_layers)
    hidden, inner = weights[0]["down"].shape                             # (C, I)
    paths = [p for p in PATHS if p != "onednn" or onednn_supports(sd["lm_head.weight"])]
    layers = {p: [{name: Linear(w, p, stream_rows=0) for name, w in layer.items()} for layer in weights] for p in paths}
    heads = {p: Linear(sd["lm_head.weight"], p, stream_rows=0) for p in paths}
    if True:                                      # the streamed loop at every row count, to show where it stops paying
        paths.append("streamed")
        layers["streamed"] = [{name: Linear(w, "weight-first", stream_rows=10**9) for name, w in layer.items()}
                              for layer in weights]
        heads["streamed"] = Linear(sd["lm_head.weight"], "weight-first", stream_rows=10**9)
    print(f"{args.model}, {args.dtype}: {torch.get_num_threads()} threads; median ms of one step's products "
          f"({', '.join(args.products)} of 30 layers, then the LM head), each path against F.linear")
    print(f"{'rows':>5} " + " ".join(f"{p + ' layers':>20} {'head':>7}" for p in paths) + f" {'max |diff|':>11}")
    with torch.inference_mode():
        for rows in args.rows:
            x_in, x_mid = torch.randn(rows, hidden, dtype=dtype), torch.randn(rows, inner, dtype=dtype)  # (T, C), (T, I)
            runs = {(p, "layers"): every_layer(layers[p], x_in, x_mid, args.products) for p in paths}
            runs.update({(p, "head"): (lambda head=heads[p]: head(x_in)) for p in paths})
            times = {key: [] for key in runs}
            for _ in range(args.reps):
                for key, run in runs.items():
                    times[key].append(time_ms(run))
            m = {key: statistics.median(v) for key, v in times.items()}
            reference = heads["f.linear"](x_in).float()
            diff = max((heads[p](x_in).float() - reference).abs().max().item() for p in paths)
            print(f"{rows:>5} " + " ".join(f"{m[p, 'layers']:>17.1f} ms {m[p, 'head']:>4.1f}ms" for p in paths)
                  + f" {diff:>11.1e}")


if __name__ == "__main__":
    main()
