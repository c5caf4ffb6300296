"""Command line: `python -m minibatch <command> [options]`; `python -m minibatch -h` lists the commands.

Each command lives in its own module, which provides `add_arguments(parser)` and `main(args)`;
modules are imported only when their command runs, so `--help` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "prepare": ("minibatch.tools.prepare", "convert the default model (SmolLM2-135M-Instruct) into the cache once"),
    "demo": ("minibatch.bench.demo", "one workload on the default SLM, static vs continuous batching, side by side"),
    "calibrate": ("minibatch.tools.calibrate", "measure this machine and fit the simulated clock's cost model"),
    "bench": ("minibatch.bench.suite", "minibatch against its peers on the same model, workload and machine"),
    "serve": ("minibatch.serving.server", "an OpenAI-compatible HTTP server"),
    "loadtest": ("minibatch.serving.loadtest", "replay a workload against any OpenAI-compatible server"),
    "profile": ("minibatch.tools.profile", "where a decode step's time goes, part by part, at a few batch sizes"),
    "overhead": ("minibatch.tools.overhead", "the fixed cost of a decode step against the model's size, measured"),
    "prefix": ("minibatch.bench.prefix", "TTFT, prefill tokens and tokens/s with prefix caching on and off"),
    "speculate": ("minibatch.bench.speculative", "one user's tokens/s with and without each speculative proposer"),
    "doctor": ("minibatch.tools.doctor", "preflight before a workshop: is this machine ready for the course?"),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minibatch", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="command")
    modules = {}
    wanted = (argv if argv is not None else sys.argv[1:])[:1]
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name in wanted:
            modules[name] = importlib.import_module(module_name)
            modules[name].add_arguments(command_parser)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return modules[args.command].main(args) or 0


if __name__ == "__main__":
    sys.exit(main())
