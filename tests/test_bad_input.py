"""Bad input fails before any work starts, with a message naming the field, the value and what is allowed,
and leaves the engine able to serve the next requests."""
import pytest

from minibatch import LLM, ConfigError, EngineConfig, SamplingParams, WorkloadRequest, load_workload


@pytest.fixture(scope="module")
def llm():
    return LLM(EngineConfig(model="tiny", num_kv_blocks=8, block_size=16, max_model_len=512))


def still_serves(llm):
    out = llm.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3), use_tqdm=False)[0]
    assert len(out.token_ids) == 3
    assert llm.engine.blocks.num_free_blocks == llm.engine.blocks.num_blocks
    assert not llm.engine.has_unfinished()


@pytest.mark.parametrize("prompts,words", [
    ("", ["prompts[0]", "''", "at least one token"]),
    ([], ["prompts", "at least one prompt"]),
    ([[]], ["prompts[0]", "[]"]),
    ([[1, 2, 99999]], ["99999", "[0, 259)"]),
    ([3.5], ["3.5", "string, a list of token ids or a chat"]),
    ([list(range(1, 200)) * 3], ["597 tokens", "at most 511"]),
])
def test_bad_prompts(llm, prompts, words):
    with pytest.raises(ConfigError) as err:
        llm.generate(prompts, SamplingParams(max_new_tokens=4), use_tqdm=False)
    for word in words:
        assert word in str(err.value)
    still_serves(llm)


@pytest.mark.parametrize("kwargs,words", [
    ({"max_new_tokens": 0}, ["max_new_tokens=0", ">= 1"]),
    ({"max_new_tokens": -3}, ["max_new_tokens=-3"]),
    ({"temperature": -0.5}, ["temperature=-0.5", ">= 0"]),
    ({"top_p": 0.0}, ["top_p=0.0", "(0, 1]"]),
    ({"top_p": 1.5}, ["top_p=1.5", "(0, 1]"]),
    ({"top_k": -2}, ["top_k=-2", "0 or -1"]),
    ({"min_p": 1.5}, ["min_p=1.5", "[0, 1]"]),
    ({"repetition_penalty": 0.0}, ["repetition_penalty=0.0", "a number > 0"]),
    ({"presence_penalty": 3}, ["presence_penalty=3", "[-2, 2]"]),
    ({"frequency_penalty": -2.5}, ["frequency_penalty=-2.5"]),
    ({"min_tokens": 20}, ["min_tokens=20", "max_new_tokens=16"]),
    ({"n": 0}, ["n=0", ">= 1"]),
    ({"logprobs": 21}, ["logprobs=21", "[0, 20]"]),
    ({"logit_bias": {"5": 1.0}}, ["logit_bias", "token id"]),
    ({"priority": 1.5}, ["priority=1.5", "an integer"]),
    ({"stop_token_ids": [-1]}, ["stop_token_ids"]),
])
def test_bad_sampling_params(kwargs, words):
    with pytest.raises(ConfigError) as err:
        SamplingParams(**kwargs)
    for word in ["SamplingParams."] + words:
        assert word in str(err.value)


@pytest.mark.parametrize("kwargs,words", [
    ({"scheduler": "fifo"}, ["scheduler='fifo'", "'static', 'continuous', 'edge'"]),
    ({"attention_backend": "flash"}, ["attention_backend='flash'", "'auto', 'torch', 'numba', 'numba-cuda'"]),
    ({"max_batch_size": 0}, ["max_batch_size=0", ">= 1"]),
    ({"batch_timeout_s": -1.0}, ["batch_timeout_s=-1.0", ">= 0"]),
    ({"kv_layout": "ring"}, ["kv_layout='ring'"]),
    ({"block_size": 0}, ["block_size=0"]),
    ({"device": "tpu"}, ["device='tpu'"]),
    ({"scheduling_policy": "lifo"}, ["scheduling_policy='lifo'", "'fcfs', 'priority', 'shortest_prompt'"]),
    ({"scheduling_policy": "priority", "scheduler": "static"},
     ["scheduling_policy='priority'", "'fcfs' with scheduler='static'"]),
    ({"aging_tokens_per_s": -1}, ["aging_tokens_per_s=-1", ">= 0"]),
    ({"aging_tokens_per_s": float("inf")}, ["aging_tokens_per_s=inf", "finite"]),
    ({"aging_tokens_per_s": "fast"}, ["aging_tokens_per_s='fast'"]),
    ({"long_prefill_token_threshold": -4}, ["long_prefill_token_threshold=-4", ">= 0"]),
    ({"long_prefill_token_threshold": 2.5}, ["long_prefill_token_threshold=2.5", "an integer"]),
])
def test_bad_engine_config(kwargs, words):
    with pytest.raises(ConfigError) as err:
        EngineConfig(model="tiny", **kwargs)
    for word in ["EngineConfig."] + words:
        assert word in str(err.value)


