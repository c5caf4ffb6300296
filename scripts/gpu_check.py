"""The engine on a CUDA GPU, in one table: tokens against transformers, kernels, CUDA graphs, roofline.

On a machine where torch sees a GPU, for the default model:
- greedy tokens of the engine (torch attention in bfloat16 with CUDA graphs off, then on; the
  numba-cuda kernels, which compute in float32) against transformers' generate() in the same dtype
  on the same GPU, by the near-tie rule of DESIGN.md: equal up to the first position where the
  reference's top-2 logits are closer than TIE_TOLERANCE;
- the median decode step at batch 1, 8 and 32 for each of those configurations, and what it
  achieves against the GPU's measured copy bandwidth (bytes of weights and KV read per step / step time).

    bash scripts/gpu_check.sh          # this script, the kernel tests on the GPU, and the bench's roofline lines

Exits 2 with a message where torch sees no GPU. Nothing here is a test with a timing threshold:
the step times are what this GPU did once, printed for the reader.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

from minibatch import LLM, EngineConfig, SamplingParams
from minibatch.bench.roofline import decode_records, memory_bandwidth
from minibatch.models import load_hf

TIE_TOLERANCE = 0.05      # top-2 logits this close are a tie at bf16's precision (as tests/test_bfloat16.py)
NEW_TOKENS = 32
BATCH_SIZES = (1, 8, 32)
PROMPT_TOKENS = 32
# (attention backend, dtype, CUDA graphs); the Numba kernels compute in float32 only
CONFIGS = {"cuda": [("torch", "bfloat16", False), ("torch", "bfloat16", True), ("numba-cuda", "float32", False)],
           "cpu": [("torch", "bfloat16", False), ("numba", "float32", False)]}   # --device cpu: a dry run anywhere


def prompts(vocab: int) -> list[list[int]]:
    """Eight prompts of different lengths, built from token ids so no tokenizer is needed."""
    return [[(131 * i + 17 * j) % (vocab - 16) + 8 for j in range(5 + 11 * i)] for i in range(8)]


@torch.inference_mode()
def reference_with_ties(model, prompt: list[int]) -> tuple[list[int], int]:
    """transformers' greedy tokens for one prompt alone, and the first step whose top-2 logits are a near tie."""
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False,
                         eos_token_id=None, output_scores=True, return_dict_in_generate=True)
    tokens = out.sequences[0, len(prompt):].tolist()
    gaps = [float(top[0] - top[1]) for top in (s[0].float().topk(2).values for s in out.scores)]
    return tokens, next((i for i, gap in enumerate(gaps) if gap < TIE_TOLERANCE), len(tokens))


def engine(model: str, device: str, backend: str, dtype: str, graphs: bool) -> LLM:
    most = max(BATCH_SIZES)
    return LLM(EngineConfig(model=model, device=device, dtype=dtype, attention_backend=backend,
                            cuda_graphs=graphs, max_batch_size=most, max_model_len=256,
                            max_tokens_per_step=most * PROMPT_TOKENS))


def check(llm: LLM, batch: list[list[int]], references) -> str:
    """'8/8' when every request agrees with the reference up to its first near tie."""
    outs = llm.generate(batch, SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True), use_tqdm=False)
    agree = sum(o.token_ids[:tie] == ref[:tie] for o, (ref, tie) in zip(outs, references))
    return f"{agree}/{len(batch)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="cuda", choices=sorted(CONFIGS))
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: torch sees no CUDA device here; run this on a machine with a GPU", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"device: {name}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    references, batch = {}, []
    for dtype in sorted({dtype for _, dtype, _ in CONFIGS[args.device]}):
        hf_model = load_hf(args.model, getattr(torch, dtype))[0].to(args.device)
        batch = prompts(hf_model.config.vocab_size)
        references[dtype] = [reference_with_ties(hf_model, p) for p in batch]
        compared = sum(tie for _, tie in references[dtype])
        print(f"reference: transformers {dtype} on the {args.device}, "
              f"{compared} of {len(batch) * NEW_TOKENS} tokens before a near tie")
        del hf_model
    bandwidth = memory_bandwidth(device=args.device)
    print(f"copy bandwidth: {bandwidth / 1e9:.0f} GB/s")   # of the device the engine runs on
    steps = "".join(f"  step@{b:<3} ms  GB/s" for b in BATCH_SIZES)
    print(f"{'attention':<11} {'dtype':<8} {'graphs':<6} {'tokens':>6}{steps}")
    failed = False
    for backend, dtype, graphs in CONFIGS[args.device]:
        llm = engine(args.model, args.device, backend, dtype, graphs)
        agree = check(llm, batch, references[dtype])
        failed |= not agree.startswith(f"{len(batch)}/")
        weight_bytes = llm.engine.model.decode_weight_bytes()
        kv_bytes_per_token = llm.engine.kv_cache.bytes_per_token                # K and V of every layer
        cells = []
        for b in BATCH_SIZES:
            decode_records(llm, b, 2, PROMPT_TOKENS)                             # warm-up (and graph capture)
            records = decode_records(llm, b, 16, PROMPT_TOKENS)
            step = statistics.median(r.duration for r in records)
            context = statistics.median(r.kv_tokens_stored for r in records)
            read = weight_bytes + context * kv_bytes_per_token
            cells.append(f"  {step * 1e3:>10.2f} {read / step / 1e9:>5.0f}")
        print(f"{backend:<11} {dtype:<8} {str(graphs):<6} {agree:>6}" + "".join(cells))
        del llm
        if args.device == "cuda":
            torch.cuda.empty_cache()
    print(f"tokens: requests equal to transformers in the same dtype up to its first near tie (top-2 logits within "
          f"{TIE_TOLERANCE}); GB/s: weights + KV read per decode step / step time")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
