"""Serves the benchmark's jobs with OpenVINO GenAI's `ContinuousBatchingPipeline`: greedy, EOS ignored.

The benchmark starts it as `.peers/openvino/bin/python openvino_runner.py` (see runner_protocol for the
conversation). The spec names the exported OpenVINO model folder (`make peer-openvino` exports the converted
checkpoint minibatch loads, in float32), the precision ("f32" for the arithmetic and the KV cache, or None for
OpenVINO's defaults: bfloat16 arithmetic on a CPU with AMX or AVX512-BF16, a KV cache in u8), the threads,
the batch size (SchedulerConfig.max_num_seqs, so a pipeline is built for each batch size) and the longest
request; everything else is OpenVINO's default
(paged KV cache, dynamic split-fuse chunked prefill, no prefix caching).
"""
from __future__ import annotations

from runner_protocol import serve


def load(spec: dict):
    import openvino as ov
    import openvino_genai as genai
    scheduler = genai.SchedulerConfig()
    scheduler.max_num_seqs = spec["batch_size"]
    scheduler.enable_prefix_caching = False
    properties = {"INFERENCE_NUM_THREADS": spec["threads"]}
    if spec.get("precision"):                 # the arithmetic, and the keys and values (the CPU's default: u8)
        for name in ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION", "KEY_CACHE_PRECISION", "VALUE_CACHE_PRECISION"):
            properties[name] = spec["precision"]
    pipe = genai.ContinuousBatchingPipeline(spec["model"], scheduler, "CPU", properties)
    state = (pipe, ov, genai)
    generate(state, [[1, 2, 3, 4]] * 2, [4, 4], 2)                    # warm-up, not timed
    return state, {"version": genai.__version__, "precision": spec.get("precision") or "default"}


def generate(state, prompts: list, output_lens: list, batch_size: int) -> list:
    pipe, ov, genai = state
    import numpy as np
    inputs = [ov.Tensor(np.asarray([p], dtype=np.int64)) for p in prompts]       # (1, L) each
    configs = []
    for n in output_lens:
        config = genai.GenerationConfig()
        # ignore_eos alone: the end-of-sequence token is produced and generation goes on, as in the reference
        # (min_new_tokens would forbid that token instead, and change the tokens wherever the model wants it)
        config.max_new_tokens, config.ignore_eos, config.do_sample = n, True, False
        configs.append(config)
    results = pipe.generate(inputs, configs)
    return [list(r.m_generation_ids[0]) for r in results]            # in prompt order


if __name__ == "__main__":
    raise SystemExit(serve(load, generate))
