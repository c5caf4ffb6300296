"""prefill_sharing counts the steps that computed a long prompt and what the decoding requests got in them."""
import pytest

from minibatch import LLM, EngineConfig
from minibatch.analysis.stalls import prefill_sharing
from minibatch.widgets.chunking import stall_workload

IDS = [3 + i % 200 for i in range(600)]


def stall_run(budget, step_priority="decode-first"):
    llm = LLM(EngineConfig(model="smollm2-135m", max_tokens_per_step=budget, clock="simulated", sim_skip_model=True,
                           step_priority=step_priority, sim_profile="reference-cpu"))   # fixed: counts below hold
    report = llm.run(stall_workload(IDS, 512), use_tqdm=False)
    return prefill_sharing(report.steps, report.requests[-1].request_id)


def test_whole_prompt_takes_one_step_that_the_decoders_wait_for():
    whole = stall_run(1024)
    assert whole == {"prefill_steps": 1, "shared_steps": 1, "stalled": 0, "largest_step_tokens": 515}


def test_chunked_prompt_shares_every_step_with_the_decoders():
    chunked = stall_run(64)
    assert chunked["prefill_steps"] == 9 == chunked["shared_steps"]   # 512 tokens in chunks of 61 beside 3 decodes
    assert chunked["stalled"] == 0 and chunked["largest_step_tokens"] == 64


def test_prefill_first_leaves_the_decoders_without_a_token():
    first = stall_run(64, step_priority="prefill-first")
    assert first["stalled"] > 0 and first["shared_steps"] < first["prefill_steps"]


def test_a_request_that_never_prefilled_is_an_error():
    report = LLM(EngineConfig(model="smollm2-135m", clock="simulated", sim_skip_model=True)).run(
        stall_workload(IDS, 64), use_tqdm=False)
    with pytest.raises(ValueError, match="request_id=99"):
        prefill_sharing(report.steps, 99)
