"""Serves the benchmark's jobs with OpenVINO GenAI's `ContinuousBatchingPipeline`: greedy, EOS ignored.

The benchmark starts it as `.peers/openvino/bin/python openvino_runner.py` (see runner_protocol for the
conversation). The spec names the exported OpenVINO model folder (`make peer-openvino` exports the converted
checkpoint minibatch loads, in float32), the precision ("f32" for the arithmetic and the KV cache, or None for
OpenVINO's defaults: bfloat16 arithmetic on a CPU with AMX or AVX512-BF16, a KV cache in u8), the threads and
the longest request; everything else is OpenVINO's default (paged KV cache, dynamic split-fuse chunked prefill,
no prefix caching).

The batch size is not a pipeline setting here: with dynamic split-fuse on (OpenVINO's default) its scheduler
ignores `SchedulerConfig.max_num_seqs` (a "vLLM-like setting", read only with split-fuse off) and batches every
request it holds, so `pipe.generate` of 32 prompts at max_num_seqs 1 decodes all 32 at once. A job therefore
runs the pipeline's own loop (add requests, step until none is left) but admits at most its batch_size
requests at a time, a new one as soon as one finishes, as the vLLM runner does: one pipeline serves every batch
size, with OpenVINO's default scheduler.
"""
from __future__ import annotations

from runner_protocol import serve


def load(spec: dict):
    import openvino as ov
    import openvino_genai as genai
    scheduler = genai.SchedulerConfig()
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
    running_status = genai.GenerationStatus.RUNNING
    outputs, running = [None] * len(prompts), {}                       # running: {prompt index: its handle}
    waiting = list(range(len(prompts)))[::-1]                          # popped from the end: arrival order
    while waiting or running:
        while waiting and len(running) < batch_size:
            i = waiting.pop()
            config = genai.GenerationConfig()
            # ignore_eos alone: the end-of-sequence token is produced and generation goes on, as in the
            # reference (min_new_tokens would forbid that token instead, and change the tokens wherever the
            # model wants it)
            config.max_new_tokens, config.ignore_eos, config.do_sample = output_lens[i], True, False
            running[i] = pipe.add_request(i, ov.Tensor(np.asarray([prompts[i]], dtype=np.int64)), config)  # (1, L)
        pipe.step()
        for i, handle in list(running.items()):
            if handle.get_status() != running_status:
                outputs[i] = list(handle.read_all()[0].generated_ids)
                del running[i]
    return outputs                                                      # in prompt order


if __name__ == "__main__":
    raise SystemExit(serve(load, generate))
