"""Measured claims: a chapter's closing check that holds on any machine.

A wall-clock figure measured once on a laptop is a coin toss: a browser tab, a video call or the
other core's work moves it by 30%. So a chapter never asserts a timing directly. It asserts one of:

- a claim on **counts** (steps, slots, blocks, tokens) or on the **simulated** clock, which no
  machine changes; the measured wall-clock figure may be printed beside it as information;
- a claim on **measured** time, made from `Rounds`: several rounds of measurements taken
  interleaved (A B A B ...), so that a disturbance hits every candidate alike, and compared by
  their best or median round against a bound that physics guarantees on any machine (for
  example against this machine's own measured copy bandwidth), never against which BLAS, how
  many cores or which kernel wins.

    rounds = interleaved({"batch 1": lambda: step(1), "batch 8": lambda: step(8)}, rounds=5)
    claim("a step of 8 costs less than 8 steps of 1", rounds.best("batch 8") < 8 * rounds.best("batch 1"),
          on=rounds)
    claim("continuous batching takes fewer steps", cont_steps < static_steps, on="counts",
          shown={"continuous steps": cont_steps, "static steps": static_steps})

`tests/test_course.py` fails when a notebook asserts on a timing without `claim`.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

BASES = ("counts", "simulated")   # the bases a claim can rest on besides measured Rounds
MIN_ROUNDS = 3                    # a measured claim needs at least this many rounds of each figure


class ClaimFailed(AssertionError):
    """A chapter's claim did not hold on what was just measured."""


@dataclass
class Rounds:
    """Seconds (or any figure) per round for each named measurement, taken interleaved."""
    values: dict[str, list[float]] = field(default_factory=dict)

    @property
    def num_rounds(self) -> int:
        return min((len(v) for v in self.values.values()), default=0)

    def add(self, name: str, value: float) -> None:
        self.values.setdefault(name, []).append(float(value))

    def best(self, name: str) -> float:
        """The smallest value: the machine's speed when nothing interfered (for times)."""
        return min(self.values[name])

    def most(self, name: str) -> float:
        """The largest value: the best round for rates such as tokens/s."""
        return max(self.values[name])

    def median(self, name: str) -> float:
        return statistics.median(self.values[name])

    def table(self) -> dict[str, str]:
        """Each figure as 'median [min-max]', for printing beside a claim."""
        return {name: f"{statistics.median(v):.4g} [{min(v):.4g}-{max(v):.4g}]" for name, v in self.values.items()}


def interleaved(measurements: dict[str, Callable[[], float | None]], rounds: int = 5,
                warmup: bool = True) -> Rounds:
    """Run every measurement once per round, in turn, `rounds` times.

    Each callable either returns the figure it measured itself (for example a step time from the
    engine's records) or returns None, and is then timed as a whole with a monotonic clock."""
    if rounds < MIN_ROUNDS:
        raise ValueError(f"rounds={rounds}: a measured claim needs at least {MIN_ROUNDS} rounds")
    if warmup:
        for fn in measurements.values():
            fn()
    result = Rounds()
    for _ in range(rounds):
        for name, fn in measurements.items():
            start = time.perf_counter()
            value = fn()
            result.add(name, time.perf_counter() - start if value is None else value)
    return result


def claim(statement: str, holds: bool, *, on: Rounds | str, shown: dict | None = None) -> None:
    """Print the claim with the figures it rests on; raise ClaimFailed with them if it does not hold.

    `on` is the basis: a `Rounds` of at least MIN_ROUNDS interleaved rounds for a claim on measured
    time, or "counts" / "simulated" for a claim no machine changes. `shown` adds figures printed
    beside the claim (a measured wall-clock figure, say) that the claim does not rest on."""
    if isinstance(on, Rounds):
        if on.num_rounds < MIN_ROUNDS:
            raise ValueError(f"on=Rounds with {on.num_rounds} rounds: a measured claim needs at least "
                             f"{MIN_ROUNDS} interleaved rounds of each figure")
        basis, figures = f"measured, {on.num_rounds} interleaved rounds", on.table()
    elif on in BASES:
        basis, figures = on, {}
    else:
        raise ValueError(f"on={on!r}: a claim rests on Rounds of measurements or on one of {BASES}")
    figures = {**figures, **{k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in (shown or {}).items()}}
    line = f"{'holds' if holds else 'DOES NOT HOLD'} ({basis}): {statement}"
    print(line + "".join(f"\n    {k}: {v}" for k, v in figures.items()))
    if not holds:
        raise ClaimFailed(f"{statement} (on {basis}); figures: {figures}")
