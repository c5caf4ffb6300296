"""Workloads: arrival processes, length distributions, shipped prompts, the closed loop and JSONL traces."""
import numpy as np
import pytest

from minibatch import LLM, ConfigError, EngineConfig, SamplingParams, WorkloadRequest, load_workload, save_workload
from minibatch.workloads import (AllAtOnce, Bursts, ClosedLoop, Empirical, Exponential, Fixed, LogNormal, Poisson,
                                Uniform, load_prompts, make_workload)


def rng(seed=0):
    return np.random.default_rng(seed)


def test_arrival_processes():
    assert AllAtOnce().times(rng(), 4).tolist() == [0.0] * 4
    assert Bursts(size=3, every_s=2.0).times(rng(), 7).tolist() == [0, 0, 0, 2, 2, 2, 4]
    times = Poisson(rate=5.0).times(rng(), 20000)
    gaps = np.diff(times)
    assert times[0] == 0.0 and (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(1 / 5.0, rel=0.03)
    assert gaps.std() == pytest.approx(1 / 5.0, rel=0.05)          # exponential gaps: std == mean


def test_length_distributions():
    n = 20000
    assert (Fixed(7).sample(rng(), 5) == 7).all()
    u = Uniform(3, 6).sample(rng(), n)
    assert set(u.tolist()) == {3, 4, 5, 6}
    e = Exponential(mean=40).sample(rng(), n)
    assert e.min() >= 1 and e.mean() == pytest.approx(40.5, rel=0.05)   # ceil adds half a token on average
    assert Exponential(mean=40, cap=50).sample(rng(), n).max() == 50
    ln = LogNormal(median=64, sigma=0.8).sample(rng(), n)
    assert np.median(ln) == pytest.approx(64, rel=0.05) and ln.max() > 4 * 64   # a long tail
    assert LogNormal(median=64, sigma=0.8, cap=100).sample(rng(), n).max() == 100
    assert LogNormal(median=10, sigma=0).sample(rng(), 3).tolist() == [10, 10, 10]
    emp = Empirical([5, 9, 9]).sample(rng(), n)
    assert set(emp.tolist()) == {5, 9} and (emp == 9).mean() == pytest.approx(2 / 3, abs=0.02)


@pytest.mark.parametrize("make, field", [
    (lambda: Poisson(rate=0), "Poisson.rate=0"), (lambda: Bursts(0, 1.0), "Bursts.size=0"),
    (lambda: Bursts(2, -1.0), "Bursts.every_s=-1.0"), (lambda: Fixed(0), "Fixed.value=0"),
    (lambda: Uniform(5, 2), "Uniform.high=2"), (lambda: Exponential(mean=10, cap=0), "Exponential.cap=0"),
    (lambda: LogNormal(median=-1), "LogNormal.median=-1"), (lambda: Empirical([]), "Empirical.values"),
    (lambda: Empirical([3, 0]), "Empirical.values"), (lambda: ClosedLoop(0), "ClosedLoop.users=0"),
    (lambda: make_workload(0), "num_requests=0"), (lambda: make_workload(3, arrival=ClosedLoop(2)), "arrival="),
    (lambda: make_workload(3, prompt_len=Fixed(5)), "tokenizer"), (lambda: load_prompts("poetry"), "kind='poetry'"),
])
def test_bad_parameters_name_the_field(make, field):
    with pytest.raises(ConfigError, match=field.replace("(", r"\(").replace("[", r"\[")):
        make()


def test_shipped_prompts_are_many_distinct_and_varied():
    prompts = load_prompts()
    assert len(prompts) >= 30 and len(set(prompts)) == len(prompts)
    lengths = sorted(len(p) for p in prompts)
    assert lengths[-1] > 10 * lengths[0]                          # short questions and long passages
    assert 0 < len(load_prompts("code")) < len(prompts)


def test_make_workload_is_seeded_and_follows_its_distributions():
    w1 = make_workload(50, Poisson(rate=2.0), output_len=Uniform(4, 9), seed=1)
    assert w1 == make_workload(50, Poisson(rate=2.0), output_len=Uniform(4, 9), seed=1)
    assert w1 != make_workload(50, Poisson(rate=2.0), output_len=Uniform(4, 9), seed=2)
    assert [w.arrival_s for w in w1] == sorted(w.arrival_s for w in w1)
    assert {w.params.max_new_tokens for w in w1} <= set(range(4, 10)) and all(w.params.ignore_eos for w in w1)
    assert set(w.prompt for w in w1) <= set(load_prompts())
    # the arrival times do not depend on the length distributions (separate random streams)
    w3 = make_workload(50, Poisson(rate=2.0), output_len=Fixed(3), seed=1)
    assert [w.arrival_s for w in w3] == [w.arrival_s for w in w1]
    chats = make_workload(3, as_chat=True, prompts=["hi", "yo"])
    assert all(w.prompt[0]["role"] == "user" and w.prompt[0]["content"] in ("hi", "yo") for w in chats)


def test_prompt_len_cuts_exact_token_counts():
    llm = LLM(EngineConfig(model="tiny", clock="simulated", sim_skip_model=True))
    workload = make_workload(20, prompt_len=Uniform(5, 60), tokenizer=llm.tokenizer, seed=0)
    rng_in = np.random.default_rng(np.random.SeedSequence(0).spawn(4)[2])
    assert [len(w.prompt) for w in workload] == Uniform(5, 60).sample(rng_in, 20).tolist()
    corpus = "\n\n".join(load_prompts())
    for w in workload:                                            # windows of the shipped texts
        assert all(word in corpus for word in llm.tokenizer.decode(w.prompt).split()[1:-1])


def test_closed_loop_keeps_at_most_n_requests_in_flight():
    llm = LLM(EngineConfig(model="tiny", clock="simulated", sim_skip_model=True, max_batch_size=8))
    workload = make_workload(12, output_len=Uniform(2, 10), seed=0)
    report = llm.run(workload, use_tqdm=False, arrival=ClosedLoop(users=3, think_s=0.0))
    assert all(r.e2e is not None for r in report.requests)
    assert max(s.batch_size + s.queue_depth for s in report.steps) <= 3
    finishes = sorted(r.arrival_time + r.e2e for r in report.requests)
    arrivals = sorted(r.arrival_time for r in report.requests)
    assert arrivals[:3] == [report.start_time] * 3
    assert arrivals[3:] == pytest.approx(finishes[:9])            # think 0: the next request follows each answer
    thinking = LLM(EngineConfig(model="tiny", clock="simulated", sim_skip_model=True)).run(
        workload, use_tqdm=False, arrival=ClosedLoop(users=3, think_s=5.0, seed=1))
    assert thinking.duration > report.duration + 5.0
    with pytest.raises(ConfigError, match="arrival=Poisson.* is not allowed: None .* or ClosedLoop"):
        llm.run(workload, arrival=Poisson(rate=1.0))            # open-loop arrival times belong in make_workload


def test_jsonl_round_trip(tmp_path):
    workload = make_workload(5, Bursts(2, 0.5), output_len=Uniform(1, 9), seed=4)
    workload.append(WorkloadRequest(3.0, [1, 2, 3], SamplingParams(max_new_tokens=4, stop_token_ids=(7,))))
    path = tmp_path / "trace.jsonl"
    save_workload(workload, path)
    assert load_workload(path) == workload


@pytest.mark.parametrize("line, message", [
    ('{"arrival_s": 1.0, "prompt": "x", "max_tokens": 4}', "line 3: unknown field 'max_tokens'"),
    ('{"arrival_s": -1, "prompt": "x"}', "line 3: WorkloadRequest.arrival_s=-1"),
    ('{"arrival_s": 1.0, "prompt": "x", "max_new_tokens": 0}', "line 3: SamplingParams.max_new_tokens=0"),
    ('{"arrival_s": 1.0', "line 3: "),
    ('[1, 2]', "line 3: a workload line must be a JSON object"),
    ('{"arrival_s": 1.0}', "line 3: field 'prompt' is missing"),
])
def test_bad_trace_lines_name_their_line_number(tmp_path, line, message):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"arrival_s": 0.0, "prompt": "ok"}\n\n' + line + "\n")
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        load_workload(path)
