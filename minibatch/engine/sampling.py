"""Choosing the next token from the logits, with vLLM's sampling fields, batched over the step's rows.

In vLLM's order: log-probabilities are read from the model's raw logits (what `logprobs` returns);
then logit bias, `min_tokens` (EOS and stop tokens masked until enough tokens are out) and the
penalties change the logits (repetition: divides positive logits and multiplies negative ones of
every token in the prompt or output; presence and frequency: subtracted for tokens in the output);
greedy rows take the argmax of those; sampled rows divide by the temperature, drop tokens below
`min_p` times the most likely one, keep the top-k and the top-p, and draw. Each row draws from its
request's own `torch.Generator`, seeded per request, so a request's sampled output is the same
whether it ran alone or beside sixty-three others.

The engine decodes through a *decoder*: `propose(plan)` before the model runs (draft tokens, for
speculative decoding), `choose(logits, plan)` after it (each sampling sequence's new tokens, with
log-probabilities where asked), `rewind(plan)` after the update and `release(request_id)` when a
request ends. `PlainDecoder` is one token per sequence from the `Sampler`;
`minibatch.engine.speculative.Speculator` is the other.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from minibatch.config import SamplingParams


@dataclass
class SampledToken:
    token_id: int
    logprobs: dict[int, float] | None = None   # the chosen token's and the top-N tokens' log-probabilities


def most_likely(logits: torch.Tensor) -> list[int]:
    """The argmax of each row of logits (S, V), the first where several are equal (a NaN counts as the largest,
    as in torch): numpy's on the CPU, whose loop runs in vector registers where torch's compares one value at a
    time (docs/performance.md, section "Fused small parts")."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return np.argmax(logits.detach().numpy(), axis=-1).tolist()
    return logits.argmax(dim=-1).tolist()


def score_tokens(logits: torch.Tensor, token_ids: list[int], top_n: int) -> tuple[list[dict[int, float]], list[int]]:
    """The raw log-probabilities of given tokens (a prompt's, `prompt_logprobs`) from their rows of logits (P, V):
    per row, a dict with the token's and the top-N tokens' (the token first, as for a chosen token), and the
    token's rank (1 + the tokens strictly more likely, as vLLM counts it)."""
    raw = logits.float().log_softmax(-1)                                     # (P, V)
    given = raw.gather(-1, torch.tensor(token_ids, device=raw.device)[:, None])  # (P, 1)
    ranks = ((raw > given).sum(-1) + 1).tolist()                             # (P,)
    top = torch.topk(raw, top_n, dim=-1)                                     # (P, N) values and ids
    dicts = [{token: value} | dict(zip(ids, values)) for token, value, ids, values in
             zip(token_ids, given[:, 0].tolist(), top.indices.tolist(), top.values.tolist())]
    return dicts, ranks


