"""Every `EngineConfig` field as a command-line flag, so a new field needs no change here.

`--max-batch-size 16` sets `max_batch_size=16`; the help text is the field's own, declared with it
(`knob(default, help)` in config.py). Optional fields take `none`; booleans get `--flag` /
`--no-flag`. Values are checked by `EngineConfig` itself, so a bad flag fails with the same message
as a bad field.
"""
from __future__ import annotations

import argparse
import types
import typing
from dataclasses import MISSING, fields

from minibatch.config import EngineConfig


def _converter(kind):
    """A function turning a flag's text into a value of `kind` (int, float, str, or one of them | None)."""
    args = typing.get_args(kind) if isinstance(kind, types.UnionType) else ()
    base = next((a for a in args if a is not type(None)), kind)

    def convert(text: str):
        if args and text.lower() == "none":
            return None
        return base(text)

    convert.__name__ = base.__name__    # argparse names the type in its error messages
    return convert


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine", "EngineConfig fields (see minibatch/config.py)")
    hints = typing.get_type_hints(EngineConfig)
    for f in fields(EngineConfig):
        default = f.default if f.default is not MISSING else f.default_factory()
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{f.metadata['help']} (default: {default})".replace("%", "%%")
        if hints[f.name] is bool:
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        else:
            group.add_argument(flag, dest=f.name, type=_converter(hints[f.name]), default=default,
                               metavar=f.name.upper(), help=help_text)


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig the flags describe (raises ConfigError for a value it does not allow)."""
    return EngineConfig(**{f.name: getattr(args, f.name) for f in fields(EngineConfig)})
