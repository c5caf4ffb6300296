"""The greedy reference every system's outputs are checked against before its time counts.

The reference is transformers' `generate()` run on each prompt alone (batch of one, no padding),
greedy, with the end-of-sequence token not stopping it (like `ignore_eos`), for exactly the
request's number of tokens. A system whose outputs differ on any request is marked unverified:
its time is still printed, with how much of its output matched, but no goal is judged on it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from tqdm.auto import tqdm


def greedy_kwargs(max_new_tokens: int) -> dict:
    """generate() keywords for greedy decoding of exactly max_new_tokens tokens, EOS or not. Keywords,
    not a GenerationConfig: generate() fills a config's unset fields from the model's own defaults,
    which would bring its end-of-sequence token back; a keyword set to None stays None."""
    return {"do_sample": False, "max_new_tokens": max_new_tokens, "min_new_tokens": None, "eos_token_id": None}


@torch.inference_mode()
def reference_outputs(hf_model, prompts: list, output_lens: list, use_tqdm: bool = True) -> list[list[int]]:
    """transformers' greedy tokens for each prompt alone."""
    outputs = []
    for prompt, n in tqdm(list(zip(prompts, output_lens)), desc="greedy reference", unit="req", disable=not use_tqdm):
        ids = torch.tensor([prompt], device=hf_model.device)
        out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), **greedy_kwargs(n))
        outputs.append(out[0, len(prompt):].tolist())
    return outputs


@dataclass(frozen=True)
class Match:
    """How a system's outputs compare with the reference."""

    requests: int            # requests checked
    requests_equal: int      # requests whose tokens equal the reference exactly
    tokens: int              # reference tokens
    tokens_agreeing: int     # tokens before each request's first difference (its common prefix)
    first_mismatch: int | None  # index of the first request that differs, None if all equal

    @property
    def exact(self) -> bool:
        return self.requests_equal == self.requests

    @property
    def token_rate(self) -> float:
        return self.tokens_agreeing / self.tokens if self.tokens else 1.0

    def describe(self) -> str:
        if self.exact:
            return f"all {self.requests} requests equal the reference"
        return (f"{self.requests_equal}/{self.requests} requests equal the reference, {self.token_rate:.1%} of tokens "
                f"agree before the first difference (first differing request: #{self.first_mismatch})")

    def to_dict(self) -> dict:
        return {**asdict(self), "exact": self.exact, "token_rate": self.token_rate}


def compare(outputs: list[list[int]], reference: list[list[int]]) -> Match:
    """Request by request: equal, and the length of the common prefix (a missing request agrees on nothing)."""
    equal, agreeing, first = 0, 0, None
    for i, ref in enumerate(reference):
        out = outputs[i] if i < len(outputs) else []
        prefix = next((j for j, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
        agreeing += prefix
        if list(out) == list(ref):
            equal += 1
        elif first is None:
            first = i
    if len(outputs) != len(reference) and first is None:
        first = len(reference)
    return Match(len(reference), equal, sum(map(len, reference)), agreeing, first)


def merge(matches: list[Match]) -> Match:
    """One Match over several runs: totals, and the first mismatch seen."""
    first = next((m.first_mismatch for m in matches if m.first_mismatch is not None), None)
    return Match(sum(m.requests for m in matches), sum(m.requests_equal for m in matches),
                 sum(m.tokens for m in matches), sum(m.tokens_agreeing for m in matches), first)
