"""Every EngineConfig field is a command-line flag with its own help text, and flags round-trip into
the same EngineConfig the Python API would build (bad values fail with the field's own message)."""

import argparse
from dataclasses import fields

import pytest

from minibatch.config import ConfigError, EngineConfig
from minibatch.serving.flags import add_engine_arguments, engine_config_from_args


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_engine_arguments(p)
    return p


def test_every_field_is_a_flag_with_its_help():
    text = parser().format_help()
    for f in fields(EngineConfig):
        assert f.metadata.get("help"), f"EngineConfig.{f.name} has no help: declare it with knob(default, help)"
        assert "--" + f.name.replace("_", "-") in text


def test_flags_build_the_same_config_as_the_api():
    args = parser().parse_args(["--max-batch-size", "16", "--num-kv-blocks", "none", "--enable-prefix-caching",
                                "--scheduling-policy", "priority", "--batch-timeout-s", "0.5"])
    assert engine_config_from_args(args) == EngineConfig(max_batch_size=16, enable_prefix_caching=True,
                                                         scheduling_policy="priority", batch_timeout_s=0.5)
    assert engine_config_from_args(parser().parse_args([])) == EngineConfig()


def test_a_bad_flag_fails_with_the_fields_message():
    with pytest.raises(ConfigError, match=r"EngineConfig.max_batch_size=0 is not allowed: an integer >= 1"):
        engine_config_from_args(parser().parse_args(["--max-batch-size", "0"]))
