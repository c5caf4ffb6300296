"""A learner can read the step that runs: one reference decode step enters a short list of the package's files."""
from minibatch import LLM, EngineConfig, SamplingParams
from minibatch.analysis.reading import files_entered, summary

MOST_FILES, MOST_LINES = 14, 1800        # the reference decode step's reading, at most


def decode_step_files(kernels: str) -> dict[str, int]:
    """The files one decode step of the default scheduler enters, from LLMEngine.step to the logits and back."""
    llm = LLM(EngineConfig(model="tiny", kernels=kernels, max_batch_size=2))
    engine = llm.engine
    for prompt in ([1, 2, 3, 4], [5, 6, 7]):
        engine.add_request(prompt, SamplingParams(max_new_tokens=8))
    engine.step()                                # the prefill step
    engine.step()                                # a decode step, warmed up (compiled kernels loaded)
    files = files_entered(engine.step)
    assert engine.step_records[-1].num_decode_tokens == 2 and not engine.step_records[-1].num_prefill_tokens
    return files


def test_a_reference_decode_step_reads_in_a_few_files():
    reference, fast = decode_step_files("reference"), decode_step_files("fast")
    for name, files in (("reference", reference), ("fast", fast)):
        print(f"\n{name} decode step: {summary(files)}\n  " + "\n  ".join(f"{n:4d} {p}" for p, n in files.items()))
    assert "minibatch/engine/ops/reference.py" in reference and "minibatch/engine/ops/fast.py" not in reference
    assert "minibatch/engine/kernels/layer_cpu.py" in fast
    assert len(reference) <= MOST_FILES and sum(reference.values()) <= MOST_LINES, summary(reference)