def test_a_model_name_first_as_vllm_takes_it():
    assert LLM("tiny", max_model_len=64).config == EngineConfig(model="tiny", max_model_len=64)
    with pytest.raises(ConfigError, match="model given twice: 'tiny' and model='smollm2-135m'"):
        LLM("tiny", model="smollm2-135m")
    with pytest.raises(ConfigError, match="config=42 is not allowed: pass an EngineConfig, a model name"):
        LLM(42)


def test_unknown_model_lists_known_names():
    with pytest.raises(ValueError) as err:
        LLM(EngineConfig(model="gpt-9"))
    for word in ["gpt-9", "smollm2-135m", "tiny"]:
        assert word in str(err.value)


def test_request_that_never_fits_the_pool(llm):
    with pytest.raises(ConfigError) as err:
        llm.generate([[1] * 100], SamplingParams(max_new_tokens=100), use_tqdm=False)
    assert "num_kv_blocks=8" in str(err.value) and "can never fit" in str(err.value)
    still_serves(llm)


def test_priority_needs_the_priority_policy(llm):
    with pytest.raises(ConfigError) as err:
        llm.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3, priority=-1), use_tqdm=False)
    for word in ["SamplingParams.priority=-1", "scheduling_policy='fcfs'", "scheduling_policy='priority'"]:
        assert word in str(err.value)
    still_serves(llm)


def test_a_bad_prompt_among_good_ones_starts_nothing(llm):
    with pytest.raises(ConfigError):
        llm.generate([[1, 2], [], [3, 4]], SamplingParams(max_new_tokens=2), use_tqdm=False)
    assert not llm.engine.has_unfinished()
    still_serves(llm)


def test_sampling_params_list_must_match_prompts(llm):
    with pytest.raises(ConfigError, match="2 entries for 3 prompts"):
        llm.generate([[1], [2], [3]], [SamplingParams(), SamplingParams()], use_tqdm=False)


def test_malformed_workload_file_names_the_line(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"arrival_s": 0, "prompt": "hi"}\n\n{"arrival_s": 1, "prompt": "x", "max_new_tokens": 0}\n')
    with pytest.raises(ConfigError, match=r"line 3: .*max_new_tokens=0"):
        load_workload(path)
    path.write_text('{"arrival_s": 0, "prompt": "hi"}\n{"arrival_s": 0.5, "prompt": "x"\n')
    with pytest.raises(ConfigError, match="line 2"):
        load_workload(path)
    path.write_text('{"arrival_s": -1, "prompt": "hi"}\n')
    with pytest.raises(ConfigError, match="line 1: .*arrival_s=-1"):
        load_workload(path)
    path.write_text('{"arrival": 0, "prompt": "hi"}\n')
    with pytest.raises(ConfigError, match="line 1: unknown field 'arrival'"):
        load_workload(path)


def test_run_rejects_a_bad_workload_before_starting(llm):
    bad = [WorkloadRequest(0.0, [1, 2], SamplingParams(max_new_tokens=2)), WorkloadRequest(0.1, "", SamplingParams())]
    with pytest.raises(ConfigError, match=r"workload\[1\]"):
        llm.run(bad, use_tqdm=False)
    still_serves(llm)
