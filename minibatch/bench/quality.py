"""What a weight format costs in quality: the log-likelihood a model gives to text, per format.

An evaluation harness scores a model by how likely it finds a text: the mean, over the text's
tokens, of the log-probability the model gives each token after those before it. Higher (nearer 0)
is better; its exponential of minus that mean is the perplexity (lower is better: "as unsure as a
choice among that many tokens"). The engine returns every prompt token's log-probability with
`SamplingParams(prompt_logprobs=0)` (vLLM's field; over HTTP, `echo` with `logprobs` and
`max_tokens` 0), from the same forward pass that serves.

`format_quality(llms, texts)` scores the same texts with one engine per weight format (the
reference first) and returns one row per format: the tokens scored, the mean log-probability per
token, the perplexity, its difference from the reference's, and the bytes of weights a decode step
reads (the cost side of the trade).
"""
from __future__ import annotations

import math

from minibatch.config import SamplingParams


def log_likelihood(llm, texts: list[str]) -> tuple[float, int]:
    """The sum of the log-probabilities of every token of the texts after each text's first, and their count."""
    outs = llm.generate(list(texts), SamplingParams(max_new_tokens=1, prompt_logprobs=0), use_tqdm=False)
    values = [entry[token] for out in outs for token, entry in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:])]
    return math.fsum(values), len(values)


def format_quality(llms: dict, texts: list[str]) -> list[dict]:
    """One row per engine of `llms` ({format: LLM}, the reference first): its log-likelihood on the same texts."""
    rows = []
    for fmt, llm in llms.items():
        total, count = log_likelihood(llm, texts)
        rows.append({"format": fmt, "tokens": count, "mean_logprob": total / count,
                     "perplexity": math.exp(-total / count), "weight_bytes": llm.engine.model.decode_weight_bytes()})
    for row in rows:
        row["vs_reference"] = row["mean_logprob"] - rows[0]["mean_logprob"]
    return rows


def quality_lines(rows: list[dict]) -> list[str]:
    """The rows of `format_quality` as a printed table."""
    reference = rows[0]["format"]
    lines = [f"{'format':<8}{'MB/step':>9}{'tokens':>8}{'log-prob/token':>16}{'perplexity':>12}"
             f"{'vs ' + reference:>14}"]
    for r in rows:
        lines.append(f"{r['format']:<8}{r['weight_bytes'] / 1e6:>9.0f}{r['tokens']:>8}{r['mean_logprob']:>16.4f}"
                     f"{r['perplexity']:>12.3f}{r['vs_reference']:>+14.5f}")
    return lines
