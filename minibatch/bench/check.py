"""The greedy reference every system's outputs are checked against before its time counts.

The reference is transformers' `generate()` run on each prompt alone (batch of one, no padding),
greedy, with the end-of-sequence token not stopping it (like `ignore_eos`), for exactly the
request's number of tokens. A system whose outputs differ on any request is marked unverified:
its time is still printed, with how much of its output matched, but no goal is judged on it.

Systems that compute in bfloat16, or with other weights or arithmetic than the reference's (llama.cpp's
formats), are checked by the near-tie rule of DESIGN.md: tokens equal up to the first position where the
reference's top-2 logits are no further apart than a stated tolerance (either token is right there), against
transformers in the system's own dtype. The reference keeps those top-2 gaps for that.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from tqdm.auto import tqdm


def greedy_kwargs(max_new_tokens: int) -> dict:
    """generate() keywords for greedy decoding of exactly max_new_tokens tokens, EOS or not. Keywords,
    not a GenerationConfig: generate() fills a config's unset fields from the model's own defaults,
    which would bring its end-of-sequence token back; a keyword set to None stays None."""
    return {"do_sample": False, "max_new_tokens": max_new_tokens, "min_new_tokens": None, "eos_token_id": None}


# a tie in bfloat16: top-2 logits at most 0.25 apart, one bfloat16 step for logits of 32-64 (two for 16-32). Inclusive:
# a reference whose top-2 logits are one step apart is a tie a batched product's other summation order can
# round either way (seen at batch 8: the reference 0.250 apart, the engine's two logits equal)
BF16_TIE_TOLERANCE = 0.25
PEER_TIE_TOLERANCE = 0.25  # the same for llama.cpp's formats (its matrix products quantise activations to 8 bits)


@dataclass(frozen=True)
class Reference:
    """transformers' greedy tokens for each request, and the gap between its top-2 logits at each token."""

    tokens: list                                   # list[list[int]]
    gaps: list = field(default_factory=list)       # list[list[float]]: top-1 minus top-2 logit (empty: unknown)

    def first_ties(self, tolerance: float) -> list[int]:
        """Per request: the first position whose top-2 logits are at most tolerance apart (its length if none)."""
        return [next((i for i, g in enumerate(gaps) if g <= tolerance), len(tokens))
                for tokens, gaps in zip(self.tokens, self.gaps or [[]] * len(self.tokens))]

    def head(self, n: int) -> "Reference":
        return Reference(self.tokens[:n], self.gaps[:n])

    def check(self, outputs: list, tolerance: float = 0.0) -> "Match":
        """Exactly (tolerance 0) or by the near-tie rule."""
        return compare(outputs, self.tokens, self.first_ties(tolerance) if tolerance else None)


@torch.inference_mode()
def greedy_reference(hf_model, prompts: list, output_lens: list, use_tqdm: bool = True) -> Reference:
    """transformers' greedy tokens for each prompt alone, with the top-2 logit gap at every step."""
    tokens, gaps = [], []
    desc = f"greedy reference ({str(hf_model.dtype).removeprefix('torch.')})"
    for prompt, n in tqdm(list(zip(prompts, output_lens)), desc=desc, unit="req", disable=not use_tqdm):
        ids = torch.tensor([prompt], device=hf_model.device)
        out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), output_scores=True,
                                return_dict_in_generate=True, **greedy_kwargs(n))
        tokens.append(out.sequences[0, len(prompt):].tolist())
        top2 = torch.stack([score[0].float().topk(2).values for score in out.scores])   # (n, 2)
        gaps.append((top2[:, 0] - top2[:, 1]).tolist())
    return Reference(tokens, gaps)


def reference_outputs(hf_model, prompts: list, output_lens: list, use_tqdm: bool = True) -> list[list[int]]:
    """transformers' greedy tokens for each prompt alone."""
    return greedy_reference(hf_model, prompts, output_lens, use_tqdm).tokens


@dataclass(frozen=True)
class Match:
    """How a system's outputs compare with the reference."""

    requests: int            # requests checked
    requests_equal: int      # requests whose tokens equal the reference (up to its first near tie, if so checked)
    tokens: int              # reference tokens compared (all, or those before each request's first near tie)
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


def compare(outputs: list[list[int]], reference: list[list[int]], until: list[int] | None = None) -> Match:
    """Request by request: equal, and the length of the common prefix (a missing request agrees on nothing).
    `until`, per request: compare only the tokens before it (the near-tie rule); the lengths must still agree."""
    equal, agreeing, compared, first = 0, 0, 0, None
    for i, ref in enumerate(reference):
        out = list(outputs[i]) if i < len(outputs) else []
        stop = len(ref) if until is None else until[i]
        prefix = next((j for j, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
        agreeing += min(prefix, stop)
        compared += stop
        if len(out) == len(ref) and prefix >= stop:
            equal += 1
        elif first is None:
            first = i
    if len(outputs) != len(reference) and first is None:
        first = len(reference)
    return Match(len(reference), equal, compared, agreeing, first)


def merge(matches: list[Match]) -> Match:
    """One Match over several runs: totals, and the first mismatch seen."""
    first = next((m.first_mismatch for m in matches if m.first_mismatch is not None), None)
    return Match(sum(m.requests for m in matches), sum(m.requests_equal for m in matches),
                 sum(m.tokens for m in matches), sum(m.tokens_agreeing for m in matches), first)