def filter_rows(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Temperature, min-p, top-k, top-p on sampled rows of logits (S, V); removed tokens get -inf."""
    temperature = torch.tensor([p.temperature for p in params], device=logits.device)
    logits = logits / temperature[:, None]                                   # (S, V)
    min_p = torch.tensor([p.min_p for p in params], device=logits.device)
    if min_p.any():
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < min_p[:, None] * probs.max(-1, keepdim=True).values, float("-inf"))
    vocab = logits.shape[-1]
    top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=logits.device)
    top_p = torch.tensor([p.top_p for p in params], device=logits.device)
    if (top_k < vocab).any() or (top_p < 1.0).any():
        sorted_logits, order = torch.sort(logits, descending=True, stable=True)  # (S, V): ties in index order,
        # so the first of equal most likely tokens (the one argmax names) ranks first and always stays
        kth_largest = sorted_logits.gather(-1, (top_k - 1)[:, None])        # (S, 1)
        drop = sorted_logits < kth_largest                                   # ties with the k-th stay
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(-1)
        mass_before = probs.cumsum(-1) - probs                               # probability ranked above each token
        drop |= mass_before >= top_p[:, None]                                # the most likely token always stays
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
    return logits


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """`filter_rows` for one row of logits (V,)."""
    return filter_rows(logits[None], [params])[0]


def apply_penalties(logits: torch.Tensor, histories: list[tuple[list[int], list[int]]],
                    params: list[SamplingParams]) -> torch.Tensor:
    """Repetition, presence and frequency penalties on logits (S, V); histories: (prompt, output) ids per row."""
    rows, vocab = logits.shape
    counts = torch.zeros(rows, vocab)                                        # output occurrences (S, V)
    seen = torch.zeros(rows, vocab, dtype=torch.bool)                        # in the prompt or the output
    for row, (prompt, output) in enumerate(histories):
        out = torch.tensor(output, dtype=torch.long)
        counts[row].index_add_(0, out, torch.ones(len(output)))
        seen[row, torch.tensor(prompt, dtype=torch.long)] = True
        seen[row, out] = True
    counts, seen = counts.to(logits.device), seen.to(logits.device)
    as_column = lambda name: torch.tensor([getattr(p, name) for p in params], device=logits.device)[:, None]
    repetition = as_column("repetition_penalty")
    logits = torch.where(seen, torch.where(logits > 0, logits / repetition, logits * repetition), logits)
    return logits - as_column("frequency_penalty") * counts - as_column("presence_penalty") * (counts > 0)


class Sampler:
    """Turns a step's logits into one token per sampling row, with a generator per request."""

    def __init__(self, default_seed: int, eos_token_ids=()):
        self.default_seed = default_seed
        self.eos_token_ids = list(eos_token_ids)
        self.generators: dict[int, torch.Generator] = {}

    def generator(self, request_id: int, params: SamplingParams) -> torch.Generator:
        """The request's own random stream (made on first use from its seed); speculative decoding draws from it too."""
        if request_id not in self.generators:
            seed = params.seed if params.seed is not None else self.default_seed * 1_000_003 + request_id
            self.generators[request_id] = torch.Generator().manual_seed(seed)
        return self.generators[request_id]

    def release(self, request_id: int) -> None:
        self.generators.pop(request_id, None)

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, requests: list) -> list[SampledToken]:
        """logits (S, V) of the step's sampling requests -> S tokens (with log-probabilities where asked)."""
        params = [r.params for r in requests]
        logprobs = self._logprobs(logits, params)
        logits = self._process(logits.float(), requests, params)
        tokens = most_likely(logits)
        sampled = [row for row, p in enumerate(params) if not p.greedy]
        if sampled:
            probs = filter_rows(logits[sampled], [params[row] for row in sampled]).softmax(-1).cpu()  # (S', V)
            for i, row in enumerate(sampled):
                generator = self.generator(requests[row].request_id, params[row])
                tokens[row] = int(torch.multinomial(probs[i], 1, generator=generator))
        out = [SampledToken(t) for t in tokens]
        for row, (raw, top_values, top_ids) in logprobs.items():   # the chosen token first, then the top-N
            top = dict(zip(top_ids.tolist(), top_values.tolist()))
            out[row].logprobs = {tokens[row]: float(raw[tokens[row]])} | top
        return out

    def _logprobs(self, logits: torch.Tensor, params: list[SamplingParams]) -> dict:
        """row -> (log-probabilities (V,), top-N values, top-N ids) for rows that ask, from the raw logits."""
        rows = [row for row, p in enumerate(params) if p.logprobs is not None]
        if not rows:
            return {}
        raw = logits[rows].float().log_softmax(-1).cpu()                     # (R, V)
        top = torch.topk(raw, max(params[r].logprobs for r in rows), dim=-1)
        return {row: (raw[i], top.values[i, :params[row].logprobs], top.indices[i, :params[row].logprobs])
                for i, row in enumerate(rows)}

    def _process(self, logits: torch.Tensor, requests: list, params: list[SamplingParams]) -> torch.Tensor:
        """Logit bias, min_tokens and penalties: the changes greedy rows see too."""
        for row, (r, p) in enumerate(zip(requests, params)):
            if p.logit_bias:
                ids = torch.tensor(list(p.logit_bias), device=logits.device)
                logits[row, ids] += torch.tensor(list(p.logit_bias.values()), device=logits.device)
            if len(r.output_token_ids) < p.min_tokens:
                stops = list(p.stop_token_ids) + ([] if p.ignore_eos else self.eos_token_ids)
                logits[row, stops] = float("-inf")
        penalised = [row for row, p in enumerate(params) if p.penalised]
        if penalised:
            histories = [(requests[row].prompt_token_ids, requests[row].output_token_ids) for row in penalised]
            logits[penalised] = apply_penalties(logits[penalised], histories, [params[row] for row in penalised])
        return logits


class PlainDecoder:
    """One new token per sampling sequence, from the sampler; nothing is drafted."""

    drafts = False                                  # no propose phase to time

    def __init__(self, sampler):
        self.sampler = sampler

    def propose(self, plan) -> None:
        pass

    def choose(self, logits, plan) -> tuple[list[list[int]], list, list]:
        """logits (S, V) -> one token for each of the S sampling sequences, its log-probabilities (None
        where not asked) and no draft outcomes."""
        sampled = self.sampler.sample(logits, [s.request for s in plan.seqs if s.samples])
        return [[t.token_id] for t in sampled], [t.logprobs for t in sampled], []

    def rewind(self, plan) -> None:
        pass

    def release(self, request_id: int) -> None:
        self.sampler.release(request_id)
