"""What the benchmark serves: one set of prompts and output lengths, the same for every system.

The offline workload follows the shape of Anyscale's continuous-batching study: prompt lengths
log-normal around a median of ~100 tokens, output lengths exponential with a mean of 128 tokens,
capped at 512. Every request ignores the end-of-sequence token, so each system generates exactly
the drawn number of tokens and tokens/s compares like with like. The online workloads are the same
requests arriving over time at a Poisson rate.

`QUICK` and `FULL` are the two sizes of a run: QUICK keeps the shapes small and measures one max
batch size (4, below the number of requests, so continuous batching has slots to refill) so the
whole benchmark takes about a minute on a quiet 2-core laptop; FULL uses the study's shapes with 32
requests, measures max batch sizes 16 (continuous batching refills slots) and 32 (every request at
once) twice each, and serves 12 requests at three arrival rates: about an hour and a quarter there,
mostly spent in the transformers systems. `--num-requests`, `--batch-sizes` and `--reps` make it larger.
`PEERS` is the size of the side-by-side run with vLLM-CPU and llama.cpp (`bench --peers`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minibatch.workloads.distributions import AllAtOnce, Exponential, LogNormal, Poisson
from minibatch.workloads import make_workload


@dataclass(frozen=True)
class Scale:
    """How big a benchmark run is."""

    num_requests: int             # requests in the offline workload
    prompt_median: int            # median prompt length in tokens (log-normal)
    output_mean: int              # mean output length in tokens (exponential)
    output_cap: int               # longest output drawn
    batch_sizes: tuple            # max batch sizes swept; each system is reported at its best one
    reps: int                     # interleaved repetitions of every offline run
    online_requests: int          # requests in each online (Poisson) run: the first of the offline workload
    online_reps: int              # interleaved repetitions of every online run (a run at rate r lasts ~n / r seconds)
    rate_fractions: tuple         # online arrival rates, as fractions of minibatch continuous's offline request rate
    decode_steps: int             # decode steps timed for the roofline comparison
    decode_prompt: int            # prompt tokens of each sequence in the roofline comparison
    gemm_size: int                # n of the n x n x n fp32 matrix product that measures peak FLOP/s
    batch_one_requests: int | None = None  # requests served at max batch size 1 (None: all): its tokens/s needs fewer
    decode_rounds: int = 1        # interleaved rounds of the roofline's decode steps (batch 1, 8, 64, 1, 8, 64, ...)


PROMPT_SIGMA = 0.5   # spread of log(prompt length): most prompts within 0.6x-1.6x of the median
PROMPT_CAP = 512     # longest prompt drawn

QUICK = Scale(num_requests=10, prompt_median=16, output_mean=12, output_cap=24, batch_sizes=(4,), reps=2,
              online_requests=6, online_reps=1, rate_fractions=(0.7, 1.4), decode_steps=4, decode_prompt=16,
              gemm_size=1024)
FULL = Scale(num_requests=32, prompt_median=100, output_mean=128, output_cap=512, batch_sizes=(16, 32), reps=2,
             online_requests=12, online_reps=1, rate_fractions=(0.3, 0.6, 0.9), decode_steps=16, decode_prompt=32,
             gemm_size=2048, decode_rounds=3)

# minibatch beside vLLM-CPU and llama.cpp (`bench --peers`): short chat turns at max batch 1, 8 and 32 (batch 1
# on the first 4 requests); on a quiet 2-core laptop about 20 minutes, much of it vLLM starting and the references
PEERS = Scale(num_requests=32, prompt_median=32, output_mean=24, output_cap=48, batch_sizes=(1, 8, 32), reps=3,
              online_requests=0, online_reps=0, rate_fractions=(), decode_steps=16, decode_prompt=32,
              gemm_size=2048, batch_one_requests=4, decode_rounds=3)


@dataclass(frozen=True)
class BenchWorkload:
    """Prompts (token ids) and the exact number of tokens each request generates."""

    prompts: list            # list[list[int]]
    output_lens: list        # list[int]

    @property
    def output_tokens(self) -> int:
        return int(sum(self.output_lens))

    @property
    def max_len(self) -> int:
        """The longest prompt + output: the context every system must hold for one request."""
        return max(len(p) + n for p, n in zip(self.prompts, self.output_lens))

    def head(self, n: int) -> "BenchWorkload":
        return BenchWorkload(self.prompts[:n], self.output_lens[:n])


def offline_workload(scale: Scale, tokenizer, vocab_size: int, seed: int = 0) -> BenchWorkload:
    """All requests at once. Prompts are cut from the shipped texts with the model's tokenizer, or are
    seeded random token ids when the model has no tokenizer."""
    prompt_len = LogNormal(scale.prompt_median, PROMPT_SIGMA, cap=PROMPT_CAP)
    output_len = Exponential(scale.output_mean, cap=scale.output_cap)
    if tokenizer is None:
        rng_in, rng_out = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
        lengths = prompt_len.sample(rng_in, scale.num_requests)
        prompts = [rng_in.integers(8, vocab_size, size=int(n)).tolist() for n in lengths]
        return BenchWorkload(prompts, [int(n) for n in output_len.sample(rng_out, scale.num_requests)])
    drawn = make_workload(scale.num_requests, AllAtOnce(), output_len=output_len, prompt_len=prompt_len,
                          tokenizer=tokenizer, seed=seed)
    return BenchWorkload([list(w.prompt) for w in drawn], [w.params.max_new_tokens for w in drawn])


def poisson_arrivals(rate: float, n: int, seed: int = 0) -> list[float]:
    """n arrival times (seconds from the start) of a Poisson process with `rate` requests per second."""
    return [float(t) for t in Poisson(rate).times(np.random.default_rng(seed), n)]
