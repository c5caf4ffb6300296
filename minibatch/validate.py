"""One way to check a field, for every configuration, request, distribution, SLA and workload.

Each checker raises `ConfigError` with the same three parts: which field (`Owner.field`), the value
it was given, and what is allowed, e.g. `EngineConfig.max_batch_size=0 is not allowed: an integer
>= 1`. Booleans are never numbers here, and NaN is never a number.
"""
from __future__ import annotations


class ConfigError(ValueError):
    """A configuration or request field holds a value that is not allowed."""


def fail(owner: str, name: str, value, allowed: str):
    raise ConfigError(f"{owner}.{name}={value!r} is not allowed: {allowed}")


def check_choice(owner: str, name: str, value, choices):
    if value not in choices:
        fail(owner, name, value, "choose one of " + ", ".join(repr(c) for c in choices))


def check_int(owner: str, name: str, value, minimum: int):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        fail(owner, name, value, f"an integer >= {minimum}")


def check_number(owner: str, name: str, value, minimum: float, strict: bool = False, maximum: float | None = None,
                 allowed: str | None = None):
    """A real number >= minimum (> minimum when strict), and <= maximum if one is given."""
    is_number = not isinstance(value, bool) and isinstance(value, (int, float)) and value == value
    if not is_number or value < minimum or (strict and value == minimum) or (maximum is not None and value > maximum):
        low = f"{'>' if strict else '>='} {minimum}"
        if maximum is not None:
            low = f"in {'(' if strict else '['}{minimum}, {maximum}]"
        fail(owner, name, value, allowed or f"a number {low}")
