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
from minibatch.validate import check_int, check_number


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
        check_number("Poisson", "rate", self.rate, 0.0, strict=True)

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        gaps = rng.exponential(1.0 / self.rate, size=n)
        return np.concatenate(([0.0], np.cumsum(gaps[:-1])))[:n]


@dataclass(frozen=True)
class Bursts:
    """`size` requests arrive together every `every_s` seconds (a class all pressing enter at once)."""

    size: int        # requests per burst
    every_s: float   # seconds between bursts

    def __post_init__(self):
        check_int("Bursts", "size", self.size, 1)
        check_number("Bursts", "every_s", self.every_s, 0.0, strict=True)

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return (np.arange(n) // self.size) * float(self.every_s)


# ---- length distributions -------------------------------------------------------------------

@dataclass(frozen=True)
class Fixed:
    """Always `value` tokens."""

    value: int

    def __post_init__(self):
        check_int("Fixed", "value", self.value, 1)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)


@dataclass(frozen=True)
class Uniform:
    """Any whole number from `low` to `high`, both included, equally likely."""

    low: int
    high: int

    def __post_init__(self):
        check_int("Uniform", "low", self.low, 1)
        check_int("Uniform", "high", self.high, self.low)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.low, self.high + 1, size=n)


@dataclass(frozen=True)
class Exponential:
    """Mostly short, sometimes long: exponential with the given mean, rounded up, at most `cap`."""

    mean: float
    cap: int | None = None    # longest length drawn; None draws without limit

    def __post_init__(self):
        check_number("Exponential", "mean", self.mean, 0.0, strict=True)
        if self.cap is not None:
            check_int("Exponential", "cap", self.cap, 1)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return _capped(np.ceil(rng.exponential(self.mean, size=n)), self.cap)


@dataclass(frozen=True)
class LogNormal:
    """Half the lengths below `median`, with a long tail that `sigma` stretches; at most `cap`."""

    median: float
    sigma: float = 1.0        # spread of log(length); 0 gives the median every time
    cap: int | None = None    # longest length drawn; None draws without limit

    def __post_init__(self):
        check_number("LogNormal", "median", self.median, 0.0, strict=True)
        check_number("LogNormal", "sigma", self.sigma, 0.0)
        if self.cap is not None:
            check_int("LogNormal", "cap", self.cap, 1)

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
            check_int("Empirical", "values[...]", v, 1)
        object.__setattr__(self, "values", values)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.choice(np.asarray(self.values, dtype=np.int64), size=n)
