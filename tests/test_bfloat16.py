"""bfloat16 tokens against transformers in bfloat16, by the near-tie rule of DESIGN.md (as vLLM's tests).

Both compute in bf16, but with different operator orders (fused projections, oneDNN's prepacked
products), so where the reference's top two logits are within TIE_TOLERANCE of each other either
token is right and the sequences may part there. Before the first such position they must agree.
"""
import pytest
import torch

from minibatch import LLM, EngineConfig, SamplingParams
from minibatch.models import load_hf

PROMPTS = [[5, 6, 7, 8, 9], list(range(20, 57)), [42], list(range(100, 190))]
NEW = 24
TIE_TOLERANCE = 0.05   # logits this close at the top are a tie at bf16's precision (8 bits of mantissa)


def reference_with_ties(model, prompt_ids: list[int]) -> tuple[list[int], int]:
    """transformers' greedy tokens for one prompt alone, and the first step whose top-2 logits are a near tie."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=NEW, do_sample=False,
                             output_scores=True, return_dict_in_generate=True)
    tokens = out.sequences[0, len(prompt_ids):].tolist()
    gaps = [float(top[0] - top[1]) for top in (s[0].float().topk(2).values for s in out.scores)]
    first_tie = next((i for i, gap in enumerate(gaps) if gap <= TIE_TOLERANCE), len(tokens))
    return tokens, first_tie


@pytest.fixture(scope="module")
def references():
    model, _ = load_hf("tiny", torch.bfloat16)
    return [reference_with_ties(model, p) for p in PROMPTS]


@pytest.mark.parametrize("max_batch_size", [1, 4])
def test_bfloat16_greedy_matches_generate_up_to_the_first_near_tie(references, max_batch_size):
    llm = LLM(EngineConfig(model="tiny", dtype="bfloat16", max_batch_size=max_batch_size, block_size=8))
    outs = llm.generate(PROMPTS, SamplingParams(max_new_tokens=NEW), use_tqdm=False)
    for out, (tokens, first_tie) in zip(outs, references):
        assert out.token_ids[:first_tie] == tokens[:first_tie]
    assert sum(first_tie for _, first_tie in references) >= NEW, "ties everywhere: the test would compare nothing"


def test_bfloat16_decode_steps_of_more_rows_than_the_loop_streams_match_too(references):
    """Twelve sequences at once: on a CPU whose measured bfloat16 crossover is below twelve rows their decode
    steps multiply through oneDNN part by part, elsewhere through the compiled layers; the same rule either way."""
    prompts = PROMPTS * 3
    assert len(prompts) > 8                     # above the smallest crossover measured (ops/crossover.py)
    llm = LLM(EngineConfig(model="tiny", dtype="bfloat16", max_batch_size=len(prompts), block_size=8))
    outs = llm.generate(prompts, SamplingParams(max_new_tokens=NEW), use_tqdm=False)
    for out, (tokens, first_tie) in zip(outs, references * 3):
        assert out.token_ids[:first_tie] == tokens[:first_tie]
