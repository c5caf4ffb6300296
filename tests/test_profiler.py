"""The step profiler (opt-in timers per step part, their summary and figure) and the fixed-shape
decode step that CUDA graphs capture (checked eagerly on the CPU, captured where CUDA exists)."""
import pytest
import torch
from matplotlib.figure import Figure

from minibatch import LLM, EngineConfig, SamplingParams, WorkloadRequest
from minibatch.engine.cuda_graphs import CudaGraphRunner, decode_attention
from minibatch.engine.kernels import AttentionMetadata, torch_ref
from minibatch.analysis.profiler import MODEL_PARTS, PARTS, breakdown
from minibatch.tools.profile import profile_decode
from minibatch.engine.runner import ModelRunner
from minibatch.viz import step_profile
from tests.conftest import reference_greedy

PROMPTS = [[5, 6, 7, 8, 9], list(range(20, 57)), [42], list(range(100, 140))]
NEW = 12
BASE_PHASES = {"schedule", "model", "sample", "update"}


@pytest.fixture(scope="module")
def references(tiny_hf):
    return [reference_greedy(tiny_hf[0], p, NEW) for p in PROMPTS]


@pytest.fixture(scope="module")
def profiled():
    llm = LLM(EngineConfig(model="tiny", max_batch_size=4, profile_steps=True))
    report = llm.run([WorkloadRequest(0.0, p, SamplingParams(max_new_tokens=NEW)) for p in PROMPTS], use_tqdm=False)
    return llm, report


def test_default_path_is_not_instrumented():
    llm = LLM(EngineConfig(model="tiny"))
    llm.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3), use_tqdm=False)
    assert llm.engine.profiler is None
    assert set(llm.engine.step_records[-1].phase_times) == BASE_PHASES
    assert not {"attention", "mlp", "norm", "prepare"} & (set(vars(llm.engine.model)) | set(vars(llm.engine.runner)))


def test_profiled_steps_time_every_part(profiled, references):
    llm, report = profiled
    assert [list(r.output_token_ids) for r in llm.engine.requests.values()] == references
    for step in report.steps:
        t = step.phase_times
        assert BASE_PHASES | {"prepare", *MODEL_PARTS} == set(t)
        assert all(t[p] > 0 for p in MODEL_PARTS)
        assert t["prepare"] + sum(t[p] for p in MODEL_PARTS) <= t["model"] * (1 + 1e-9)  # nested inside "model"
        parts = breakdown(t)
        assert list(parts) == list(PARTS) and min(parts.values()) >= 0
        assert sum(parts.values()) == pytest.approx(sum(t[p] for p in BASE_PHASES))


@pytest.mark.parametrize("kernels", ["fast", "reference"])
def test_the_profile_reports_the_path_the_engine_ran(kernels):
    """The profiler never switches path: the fast path's decode steps still run whole compiled layers (their
    parts timed apart), the reference's run part by part, and the profile says which."""
    llm = LLM(EngineConfig(model="tiny", kernels=kernels, max_batch_size=2, profile_steps=True))
    prof = profile_decode(llm, 2, num_steps=3, prompt_tokens=8)
    ran = prof["engine"]
    assert ran["kernels"] == llm.engine.kernels == kernels
    assert ran["attention_backend"] == {"fast": "numba", "reference": "torch"}[kernels]
    if kernels == "fast":
        assert ran["whole_layer_steps"] > 0 and "apart" in ran["parts"]
    else:
        assert ran["whole_layer_steps"] == 0 and ran["part_by_part_steps"] > 0 and ran["parts"] == "timed in place"
    assert all(prof["parts"][p] > 0 for p in MODEL_PARTS)


def test_run_report_profile(profiled):
    _, report = profiled
    decode = [s for s in report.steps if not s.num_prefill_tokens]
    prof = report.profile()
    assert prof["steps"] == len(decode) > 0
    assert 0 < prof["overhead_share"] < 1
    assert prof["step_s"] == pytest.approx(sum(prof["parts"].values()))
    assert report.profile(decode_only=False)["steps"] == len(report.steps)
    unprofiled = LLM(EngineConfig(model="tiny")).run([WorkloadRequest(0.0, [1, 2], SamplingParams())], use_tqdm=False)
    assert unprofiled.profile() == {}


