"""The banded cost model and its fit: terms add up, bands follow the row counts, a known model is recovered
from its own steps, non-negative least squares stays non-negative, and the error table computes errors right."""
import numpy as np
import pytest

from minibatch.sim.costmodel import StepShape, cost_model
from minibatch.sim.fit import decode_table, fit_banded, fit_errors, nonnegative_least_squares, prefill_table
from minibatch.sim.stepcost import BandedCostModel

BANDS = (3, 16, 64)
KNOWN = BandedCostModel(fixed_s=0.002, weights_s=0.015, row_bands=BANDS, band_step_s=(0.0, 0.004, 0.010, 0.030),
                        per_row_s=(0.0005, 0.0009, 0.0006, 0.0004), per_sampled_row_s=0.0003,
                        per_kv_token_s=2e-6, per_attention_pair_s=1e-8)


def decode(batch: int, context: int) -> StepShape:
    kv = batch * (context + 1)
    return StepShape(decode_seqs=batch, kv_tokens_read=kv, attention_pairs=kv, sampled_rows=batch)


def prefill(length: int) -> StepShape:
    return StepShape(prefill_tokens=length, kv_tokens_read=length, attention_pairs=length * (length + 1) // 2,
                     sampled_rows=1)


def grid():
    shapes = [decode(b, c) for c in (64, 1024) for b in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)]
    return shapes + [prefill(n) for n in (8, 16, 32, 48, 64, 128, 256, 512)]


def test_bands_follow_the_row_counts_and_terms_add_up():
    assert [KNOWN.band(r) for r in (1, 3, 4, 16, 17, 64, 65, 512)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert KNOWN.band_names() == ["1-3", "4-16", "17-64", "65-"]
    shape = decode(8, 100)
    terms = KNOWN.terms(shape)
    assert terms["compute"] == pytest.approx(0.004 + 8 * 0.0009)
    assert terms["kv_read"] == pytest.approx(808 * 2e-6)
    assert KNOWN.step_time(shape) == pytest.approx(sum(terms.values()))
    with pytest.raises(ValueError, match="per_row_s"):
        BandedCostModel(0, 0, BANDS, (0,) * 4, (0,) * 3, 0, 0, 0)


def test_a_known_model_is_recovered_from_its_own_steps():
    points = [(s, KNOWN.step_time(s)) for s in grid()]
    fitted = fit_banded(points, BANDS, fixed_s=0.002)
    for shape, seconds in points:
        assert fitted.step_time(shape) == pytest.approx(seconds, rel=1e-6)
    assert fitted.fixed_s == pytest.approx(0.002) and fitted.weights_s == pytest.approx(0.015, rel=1e-4)
    assert fitted.per_kv_token_s == pytest.approx(2e-6, rel=1e-4)
    assert fit_errors(fitted, points)["max_rel_error"] < 1e-6


def test_noisy_steps_fit_within_their_noise_and_every_term_is_non_negative():
    rng = np.random.default_rng(0)
    points = [(s, KNOWN.step_time(s) * rng.uniform(0.97, 1.03)) for s in grid()]
    fitted = fit_banded(points, BANDS, fixed_s=0.0)
    assert all(abs(r["error"]) < 0.06 for r in decode_table(fitted, points))
    assert min(fitted.coefficients().values()) >= 0


def test_nonnegative_least_squares_clamps_what_would_go_negative():
    X, y = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), np.array([1.0, -1.0, 0.0])
    unconstrained, *_ = np.linalg.lstsq(X, y, rcond=None)
    assert unconstrained[1] < 0
    assert nonnegative_least_squares(X, y) == pytest.approx([0.5, 0.0])


def test_error_table_groups_by_batch_and_context_and_computes_the_error():
    shapes = [decode(b, c + i) for b in (1, 8) for c in (64, 1024) for i in range(3)] + [prefill(32)]
    points = [(s, KNOWN.step_time(s) / 1.1) for s in shapes]        # the model says 10% more than measured
    table = decode_table(KNOWN, points)
    assert [(r["batch"], r["context"]) for r in table] == [(1, 64), (1, 1024), (8, 64), (8, 1024)]
    assert all(r["error"] == pytest.approx(0.1) for r in table)
    assert all(r["model_s"] == pytest.approx(1.1 * r["measured_s"]) for r in table)
    assert [r["prefill_tokens"] for r in prefill_table(KNOWN, points)] == [32]


def test_a_banded_profile_round_trips_through_cost_model():
    profile = {"kind": "measured", "row_bands": list(BANDS), "coefficients": KNOWN.coefficients()}
    assert cost_model(profile) == KNOWN


def test_rows_in_blocks_of_four_cost_whole_blocks_and_are_recovered():
    grouped = BandedCostModel(**{**KNOWN.__dict__, "row_groups": (1, 4, 4, 1)})
    assert grouped.terms(decode(4, 64))["compute"] == pytest.approx(0.004 + 0.0009)       # one block of four
    assert grouped.terms(decode(5, 64))["compute"] == grouped.terms(decode(8, 64))["compute"] == \
        pytest.approx(0.004 + 2 * 0.0009)                              # rows 5 to 8: two blocks
    assert grouped.terms(prefill(100))["compute"] == pytest.approx(0.030 + 100 * 0.0004)   # oneDNN: row by row
    points = [(s, grouped.step_time(s)) for s in grid()]
    fitted = fit_banded(points, BANDS, fixed_s=0.002, row_groups=(1, 4, 4, 1))
    assert fitted.row_groups == (1, 4, 4, 1)
    assert all(fitted.step_time(s) == pytest.approx(t, rel=1e-6) for s, t in points)
    assert cost_model({"kind": "measured", "row_bands": list(BANDS), "row_groups": [1, 4, 4, 1],
                       "coefficients": grouped.coefficients()}) == grouped
