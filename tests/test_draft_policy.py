"""The draft policy: each request drafts the k that maximises expected tokens per step over step cost,
none while drafting would slow it, and probes again after a backoff.

The decision logic runs on made-up step times and outcomes; end to end, greedy tokens stay exactly
plain decoding's (float32, `tiny`) while requests switch speculation off and on.
"""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch import LLM, ConfigError, EngineConfig, SamplingParams
from minibatch.engine.draft_policy import DraftPolicy, expected_tokens_per_step
from tests.conftest import reference_greedy


def policy_with_costs(per_row: float, k_max: int = 4, batch: int = 1, backoff_steps: int = 4) -> DraftPolicy:
    """A policy whose steps have been timed: a plain step of `batch` rows takes 1, each more row per_row."""
    policy = DraftPolicy(k_max, backoff_steps=backoff_steps)
    for k in range(k_max + 1):
        policy.observe_step(batch + k, 1.0 + per_row * k)
    return policy


def test_step_time_takes_the_fastest_recent_and_interpolates():
    policy = DraftPolicy(k_max=4)
    assert policy.step_time(1) is None and policy.step_cost(1, 2) is None
    for t in (3.0, 1.0, 2.0):
        policy.observe_step(1, t)                         # other programs only slow a step down
    policy.observe_step(5, 2.0)
    assert policy.step_time(1) == 1.0
    assert policy.step_time(3) == pytest.approx(1.5)      # on the line between 1 and 5 rows
    assert policy.step_time(9) == 2.0                     # past the largest measured: its time
    assert policy.step_cost(1, 4) == 2.0


def test_best_k_drafts_all_when_free_and_accepted_and_none_when_costly():
    assert policy_with_costs(0.0).best_k(rate=1.0, batch=1, k_max=4) == 4
    assert policy_with_costs(0.0).best_k(rate=0.0, batch=1, k_max=4) == 0   # nothing to gain: no extra rows
    assert policy_with_costs(0.05).best_k(rate=0.15, batch=1, k_max=4) == 0  # gains under the margin: not worth it
    assert policy_with_costs(0.5).best_k(rate=0.3, batch=1, k_max=4) == 0   # 1.3 tokens for 1.5 steps
    assert policy_with_costs(0.05).best_k(rate=0.6, batch=1, k_max=4) in (2, 3, 4)


@settings(max_examples=200, deadline=None)
@given(rate=st.floats(0.0, 1.0), per_row=st.floats(0.0, 2.0), k_max=st.integers(1, 8))
def test_best_k_drafts_only_what_gains_the_margin_and_no_other_k_gains_more(rate, per_row, k_max):
    policy = policy_with_costs(per_row, k_max)
    k = policy.best_k(rate, batch=1, k_max=k_max)
    gains = [expected_tokens_per_step(rate, j) / policy.step_cost(1, j) for j in range(k_max + 1)]
    assert 0 <= k <= k_max
    if k:
        assert gains[k] >= policy.min_gain and gains[k] == max(gains)
    else:
        assert max(gains[1:]) < policy.min_gain       # nothing clears the margin: plain decoding


def test_a_plain_step_is_timed_before_anyone_drafts():
    policy = DraftPolicy(k_max=4)
    assert policy.num_drafts(0, batch=1, room=4) == 0
    policy.observe_step(1, 1.0)
    assert policy.num_drafts(0, batch=1, room=4) > 0      # unmeasured verify steps: tried, then measured
    assert policy.num_drafts(0, batch=1, room=0) == 0     # no KV room reserved: no drafts


def test_a_request_that_would_slow_down_switches_off_then_probes_and_can_win_again():
    policy = policy_with_costs(per_row=0.2, backoff_steps=4)
    rid = 7
    assert policy.num_drafts(rid, batch=1, room=4) > 0    # the prior acceptance (0.5) pays here
    for _ in range(3):
        policy.observe_outcome(rid, drafted=4, accepted=0)
    assert policy.num_drafts(rid, batch=1, room=4) == 0   # switched off
    assert [policy.num_drafts(rid, batch=1, room=4) for _ in range(3)] == [0, 0, 0]   # the backoff
    assert policy.num_drafts(rid, batch=1, room=4) == 1   # the probe: one draft
    assert policy.num_drafts(rid, batch=1, room=4) == 1   # no outcome yet (no match found): still probing
    policy.observe_outcome(rid, drafted=1, accepted=0)
    assert policy.num_drafts(rid, batch=1, room=4) == 0   # rejected: off again, for twice as long
    assert [policy.num_drafts(rid, batch=1, room=4) for _ in range(8)] == [0] * 7 + [1]
    for _ in range(4):                                    # the output starts copying its input
        policy.observe_outcome(rid, drafted=1, accepted=1)
    assert policy.num_drafts(rid, batch=1, room=4) > 1    # drafting pays again, more than one draft
    assert policy.requests[rid].backoff == 0              # and a later switch-off starts short again
    policy.release(rid)
    assert rid not in policy.requests


