"""Choosing the next token from the logits: greedy, temperature, top-k and top-p.

Greedy rows are decided together with one argmax. Sampled rows each draw from their own
`torch.Generator`, seeded per request, so a request's sampled output is the same whether it ran
alone or beside sixty-three others.
"""
from __future__ import annotations

import torch

from minibatch.config import SamplingParams


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p, on one row of logits (V,); removed tokens get -inf."""
    logits = logits / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        mass_before = probs.cumsum(-1) - probs        # probability of the tokens ranked above each one
        drop = mass_before >= params.top_p            # the most likely token always stays
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


class Sampler:
    """Turns a step's logits into one token per sampling row, with a generator per request."""

    def __init__(self, default_seed: int):
        self.default_seed = default_seed
        self.generators: dict[int, torch.Generator] = {}

    def generator(self, request_id: int, params: SamplingParams) -> torch.Generator:
        """The request's own random stream (made on first use from its seed); speculative decoding draws from it too."""
        if request_id not in self.generators:
            seed = params.seed if params.seed is not None else self.default_seed * 1_000_003 + request_id
            self.generators[request_id] = torch.Generator().manual_seed(seed)
        return self.generators[request_id]

    def release(self, request_id: int) -> None:
        self.generators.pop(request_id, None)

    def sample(self, logits: torch.Tensor, request_ids: list[int], params: list[SamplingParams]) -> list[int]:
        """logits (S, V) -> S token ids."""
        tokens = logits.argmax(dim=-1).tolist()
        for row, (rid, p) in enumerate(zip(request_ids, params)):
            if not p.greedy:
                probs = filter_logits(logits[row].float().cpu(), p).softmax(-1)
                tokens[row] = int(torch.multinomial(probs, 1, generator=self.generator(rid, p)))
        return tokens