def test_profile_decode_runs_the_batch_asked_for():
    llm = LLM(EngineConfig(model="tiny", max_batch_size=8, profile_steps=True))
    prof = profile_decode(llm, batch_size=8, num_steps=3, prompt_tokens=6)
    assert prof["batch_size"] == 8 and prof["steps"] == 3


def test_layer_skip_drafting_counts_as_propose_not_model():
    llm = LLM(EngineConfig(model="tiny", profile_steps=True, speculative_method="layer_skip", speculative_layers=2))
    llm.generate([[7, 8, 9, 7, 8, 9]], SamplingParams(max_new_tokens=NEW, ignore_eos=True), use_tqdm=False)
    drafting = [s for s in llm.engine.step_records if s.spec_outcomes]
    assert drafting
    for step in drafting:
        t = step.phase_times
        assert t["propose"] > 0
        assert t["prepare"] + sum(t[p] for p in MODEL_PARTS) <= t["model"] * (1 + 1e-9)


def test_step_profile_figure(profiled):
    _, report = profiled
    prof = report.profile()
    fig = step_profile({"batch 4": prof, "again": prof}, share=True)
    assert isinstance(fig, Figure)
    drawn = [p for p in PARTS if prof["parts"][p] > 0]
    bars = fig.axes[0].patches
    assert len(bars) == 2 * len(drawn)
    assert sum(b.get_height() for b in bars[::2]) == pytest.approx(1.0)   # one bar, as shares, adds up to 1
    with pytest.raises(ValueError, match="profile_steps"):
        step_profile({"x": {}})


# --- CUDA graphs --------------------------------------------------------------------------------------

def test_cuda_graphs_flag_is_a_noop_on_the_cpu():
    with pytest.warns(UserWarning, match="no effect on the CPU"):
        llm = LLM(EngineConfig(model="tiny", device="cpu", cuda_graphs=True))
    assert type(llm.engine.runner) is ModelRunner


def test_decode_attention_matches_the_reference():
    gen = torch.Generator().manual_seed(0)
    blocks, bs, hkv, group, d = 12, 4, 2, 3, 8
    k_cache, v_cache = (torch.randn(blocks, bs, hkv, d, generator=gen) for _ in range(2))
    tables, context = [[3, 7], [1, 0, 5, 9], [11]], [6, 15, 1]
    query = torch.randn(3, hkv * group, d, generator=gen)                       # (B, Hq, D)
    meta = AttentionMetadata.build([1, 1, 1], context, tables, "cpu")
    expected = torch_ref.attention(query, k_cache, v_cache, meta, 0.3)
    padded = AttentionMetadata.build([1, 1, 1], context, [t + [0] * (6 - len(t)) for t in tables], "cpu")
    torch.testing.assert_close(decode_attention(query, k_cache, v_cache, padded, 0.3), expected)


def test_fixed_shape_decode_step_matches(references):
    """The padded, fixed-shape step a graph replays, run eagerly: buckets 4, 2 and 1 as requests finish."""
    llm = LLM(EngineConfig(model="tiny", max_batch_size=4, block_size=8))
    engine = llm.engine
    engine.runner = runner = CudaGraphRunner(engine.runner, 4, engine.max_model_len, use_graphs=False)
    buckets, forward = [], runner._forward
    runner._forward = lambda b: buckets.append(b) or forward(b)
    lengths = [4, 8, NEW]
    params = [SamplingParams(max_new_tokens=n) for n in lengths]
    outs = llm.generate(PROMPTS[:3], params, use_tqdm=False)
    assert [o.token_ids for o in outs] == [ref[:n] for ref, n in zip(references, lengths)]
    assert {4, 2, 1} <= set(buckets)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graphs_replay_gives_the_same_tokens(references):
    config = dict(model="tiny", device="cuda", dtype="float32", max_batch_size=4, max_model_len=256)
    graphed = LLM(EngineConfig(cuda_graphs=True, **config))
    assert isinstance(graphed.engine.runner, CudaGraphRunner) and graphed.engine.runner.graphs
    outs = graphed.generate(PROMPTS, SamplingParams(max_new_tokens=NEW), use_tqdm=False)
    assert [o.token_ids for o in outs] == references
