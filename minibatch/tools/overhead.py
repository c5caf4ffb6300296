"""The fixed cost of a decode step against the model's size, measured (`minibatch.analysis.overhead` measures).

Usage: `python -m minibatch overhead [--rounds 5] [--device cuda] [--kernels reference]`: the course's four
sizes side by side in interleaved rounds, one user each, the medians in a table.
"""
from __future__ import annotations

from minibatch.analysis.overhead import SIZES, format_table, measure_by_size, shaped_engine, table


def add_arguments(parser) -> None:
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default: 5)")
    parser.add_argument("--steps", type=int, default=4, help="decode steps per model and round (default: 4)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--kernels", default=None, help="the engine's kernels setting, where it has one")


def main(args) -> int:
    fields = {"device": args.device, **({"kernels": args.kernels} if args.kernels else {})}
    engines = {label: shaped_engine(name, layers, **fields) for label, (name, layers) in SIZES.items()}
    rounds = measure_by_size(engines, rounds=args.rounds, steps=args.steps)
    print(f"fixed cost of a batch-1 decode step against model size, medians of {args.rounds} interleaved rounds (ms)")
    print(format_table(table(engines, rounds)))
    return 0
