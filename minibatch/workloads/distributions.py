"""The random processes a workload is drawn from: when requests arrive, and how long they are.

Arrival processes give n arrival times in seconds from the start (`times(rng, n)`):
`AllAtOnce()`, `Poisson(rate)` (independent arrivals, exponential gaps, `rate` per second) and
`Bursts(size, every_s)` (a crowd of `size` requests every `every_s` seconds). A closed loop of
users who wait for their answer and think before asking again has no arrival times in advance;
it is `minibatch.workloads.ClosedLoop`, which serves the workload itself.

Length distributions give n token counts >= 1 (`sample(rng, n)`): `Fixed(n)`, `Uniform(low, high)`,
`Exponential(mean)`, `LogNormal(median, sigma)` (a long tail, as real chat traffic has) and
`Empirical(values)` (resampled from lengths you observed). Every draw comes from the numpy
Generator passed in, so a seed fixes the workload.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minibatch.config import ConfigError


def _positive(owner: str, name: str, value, integer: bool = False, minimum: float = 0.0, allow_equal: bool = False):
    bad = isinstance(value, bool) or not isinstance(value, (int,) if integer else (int, float)) or value != value
    if bad or value < minimum or (value == minimum and not allow_equal):
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{owner}.{name}={value!r} is not allowed: {kind} {'>=' if allow_equal else '>'} {minimum}")


def _capped(values: np.ndarray, cap: int | None) -> np.ndarray:
    values = np.maximum(values, 1).astype(np.int64)
    return values if cap is None else np.minimum(values, cap)


# ---- arrival processes ----------------------------------------------------------------------

@dataclass(frozen=True)
class AllAtOnce:
    """Every request arrives at time 0 (an offline batch job)."""

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.zeros(n)


@dataclass(frozen=True)
class Poisson:
    """Independent arrivals at `rate` requests per second; the first arrives at time 0."""

    rate: float  # mean requests per second

    def __post_init__(self):
        _positive("Poisson", "rate", self.rate)

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        gaps = rng.exponential(1.0 / self.rate, size=n)
        return np.concatenate(([0.0], np.cumsum(gaps[:-1])))[:n]


@dataclass(frozen=True)
class Bursts:
    """`size` requests arrive together every `every_s` seconds (a class all pressing enter at once)."""

    size: int        # requests per burst
    every_s: float   # seconds between bursts

    def __post_init__(self):
        _positive("Bursts", "size", self.size, integer=True, minimum=1, allow_equal=True)
        _positive("Bursts", "every_s", self.every_s)

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return (np.arange(n) // self.size) * float(self.every_s)


# ---- length distributions -------------------------------------------------------------------

@dataclass(frozen=True)
class Fixed:
    """Always `value` tokens."""

    value: int

    def __post_init__(self):
        _positive("Fixed", "value", self.value, integer=True, minimum=1, allow_equal=True)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)


@dataclass(frozen=True)
class Uniform:
    """Any whole number from `low` to `high`, both included, equally likely."""

    low: int
    high: int

    def __post_init__(self):
        _positive("Uniform", "low", self.low, integer=True, minimum=1, allow_equal=True)
        _positive("Uniform", "high", self.high, integer=True, minimum=self.low, allow_equal=True)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.low, self.high + 1, size=n)


@dataclass(frozen=True)
class Exponential:
    """Mostly short, sometimes long: exponential with the given mean, rounded up, at most `cap`."""

    mean: float
    cap: int | None = None    # longest length drawn; None draws without limit

    def __post_init__(self):
        _positive("Exponential", "mean", self.mean)
        if self.cap is not None:
            _positive("Exponential", "cap", self.cap, integer=True, minimum=1, allow_equal=True)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return _capped(np.ceil(rng.exponential(self.mean, size=n)), self.cap)


@dataclass(frozen=True)
class LogNormal:
    """Half the lengths below `median`, with a long tail that `sigma` stretches; at most `cap`."""

    median: float
    sigma: float = 1.0        # spread of log(length); 0 gives the median every time
    cap: int | None = None    # longest length drawn; None draws without limit

    def __post_init__(self):
        _positive("LogNormal", "median", self.median)
        _positive("LogNormal", "sigma", self.sigma, allow_equal=True)
        if self.cap is not None:
            _positive("LogNormal", "cap", self.cap, integer=True, minimum=1, allow_equal=True)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return _capped(np.rint(rng.lognormal(np.log(self.median), self.sigma, size=n)), self.cap)


@dataclass(frozen=True)
class Empirical:
    """Lengths drawn (with replacement) from a list you measured, e.g. the output lengths of a real trace."""

    values: tuple

    def __post_init__(self):
        values = tuple(int(v) if isinstance(v, np.integer) else v for v in self.values)
        if not values:
            raise ConfigError("Empirical.values=() is not allowed: give at least one length")
        for v in values:
            _positive("Empirical", "values[...]", v, integer=True, minimum=1, allow_equal=True)
        object.__setattr__(self, "values", values)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.choice(np.asarray(self.values, dtype=np.int64), size=n)
