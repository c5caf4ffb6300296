"""The simulated clock and its cost models: time moves as the model says, scheduling is untouched.

The real clock and both simulated modes (real model with simulated time; no model at all) must
produce the same events in the same order for the same workload: which requests share each step,
in which slots, doing prefill or decode, and at which step each request gets its first token and
finishes. The workloads arrive all at once, so that ordering cannot depend on how fast this
machine happens to be. With the shipped reference profile the simulated summary is reproducible
bit for bit.
"""
import json

import pytest

from minibatch import LLM, ConfigError, EngineConfig, SamplingParams, WorkloadRequest
from minibatch.sim.clock import SimulatedClock, make_clock
from minibatch.engine.clock import RealClock
from minibatch.sim.costmodel import (LinearCostModel, ModelSize, RooflineCostModel, StepShape, cost_model, list_profiles,
                                 load_profile)
from minibatch.engine.models.tiny import smollm2_shaped_config
from minibatch.sim.stepcost import BandedCostModel
from minibatch.engine.request import Request
from minibatch.engine.schedulers import ScheduledSeq, StepPlan
from minibatch.workloads import Poisson, Uniform, make_workload


def request(prompt_len: int, computed: int = 0, outputs: int = 0) -> Request:
    r = Request(0, [5] * prompt_len, SamplingParams(max_new_tokens=8), 0.0)
    r.output_token_ids, r.num_computed_tokens = [7] * outputs, computed
    return r


def test_step_shape_counts_prefill_decode_and_causal_pairs():
    plan = StepPlan([ScheduledSeq(request(10), 10),                     # whole prompt: 10 rows see 1..10 keys
                     ScheduledSeq(request(20, computed=8), 4),          # chunk 8..11 of a prompt, no token yet
                     ScheduledSeq(request(6, computed=6, outputs=1), 1)])  # decode at position 6
    shape = StepShape.of(plan)
    assert shape == StepShape(prefill_tokens=14, decode_seqs=1, kv_tokens_read=10 + 12 + 7,
                              attention_pairs=55 + (9 + 10 + 11 + 12) + 7, sampled_rows=2)


def test_simulated_clock_charges_the_cost_model_and_sleeps_forward_only():
    model = LinearCostModel(overhead_s=0.01, per_prefill_token_s=0.001, per_decode_seq_s=0.002, per_kv_token_s=1e-5)
    clock = SimulatedClock(model)
    plan = StepPlan([ScheduledSeq(request(10), 10)])
    assert clock.charge_step(plan, 1.0) == pytest.approx(1.0 + 0.01 + 10 * 0.001 + 10 * 1e-5)
    clock.sleep_until(0.5)                       # the past: time never goes back
    assert clock.now() == pytest.approx(1.0 + 0.01 + 0.01 + 1e-4)
    clock.sleep_until(7.0)
    assert clock.now() == 7.0


def test_roofline_is_memory_bound_for_decode_and_compute_bound_for_long_prefill():
    profile = load_profile("h100-roofline")
    assert "MODELLED" in profile["description"]
    config = smollm2_shaped_config("1.7b")
    model = cost_model(profile, config)
    assert isinstance(model, RooflineCostModel)
    size, hw = ModelSize.of(config), profile["hardware"]
    decode = StepShape(decode_seqs=1, kv_tokens_read=100, attention_pairs=100, sampled_rows=1)
    weights_s = hw["bytes_per_value"] * (size.body_params + size.lm_head_params) / hw["memory_bandwidth"]
    assert model.step_time(decode) >= hw["overhead_s"] + weights_s / hw["efficiency"]
    # doubling the batch of a memory-bound decode costs almost nothing; doubling a long prefill doubles its compute
    assert model.step_time(StepShape(decode_seqs=2, kv_tokens_read=200, attention_pairs=200, sampled_rows=2)) < \
        1.05 * model.step_time(decode)
    prefill = StepShape(prefill_tokens=8192, kv_tokens_read=8192, attention_pairs=8192 * 8193 // 2, sampled_rows=1)
    big = StepShape(prefill_tokens=16384, kv_tokens_read=16384, attention_pairs=2 * prefill.attention_pairs, sampled_rows=2)
    assert model.step_time(big) - hw["overhead_s"] > 1.9 * (model.step_time(prefill) - hw["overhead_s"])


def test_profiles_load_and_bad_ones_are_refused(tmp_path):
    assert {"smollm2-135m-cpu", "h100-roofline", "phone-roofline"} <= set(list_profiles())
    assert isinstance(cost_model("smollm2-135m-cpu"), BandedCostModel)   # today's engine, fitted by row band
    with pytest.raises(ConfigError, match="sim_profile='no-such-profile'"):
        load_profile("no-such-profile")
    with pytest.raises(ConfigError, match="roofline"):
        cost_model("phone-roofline")                       # needs the model's shape
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "guess"}))
    with pytest.raises(ConfigError, match="kind"):
        load_profile(bad)


def test_config_fields_are_checked():
    with pytest.raises(ConfigError, match="sim_skip_model=True"):
        EngineConfig(model="tiny", sim_skip_model=True)    # needs clock="simulated"
    with pytest.raises(ConfigError, match="sim_profile=''"):
        EngineConfig(model="tiny", clock="simulated", sim_profile="")
    with pytest.raises(ConfigError, match="sim_profile='nowhere.json'"):
        LLM(EngineConfig(model="tiny", clock="simulated", sim_profile="nowhere.json"))
    assert isinstance(make_clock(EngineConfig(model="tiny")), RealClock)


