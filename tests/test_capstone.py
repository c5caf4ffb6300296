"""The capstone: its workload and score are deterministic on the simulated clock, the reference
solution meets the target within the KV budget, poor configurations fail with the limit they
missed, and bad input gets a clear error."""

import ast
import json
from dataclasses import replace
from pathlib import Path

import pytest

from minibatch import EngineConfig
from minibatch.tools import capstone
from minibatch.checks import check_capstone
from minibatch.config import ConfigError
from minibatch.analysis.memory import KVShape

ROOT = Path(__file__).resolve().parent.parent
BASELINE = EngineConfig(model="smollm2-135m", scheduler="static", max_batch_size=32, batch_timeout_s=0.3,
                        block_size=16, num_kv_blocks=34)


@pytest.fixture(scope="module")
def reference_config() -> EngineConfig:
    """choose_config() as solutions/15_capstone.ipynb writes it."""
    cells = json.loads((ROOT / "solutions" / "15_capstone.ipynb").read_text())["cells"]
    source = next("".join(c["source"]) for c in cells if "exercise" in c.get("metadata", {}).get("tags", []))
    tree = ast.parse(source)
    tree.body = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef))]
    namespace = {}
    exec(compile(tree, "solutions/15_capstone.ipynb", "exec"), namespace)
    return namespace["choose_config"]()


@pytest.fixture(scope="module")
def reference_score(reference_config):
    return capstone.score(reference_config)


def test_workload_is_fixed_and_mixed():
    requests, classes = capstone.workload()
    again, again_classes = capstone.workload()
    assert [(w.arrival_s, w.prompt, w.params) for w in requests] == [(w.arrival_s, w.prompt, w.params) for w in again]
    assert classes == again_classes and set(classes) == {"chat", "document"}
    arrivals = [w.arrival_s for w in requests]
    assert arrivals == sorted(arrivals)
    for at, size in capstone.BURSTS:                      # each burst: its requests arrive within a second
        assert sum(at <= t < at + 1 for t in arrivals) >= size
    docs = [w for w, k in zip(requests, classes) if k == "document"]
    chats = [w for w, k in zip(requests, classes) if k == "chat"]
    assert min(len(w.prompt) for w in docs) > 2 * max(len(w.prompt) for w in chats)
    assert all(w.params.ignore_eos for w in requests)


def test_confirmation_is_the_first_burst_shifted_to_zero():
    requests, classes = capstone.workload()
    burst, burst_classes = capstone.confirmation_workload()
    start, end = capstone.CONFIRM_WINDOW
    inside = [(w, k) for w, k in zip(requests, classes) if start <= w.arrival_s < end]
    assert len(burst) == len(inside) >= 10
    assert [w.prompt for w in burst] == [w.prompt for w, _ in inside]
    assert [w.arrival_s + start for w in burst] == pytest.approx([w.arrival_s for w, _ in inside])
    assert min(w.arrival_s for w in burst) == pytest.approx(0.0, abs=0.1)
    assert burst_classes == [k for _, k in inside]


def test_score_is_deterministic(reference_config):
    first, second = capstone.score(reference_config), capstone.score(reference_config)
    assert first.goodput_req_s == second.goodput_req_s and first.attainment == second.attainment
    assert first.tails == second.tails and first.over == second.over
    assert [r.ttft for r in first.report.requests] == [r.ttft for r in second.report.requests]


def test_reference_solution_meets_the_target(reference_config, reference_score):
    assert reference_score.met and reference_score.shortfalls() == []
    assert min(reference_score.attainment.values()) >= capstone.TARGET
    assert reference_score.kv_bytes <= capstone.KV_BUDGET_BYTES
    assert reference_score.goodput_req_s > 1.5 * capstone.score(BASELINE).goodput_req_s
    assert check_capstone(lambda: reference_config).solved


def test_goodput_counts_the_requests_within_their_class_sla(reference_score):
    requests, classes = capstone.workload()
    runs = reference_score.report.requests
    good = sum(capstone.SLAS[k].request_ok(r) for r, k in zip(runs, classes))
    assert reference_score.goodput_req_s == pytest.approx(good / reference_score.report.duration)
    chat = [r for r, k in zip(runs, classes) if k == "chat"]
    assert reference_score.counts["chat"] == len(chat)
    assert reference_score.attainment["chat"] == pytest.approx(
        sum(capstone.SLAS["chat"].request_ok(r) for r in chat) / len(chat))


