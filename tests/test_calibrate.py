"""Calibration and the real-engine timeout trial, on the tiny model: the steps timed are the shapes asked
for, a profile records what it measured and loads as a cost model, and the trial reports every request."""
import argparse

import pytest

from minibatch.tools.calibrate import calibrate, main, report
from minibatch.tools.step_timing import StepTimer, step_ratios
from minibatch.tools.timeout_trial import timeout_trial, ttft_within_bound
from minibatch.sim.costmodel import cost_model, save_profile
from minibatch.sim.fingerprint import engine_fingerprint
from minibatch.sim.stepcost import BandedCostModel


def test_decode_steps_are_timed_at_the_context_asked_for_without_computing_the_prompts():
    timer = StepTimer("tiny", max_batch=4, max_context=40, decode_steps=3)
    steps = timer.decode(3, 40)
    assert len(steps) == 3 and all(s.decode_seqs == 3 and s.prefill_tokens == 0 for s, _ in steps)
    assert [s.kv_tokens_read for s, _ in steps] == [3 * 41, 3 * 42, 3 * 43]
    assert all(seconds > 0 for _, seconds in steps) and not timer.runner.skip
    assert [s.prefill_tokens for s, _ in timer.prefill(16)] == [16]
    ratios, first = step_ratios(timer, batches=(1, 2), context=16, rounds=1)
    assert ratios[1] == 1.0 and first > 0 and set(ratios) == {1, 2}


def test_the_timer_is_cpu_time_on_one_thread_and_a_bad_one_is_refused():
    assert StepTimer("tiny", max_batch=2, max_context=16, timer="cpu").timer == "cpu"
    assert StepTimer("tiny", max_batch=2, max_context=16, timer="wall").timer == "wall"
    with pytest.raises(ValueError, match="timer='gpu'"):
        StepTimer("tiny", max_batch=2, max_context=16, timer="gpu")


def test_a_calibrated_profile_says_what_it_measured_and_loads(tmp_path, capsys):
    profile = calibrate("tiny", rounds=1, use_tqdm=False, batches=(1, 2, 4), contexts=(16, 48), prefill_lens=(8, 24))
    assert profile["engine_fingerprint"] == engine_fingerprint()
    assert {"processor", "threads", "dtype", "attention_backend", "torch"} <= set(profile["machine"])
    model = cost_model(profile)
    assert isinstance(model, BandedCostModel) and min(model.coefficients().values()) >= 0
    text = report(profile)
    assert "ctx 16" in text and "ctx 48" in text and "worst decode error" in text
    path = tmp_path / "mine.json"
    save_profile(profile, path)
    assert main(argparse.Namespace(show=str(path))) == 0
    assert "prefill steps" in capsys.readouterr().out


def test_timeout_trial_serves_every_request_once_per_timeout():
    runs = timeout_trial(timeouts=(0.0, 0.05), num_requests=6, new_tokens=4, model="tiny")
    assert [r["batch_timeout_s"] for r in runs] == [0.0, 0.05]
    for run in runs:
        assert len(run["ttft_s"]) == 6 and all(t > 0 for t in run["ttft_s"])
        assert 1 <= run["mean_decode_batch"] <= 8 and run["longest_step_s"] >= run["median_step_s"] > 0
    (row,) = ttft_within_bound(runs)
    assert row["requests"] == 6 and 0 <= row["within_bound"] <= 6 and row["bound_s"] > 0.05
