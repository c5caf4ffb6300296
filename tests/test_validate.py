"""The one field checker: whatever it refuses, the message names the field, the value and what is allowed;
whatever it accepts is a real number (or integer) in range. Every config, distribution, SLA and workload
uses it, so the same value gets the same message everywhere."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minibatch.analysis.memory import KVShape
from minibatch.analysis.sla import SLA
from minibatch.config import EngineConfig
from minibatch.validate import ConfigError, check_int, check_number
from minibatch.workloads import ClosedLoop
from minibatch.workloads.distributions import Poisson

ANYTHING = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True, allow_infinity=True),
                     st.text(max_size=3), st.lists(st.integers(), max_size=2))


@given(ANYTHING, st.integers(-2, 2), st.booleans())
def test_check_number_accepts_exactly_the_numbers_in_range(value, minimum, strict):
    real = not isinstance(value, bool) and isinstance(value, (int, float)) and not (isinstance(value, float)
                                                                                     and math.isnan(value))
    fits = real and (value > minimum if strict else value >= minimum)
    if fits:
        check_number("Owner", "field", value, minimum, strict=strict)
    else:
        with pytest.raises(ConfigError) as refused:
            check_number("Owner", "field", value, minimum, strict=strict)
        relation = ">" if strict else ">="
        assert str(refused.value) == f"Owner.field={value!r} is not allowed: a number {relation} {minimum}"


@given(ANYTHING)
def test_check_int_refuses_bools_floats_and_small_values(value):
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        check_int("Owner", "field", value, 1)
    else:
        with pytest.raises(ConfigError, match=r"^Owner\.field=.* is not allowed: an integer >= 1$"):
            check_int("Owner", "field", value, 1)


@pytest.mark.parametrize("build, message", [
    (lambda: EngineConfig(batch_timeout_s=True), "EngineConfig.batch_timeout_s=True is not allowed: a number >= 0.0"),
    (lambda: Poisson(rate=float("nan")), "Poisson.rate=nan is not allowed: a number > 0.0"),
    (lambda: ClosedLoop(users=2.0), "ClosedLoop.users=2.0 is not allowed: an integer >= 1"),
    (lambda: KVShape("m", 0, 1, 1), "KVShape.num_layers=0 is not allowed: an integer >= 1"),
    (lambda: SLA(percentile=101), "SLA.percentile=101 is not allowed: a number in (0, 100]"),
])
def test_every_owner_says_it_the_same_way(build, message):
    with pytest.raises(ConfigError) as refused:
        build()
    assert str(refused.value) == message