def events(llm: LLM, workload):
    """What happened, without when: per step the slots, and per request its tokens and event steps."""
    report = llm.run(workload, use_tqdm=False)
    ends = [s.end for s in report.steps]
    step_at = lambda t: min(range(len(ends)), key=lambda i: abs(ends[i] - t))
    per_request = [(m.num_output_tokens, step_at(m.arrival_time + m.ttft), step_at(m.arrival_time + m.e2e))
                   for m in report.requests]
    return [s.slots for s in report.steps], per_request, report


def mixed_workload():
    lengths = [(5, 6), (30, 2), (12, 9), (3, 4), (40, 7), (8, 1), (20, 5)]      # (prompt bytes, max_new_tokens)
    text = lambda i, p: "".join(chr(97 + (7 * i + 3 * j) % 26) for j in range(p))
    return [WorkloadRequest(0.0, text(i, p), SamplingParams(max_new_tokens=n, ignore_eos=True))
            for i, (p, n) in enumerate(lengths)]


@pytest.mark.parametrize("fields", [dict(scheduler="continuous", max_batch_size=3, max_tokens_per_step=16),
                                    dict(scheduler="static", max_batch_size=3),
                                    dict(scheduler="continuous", max_batch_size=4, num_kv_blocks=8, block_size=8)],
                         ids=["continuous-chunked", "static", "continuous-preempting"])
def test_simulated_and_real_clocks_agree_on_the_order_of_events(fields):
    workload = mixed_workload()
    real = events(LLM(EngineConfig(model="tiny", **fields)), workload)
    timed = events(LLM(EngineConfig(model="tiny", clock="simulated", **fields)), workload)
    skipped = events(LLM(EngineConfig(model="tiny", clock="simulated", sim_skip_model=True, **fields)), workload)
    assert real[:2] == timed[:2] == skipped[:2]
    assert any(sum(kind != "held" for _, kind in slots.values()) > 1 for slots in real[0])   # batches were shared
    if "num_kv_blocks" in fields:
        assert real[2].summary()["preemptions"] > 0


def test_real_model_on_simulated_time_gives_the_real_tokens():
    prompts, params = ["hello there", "a longer prompt for the tiny model"], SamplingParams(max_new_tokens=6)
    real = LLM(EngineConfig(model="tiny", max_batch_size=2)).generate(prompts, params, use_tqdm=False)
    sim = LLM(EngineConfig(model="tiny", max_batch_size=2, clock="simulated")).generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in real] == [o.token_ids for o in sim]


def test_skip_model_runs_every_request_to_max_new_tokens_without_weights():
    llm = LLM(EngineConfig(model="tiny", clock="simulated", sim_skip_model=True))
    assert llm.engine.kv_cache.k[0].device.type == "meta"
    eos = sorted(llm.engine.eos_token_ids)
    outs = llm.generate(["abc", "de"], [SamplingParams(max_new_tokens=5), SamplingParams(max_new_tokens=3,
                                        stop_token_ids=(0, 1, 2, 3))], use_tqdm=False)
    assert [len(o.token_ids) for o in outs] == [5, 3]
    assert [o.finish_reason for o in outs] == ["length", "length"]
    assert not set(outs[0].token_ids) & set(eos) and not set(outs[1].token_ids) & {0, 1, 2, 3}


def test_simulated_time_is_the_cost_model_s_time(tmp_path):
    profile = tmp_path / "flat.json"                          # every step costs exactly 0.5 s
    profile.write_text(json.dumps({"kind": "measured", "description": "test", "coefficients": {
        "overhead_s": 0.5, "per_prefill_token_s": 0.0, "per_decode_seq_s": 0.0, "per_kv_token_s": 0.0}}))
    llm = LLM(EngineConfig(model="tiny", clock="simulated", sim_skip_model=True, sim_profile=str(profile),
                           max_batch_size=2))
    workload = [WorkloadRequest(t, "hi", SamplingParams(max_new_tokens=3)) for t in (0.0, 0.0, 10.2)]
    report = llm.run(workload, use_tqdm=False)
    # the first two share three steps (0 to 1.5 s); the engine idles until the third arrives at 10.2 s
    assert [t for m in report.requests for t in (m.ttft, m.e2e)] == pytest.approx([0.5, 1.5] * 3)
    assert [s.start for s in report.steps] == pytest.approx([0.0, 0.5, 1.0, 10.2, 10.7, 11.2])


def test_reference_profile_summary_is_bit_for_bit_reproducible():
    def summary():
        workload = make_workload(300, Poisson(rate=6.0), output_len=Uniform(4, 40), seed=3)
        llm = LLM(EngineConfig(model="smollm2-135m", clock="simulated", sim_skip_model=True,
                               sim_profile="smollm2-135m-cpu", max_batch_size=8))
        return llm.run(workload, use_tqdm=False).summary()

    first, second = summary(), summary()
    assert first == second                                      # exact float equality, every field
    assert first["requests"] == 300 and first["duration_s"] > 0
