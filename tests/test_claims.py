"""Measured claims: a claim on time needs interleaved rounds; every claim names its basis and fails loudly."""
import pytest
from hypothesis import given, strategies as st

from minibatch.analysis.claims import ClaimFailed, Rounds, claim, interleaved


def test_interleaved_runs_each_measurement_in_turn():
    order = []
    rounds = interleaved({"a": lambda: order.append("a") or 1.0, "b": lambda: order.append("b") or None},
                         rounds=3, warmup=False)
    assert order == ["a", "b"] * 3
    assert rounds.values["a"] == [1.0, 1.0, 1.0] and len(rounds.values["b"]) == 3 and rounds.num_rounds == 3


def test_too_few_rounds_is_refused():
    with pytest.raises(ValueError, match="at least 3"):
        interleaved({"a": lambda: 1.0}, rounds=1)
    one = Rounds({"a": [1.0]})
    with pytest.raises(ValueError, match="at least 3 interleaved rounds"):
        claim("a is fast", True, on=one)


def test_claim_needs_a_known_basis():
    with pytest.raises(ValueError, match="counts"):
        claim("x", True, on="wall clock")


def test_failed_claim_names_its_figures(capsys):
    with pytest.raises(ClaimFailed, match="steps"):
        claim("fewer steps", False, on="counts", shown={"steps": 12})
    assert "DOES NOT HOLD (counts): fewer steps" in capsys.readouterr().out


@given(st.lists(st.floats(0.001, 100), min_size=3, max_size=9))
def test_best_most_median_bound_each_other(values):
    r = Rounds({"x": values})
    assert r.best("x") <= r.median("x") <= r.most("x")
