"""Time the two orientations of a weight product for the model's own shapes, side by side.

`F.linear(x, W)` (x first) against `minibatch.engine.models.linear.linear(x, W)` (W first on CPU for up to
SMALL_BATCH_ROWS rows), for every row count a step can have: the 30 layers' weights of the model
(cold in cache, as in a real step: each layer's weights are read once per step) and its LM head.
Runs alternate (A B A B ...); medians are printed, with the largest difference between the outputs.

    python scripts/linear_ab.py [--model smollm2-135m] [--rows 1 2 4 8 16 32 64 128] [--reps 7]
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from minibatch.engine.models import load_model
from minibatch.engine.models.linear import SMALL_BATCH_ROWS, linear
from minibatch.engine.models.llama import LlamaModel


def time_ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def every_layer(product, layers, x_in, x_mid):
    """One step's worth of layer products: q|k|v, o, gate|up and down of every layer."""
    def run():
        for layer in layers:
            product(x_in, layer["qkv"]), product(x_in, layer["o"]), product(x_in, layer["gate_up"])
            product(x_mid, layer["down"])
    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
    parser.add_argument("--reps", type=int, default=7, help="interleaved repetitions per row count")
    args = parser.parse_args()
    model = LlamaModel(load_model(args.model), torch.float32, torch.device("cpu"), max_positions=8)
    hidden, inner = model.layers[0]["down"].shape                       # (C, I)
    print(f"{args.model}: {torch.get_num_threads()} threads, weights first up to {SMALL_BATCH_ROWS} rows")
    print(f"{'rows':>5} {'layers F.linear':>16} {'layers linear':>14} {'ratio':>6} "
          f"{'LM head F.linear':>17} {'LM head linear':>15} {'ratio':>6} {'max |diff|':>11}")
    with torch.inference_mode():
        for rows in args.rows:
            x_in, x_mid = torch.randn(rows, hidden), torch.randn(rows, inner)   # (T, C), (T, I)
            runs = {"layers_a": every_layer(F.linear, model.layers, x_in, x_mid),
                    "layers_b": every_layer(linear, model.layers, x_in, x_mid),
                    "head_a": lambda: F.linear(x_in, model.lm_head), "head_b": lambda: linear(x_in, model.lm_head)}
            times = {name: [] for name in runs}
            for _ in range(args.reps):
                for name, run in runs.items():
                    times[name].append(time_ms(run))
            m = {name: statistics.median(v) for name, v in times.items()}
            diff = (F.linear(x_in, model.lm_head) - linear(x_in, model.lm_head)).abs().max().item()
            print(f"{rows:>5} {m['layers_a']:>13.1f} ms {m['layers_b']:>11.1f} ms {m['layers_a'] / m['layers_b']:>5.2f}x "
                  f"{m['head_a']:>14.1f} ms {m['head_b']:>12.1f} ms {m['head_a'] / m['head_b']:>5.2f}x {diff:>11.1e}")


if __name__ == "__main__":
    main()