def test_failed_probes_double_the_wait_up_to_the_longest():
    policy = policy_with_costs(per_row=1.0, backoff_steps=2)   # drafting never pays here
    policy.max_backoff_steps = 8
    probes = []
    for step in range(1, 45):
        if policy.num_drafts(0, batch=1, room=4):
            probes.append(step)
            policy.observe_outcome(0, drafted=1, accepted=0)
    # off at step 1 for 2 steps, probe; off for 4, probe; then 8, 8, 8 (the longest)
    assert probes == [3, 8, 17, 26, 35, 44] and policy.requests[0].backoff == 8


@settings(max_examples=100, deadline=None)
@given(outcomes=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 6)), max_size=30))
def test_acceptance_rate_stays_a_rate(outcomes):
    policy = DraftPolicy(k_max=6)
    for drafted, accepted in outcomes:
        policy.observe_outcome(0, drafted, min(accepted, drafted))
    state = policy._state(0)
    assert 0.0 <= state.rate <= 1.0


def test_greedy_tokens_equal_plain_decoding_while_requests_switch_off_and_on(tiny_hf):
    """Steps timed on a made-up clock where each draft row costs 0.6 of a plain step: requests switch off,
    probe and draft again, and every token equals transformers' greedy generate() in float32."""
    prompts, new = [[5, 6, 7, 8, 9] * 3, list(range(20, 57)), [3] * 17, list(range(60, 75)) * 2], 32
    llm = LLM(EngineConfig(model="tiny", max_batch_size=4, speculative_method="ngram", num_speculative_tokens=4,
                           speculative_backoff_steps=3))
    policy = llm.engine.decoder.policy
    timed = policy.observe_step
    policy.observe_step = lambda rows, duration_s: timed(rows, 1.0 + 0.6 * max(0, rows - 4))  # 4 sequences: plain
    decisions, decide = [], policy.best_k
    policy.best_k = lambda *args: decisions.append(decide(*args)) or decisions[-1]
    outs = llm.generate(prompts, SamplingParams(max_new_tokens=new), use_tqdm=False)
    assert [o.token_ids for o in outs] == [reference_greedy(tiny_hf[0], p, new) for p in prompts]
    assert 0 in decisions and any(decisions[decisions.index(0):]), "want a switch-off, then drafts again"
    assert any(st.spec_outcomes for st in llm.engine.step_records)
    assert llm.engine.blocks.num_free_blocks == llm.engine.blocks.num_blocks and not policy.requests


def test_a_seeded_sample_repeats_whatever_the_step_times():
    """Sampled requests draft k every step whatever the policy measured, so a seed gives the same sample: the
    same tokens with the policy on (its steps timed on a clock where drafts cost a lot) as with it off."""
    prompts, params = [[5, 6, 7, 8, 9] * 3, list(range(20, 57))], SamplingParams(max_new_tokens=24, temperature=0.8,
                                                                                 seed=7)
    runs = []
    for adaptive in (True, False):
        llm = LLM(EngineConfig(model="tiny", max_batch_size=2, speculative_method="ngram", num_speculative_tokens=4,
                               speculative_adaptive=adaptive))
        if adaptive:
            timed = llm.engine.decoder.policy.observe_step
            llm.engine.decoder.policy.observe_step = lambda rows, duration_s: timed(rows, float(rows))
        runs.append([o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)])
    assert runs[0] == runs[1]


@pytest.mark.parametrize("field,value,allowed", [
    ("speculative_adaptive", "yes", "True or False"),
    ("speculative_backoff_steps", 0, "an integer >= 1"),
    ("speculative_backoff_steps", 2.5, "an integer >= 1")])
def test_bad_policy_settings_fail_clearly(field, value, allowed):
    with pytest.raises(ConfigError, match=rf"EngineConfig\.{field}={value!r} is not allowed: {allowed}"):
        EngineConfig(model="tiny", speculative_method="ngram", **{field: value})