@pytest.mark.parametrize("config, missed", [
    (BASELINE, "chat: .* over the TTFT limit"),                                                   # static, 0.3 s wait
    (EngineConfig(model="smollm2-135m", num_kv_blocks=34), "chat: .* over the TTFT limit"),       # 8 slots for a burst of 20
    (EngineConfig(model="smollm2-135m", scheduler="edge", num_kv_blocks=34), "document: .* over the TTFT limit"),
    (EngineConfig(model="smollm2-135m", max_batch_size=20, num_kv_blocks=20), "chat: .* over the TTFT limit"),  # preempts
    (EngineConfig(model="smollm2-135m", max_batch_size=16, block_size=8, num_kv_blocks=68, max_tokens_per_step=256),
     "chat: .* over the TTFT limit"),                                 # four of each burst wait for a slot
    (EngineConfig(model="smollm2-135m", max_batch_size=24, block_size=8, num_kv_blocks=68, max_tokens_per_step=256),
     "chat: .* over the TPOT limit of 0.085 s"),                      # a step of 24 is too long for the TPOT limit
])
def test_poor_configs_fail_naming_the_limit(config, missed):
    score = capstone.score(config)
    assert not score.met and score.kv_bytes <= capstone.KV_BUDGET_BYTES
    with pytest.raises(AssertionError, match=missed):
        check_capstone(lambda: config)


def test_kv_budget_is_a_hard_rule(reference_config):
    per_token = KVShape.of_model("smollm2-135m").bytes_per_token
    blocks = capstone.KV_BUDGET_BYTES // (per_token * reference_config.block_size)
    fits = capstone.score(replace(reference_config, num_kv_blocks=blocks))
    over = capstone.score(replace(reference_config, num_kv_blocks=blocks + 1))
    assert fits.kv_bytes == blocks * reference_config.block_size * per_token and fits.met
    assert over.attainment == fits.attainment and not over.met
    assert "MiB over the budget of 24 MiB" in over.shortfalls()[0]
    with pytest.raises(AssertionError, match="over the budget"):
        check_capstone(lambda: EngineConfig(model="smollm2-135m", max_batch_size=20))   # 1 GiB by default


def test_speculative_settings_are_left_out_of_the_score(reference_config, reference_score):
    speculating = replace(reference_config, speculative_method="ngram", num_speculative_tokens=3)
    assert capstone.simulated(speculating).speculative_method is None
    assert capstone.score(speculating).goodput_req_s == reference_score.goodput_req_s


def test_stub_is_unsolved():
    def choose_config():
        raise NotImplementedError("Exercise: write this part")

    assert not check_capstone(choose_config).solved


@pytest.mark.parametrize("config, field", [
    ("continuous", "config='continuous'"),
    (EngineConfig(model="tiny"), "EngineConfig.model='tiny'"),
    (EngineConfig(model="smollm2-135m", dtype="bfloat16"), "EngineConfig.dtype='bfloat16'"),
    (EngineConfig(model="smollm2-135m", num_kv_blocks=4), "num_kv_blocks=4"),      # a document can never fit
])
def test_bad_configs_are_refused(config, field):
    with pytest.raises(ConfigError, match=field.replace("(", r"\(")):
        capstone.score(config)
    with pytest.raises(AssertionError, match="cannot serve this configuration|must return an EngineConfig"):
        check_capstone(lambda: config)


def test_bad_answers_are_explained():
    with pytest.raises(AssertionError, match="must return an EngineConfig, got 20"):
        check_capstone(lambda: 20)
    with pytest.raises(AssertionError, match="the engine refuses: EngineConfig.speculative_method='ngram'"):
        check_capstone(lambda: EngineConfig(model="smollm2-135m", scheduler="static", speculative_method="ngram"))


def test_evaluate_needs_one_class_per_request(reference_score):
    runs = reference_score.report
    with pytest.raises(ConfigError, match="classes has 3 entries for 88 requests"):
        capstone.evaluate(runs, ["chat"] * 3, 0)
    with pytest.raises(ConfigError, match="'chat', 'document'"):
        capstone.evaluate(runs, ["batch"] * len(runs.requests), 0)
