"""What every checker shares: the result type, the `@checker` decorator that turns a stub into
"not solved yet", and the comparisons and descriptions behind the failure messages."""

import functools
import math
import reprlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch


@dataclass(frozen=True)
class CheckResult:
    solved: bool  # True once every case passed
    message: str  # the line printed for the learner


@dataclass(frozen=True)
class Case:
    args: tuple  # positional arguments for the learner's function
    expected: Any  # the right answer
    kwargs: dict = field(default_factory=dict)  # keyword arguments, if any


class NotSolved(NotImplementedError):
    """Raised by a checker when the answer still shows the exercise's planted symptom (a debugging
    exercise's buggy code, as handed out): reported as "not solved yet" with the symptom, not as an error,
    while other wrong answers still raise."""


def checker(title: str, debug: bool = False) -> Callable:
    """Decorator turning a checking function into a learner-facing checker named `title`. With `debug`
    (a debugging exercise, whose stub is a piece with a planted bug, not a blank) a wrong answer is
    reported "not solved" with its message instead of raising, so the buggy stub's notebook runs on.
    A checker that tells the planted bug from other wrong answers raises NotSolved for it instead."""

    def decorate(body: Callable) -> Callable[..., CheckResult]:
        @functools.wraps(body)
        def run(*answers, **options) -> CheckResult:
            try:
                cases = body(*answers, **options)
            except NotSolved as err:
                message = f"{title}: not solved yet: {err}"
                print("○ " + message)
                return CheckResult(False, message)
            except NotImplementedError:
                message = (f"{title}: not solved yet. Replace `raise NotImplementedError(...)` "
                           "with your code and run the cell again.")
                print("○ " + message)
                return CheckResult(False, message)
            except AssertionError as err:
                if not debug:
                    raise AssertionError(f"{title}: {err}") from None
                message = f"{title}: not solved yet: {err}"
                print("✗ " + message)
                return CheckResult(False, message)
            message = f"{title}: all {cases} cases pass." if cases else f"{title}: solved."
            print("✓ " + message)
            return CheckResult(True, message)

        return run

    return decorate


def check_cases(fn: Callable, cases: list[Case], equal: Callable | None = None) -> int:
    """Call fn on every case; raise AssertionError at the first wrong answer. Returns len(cases)."""
    equal = equal or same_value
    for case in cases:
        call = describe_call(fn, case.args, case.kwargs)  # before the call, which may mutate args
        got = fn(*case.args, **case.kwargs)
        if not equal(got, case.expected):
            raise AssertionError(f"wrong answer\n  input:    {call}\n"
                                 f"  expected: {describe(case.expected)}\n  got:      {describe(got)}")
    return len(cases)


def same_value(got: Any, expected: Any) -> bool:
    """Equality for answers: floats to a relative 1e-5, tensors and arrays element-wise with
    their shapes, lists and tuples interchangeably, dicts key by key."""
    got, expected = _as_numpy(got), _as_numpy(expected)
    if isinstance(got, (np.ndarray, np.generic)) or isinstance(expected, (np.ndarray, np.generic)):
        got, expected = np.asarray(got), np.asarray(expected)
        if got.shape != expected.shape:
            return False
        if np.issubdtype(got.dtype, np.floating) or np.issubdtype(expected.dtype, np.floating):
            return bool(np.allclose(got, expected, rtol=1e-5, atol=1e-6, equal_nan=True))
        return bool(np.array_equal(got, expected))
    if isinstance(expected, float) or isinstance(got, float):
        numbers = all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in (got, expected))
        return numbers and math.isclose(got, expected, rel_tol=1e-5, abs_tol=1e-6)
    if isinstance(expected, (list, tuple)):
        return (isinstance(got, (list, tuple)) and len(got) == len(expected)
                and all(same_value(g, e) for g, e in zip(got, expected)))
    if isinstance(expected, dict):
        return (isinstance(got, dict) and got.keys() == expected.keys()
                and all(same_value(got[k], expected[k]) for k in expected))
    return bool(got == expected)


def _as_numpy(value: Any) -> Any:
    """Tensors become numpy arrays (bfloat16 and friends via float32); anything else is kept."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return (value.float() if value.is_floating_point() else value).numpy()
    return value


_short = reprlib.Repr()  # reprlib's limits, a little roomier for messages
_short.maxlist = _short.maxtuple = 12
_short.maxstring, _short.maxother = 80, 120


def describe(value: Any) -> str:
    """A short repr for messages: large arrays and tensors by shape and dtype."""
    if isinstance(value, (torch.Tensor, np.ndarray)) and np.prod(value.shape) > 16:
        return f"{type(value).__name__}(shape={tuple(value.shape)}, dtype={value.dtype})"
    return _short.repr(value)


def describe_call(fn: Callable, args: tuple, kwargs: dict) -> str:
    """`name(arg, ..., key=value)` for messages."""
    parts = [describe(a) for a in args] + [f"{k}={describe(v)}" for k, v in kwargs.items()]
    return f"{getattr(fn, '__name__', 'your function')}({', '.join(parts)})"


def learner_config(choose: Callable, call: str, base=None, knobs: tuple[str, ...] | None = None):
    """The EngineConfig a learner's function returns (`call` names the call in messages): refused fields,
    anything but an EngineConfig, and (with base and knobs) a change to a field outside knobs fail with
    a message that says what to do."""
    from minibatch.config import ConfigError, EngineConfig

    try:
        config = choose() if base is None else choose(base)
    except ConfigError as err:                       # EngineConfig refused a field
        raise AssertionError(f"{call} built a configuration the engine refuses: {err}") from None
    assert isinstance(config, EngineConfig), f"{call} must return an EngineConfig, got {describe(config)}"
    if base is not None:
        changed = [name for name in vars(base) if getattr(config, name) != getattr(base, name) and name not in knobs]
        assert not changed, (f"only {', '.join(knobs)} may change, but {', '.join(changed)} changed too: build the "
                             "answer with dataclasses.replace(base, ...)")
    return config
