"""Shared fixtures: the transformers reference for `tiny`, and a helper that runs it per prompt."""
import pytest
import torch

from minibatch.engine.models import load_hf


@pytest.fixture(scope="session")
def tiny_hf():
    return load_hf("tiny")


def reference_greedy(hf_model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' generate() on one prompt alone, greedy: the tokens every engine path must match."""
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(prompt_ids):].tolist()
