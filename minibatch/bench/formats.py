"""Weight formats for one user: decode tokens/s of each format against its own memory bound, and its tokens.

A decode step of one sequence reads every weight once, so it takes at least

    bytes of weights the step reads / memory bandwidth            (the format's memory bound)

and a format with fewer bytes per weight (bfloat16: 2, q8_0: 1.06, q4_1: 0.63, against float32's 4)
lowers that bound. Whether a step gets near it is up to the kernel that multiplies by the format.

`compare_formats(llms, prompt)` serves one prompt alone, greedily, with each engine in turn (one per
format, the reference first), round after round, and measures this machine's copy bandwidth in every
round too, so that a busy moment hits every format and the bound alike. It returns the `Rounds` (each
format's median decode step in seconds, the copy bandwidth in GB/s) and one row per format: bytes per
weight, bytes a step reads, tokens/s of the fastest round, the memory bound at the best bandwidth
measured, the share of the bound reached, the tokens, and where they part from the reference's,
with the reference's top-2 logit gap at that token (a small gap is a near tie, which a slightly
different weight or rounding may tip either way).

`shipped_peer_lines()` prints a peer's batch-1 figures from the shipped bench results (machine and
date included) where this copy of the course has them.
"""
from __future__ import annotations

import statistics

from minibatch.analysis.claims import Rounds, interleaved
from minibatch.bench.results import load_shipped
from minibatch.bench.roofline import memory_bandwidth
from minibatch.config import SamplingParams

BANDWIDTH = "copy bandwidth (GB/s)"


def step_name(fmt: str) -> str:
    """The name of a format's figure in the Rounds: its median decode step."""
    return f"{fmt} decode step (s)"


def top2_gap(logprobs: dict[int, float]) -> float:
    """The gap between the two largest log-probabilities of a position: the gap of its top-2 logits."""
    first, second = sorted(logprobs.values(), reverse=True)[:2]
    return first - second


def first_difference(tokens: list[int], reference: list[int]) -> int | None:
    """The first position where tokens and reference (as many of them) differ, or None if they agree throughout."""
    return next((i for i, (a, b) in enumerate(zip(tokens, reference, strict=True)) if a != b), None)


def compare_formats(llms: dict, prompt, max_new_tokens: int = 20, rounds: int = 3) -> tuple[Rounds, list[dict]]:
    """Rounds and one row per engine of `llms` ({format: LLM}, the reference format first), on one prompt."""
    params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True, logprobs=2)   # top-2 for the gaps
    outputs = {}

    def serve(fmt):   # one answer alone; its median decode step
        llm = llms[fmt]
        first = len(llm.engine.step_records)
        outputs[fmt] = llm.generate([prompt], params, use_tqdm=False)[0]
        return statistics.median(s.duration for s in llm.engine.step_records[first:] if s.num_prefill_tokens == 0)

    for llm in llms.values():   # warm-up: the first call compiles (or loads) kernels and sets up their threads
        llm.generate([prompt], SamplingParams(max_new_tokens=2), use_tqdm=False)
    measured = interleaved({**{step_name(fmt): (lambda fmt=fmt: serve(fmt)) for fmt in llms},
                            BANDWIDTH: lambda: memory_bandwidth(repeats=1) / 1e9}, rounds=rounds, warmup=False)
    bandwidth = 1e9 * measured.most(BANDWIDTH)             # the best round: the machine undisturbed
    reference = outputs[next(iter(llms))]
    rows = []
    for fmt, llm in llms.items():
        model, out = llm.engine.model, outputs[fmt]
        weight_bytes = model.decode_weight_bytes()
        parts_at = first_difference(out.token_ids, reference.token_ids)
        bound_tok_s = bandwidth / weight_bytes
        tok_s = 1 / measured.best(step_name(fmt))
        rows.append({"format": fmt, "weight_bytes": weight_bytes,
                     "bytes_per_weight": weight_bytes / sum(w.numel() for w in model.linears()),
                     "tok_s": tok_s, "bound_tok_s": bound_tok_s, "of_bound": tok_s / bound_tok_s,
                     "tokens": out.token_ids, "text": out.text, "parts_at": parts_at,
                     "gap_at_part": None if parts_at is None else top2_gap(reference.outputs[0].logprobs[parts_at])})
    return measured, rows


def table_lines(rows: list[dict], max_new_tokens: int) -> list[str]:
    """The rows of `compare_formats` as a printed table."""
    lines = [f"{'format':<8}{'bytes/weight':>13}{'MB/step':>9}{'tok/s':>8}{'bound tok/s':>13}{'of bound':>10}  tokens"]
    reference = rows[0]["format"]
    for r in rows:
        if r["parts_at"] is None:
            tokens = f"all {max_new_tokens} equal {reference}'s" if r["format"] != reference else "the reference"
        else:
            tokens = (f"part from {reference}'s at token {r['parts_at']} (where {reference}'s top-2 logits "
                      f"were {r['gap_at_part']:.2f} apart)")
        lines.append(f"{r['format']:<8}{r['bytes_per_weight']:>13.3f}{r['weight_bytes'] / 1e6:>9.0f}{r['tok_s']:>8.1f}"
                     f"{r['bound_tok_s']:>13.1f}{r['of_bound']:>10.0%}  {tokens}")
    return lines


def shipped_peer_lines(prefix: str = "llamacpp") -> list[str]:
    """Batch-1 tokens/s of the shipped results' systems whose names start with `prefix`, and of minibatch
    beside them, with the machine and date they were measured on; or a line saying none are shipped here."""
    try:
        shipped = load_shipped()
    except FileNotFoundError as missing:
        return [f"no shipped results of {prefix} in this copy of the course ({missing}); `make peers` installs "
                "the peers and `python -m minibatch bench --peers` measures them on this machine"]
    machine = shipped["machine"]
    lines = [f"shipped results, measured on {machine['cpu']} ({machine['threads']} threads) on {shipped['date']}, "
             "batch 1, output tokens/s (median [min-max]):"]
    for name, system in shipped["systems"].items():
        one = system["tok_s"].get("1")
        if one is not None and name.startswith((prefix, "minibatch")):
            lines.append(f"  {system['label']:<40}{one['median']:7.1f} [{one['min']:.0f}-{one['max']:.0f}]")
    if len(lines) == 1:
        lines.append(f"  (no system named {prefix}... at batch 1 in them)")
    return lines
