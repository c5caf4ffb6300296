"""The peers a learner would otherwise use, both from Hugging Face transformers, on the same weights.

- `HFGenerate`: `model.generate()` on static batches of `batch_size` prompts, left-padded with an
  attention mask. A batch runs until its longest request is done; shorter ones are cut to their
  own length afterwards (the padded tokens and the extra steps are the waste static batching pays).
- `HFContinuous`: transformers' own continuous batching, the engine behind `model.generate_batch()`.
  `generate_batch` takes one `max_new_tokens` for all prompts, so requests are added one by one to
  the same manager (`continuous_batching_context_manager` + `add_request`), each with its own length
  and EOS disabled. Its `ContinuousBatchingConfig` is sized for the workload: left alone it sizes
  its KV cache from 60% of the machine's memory, which on a CPU takes minutes to allocate.
"""
from __future__ import annotations

import math
import time

import torch
from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig

from minibatch.bench.check import greedy_kwargs
from minibatch.bench.peers.systems import BLOCK_SIZE, RunResult, System
from minibatch.analysis.metrics import RunReport
from minibatch.engine.records import RequestMetrics

MAX_BATCH_TOKENS = 512   # tokens per step, the same budget as minibatch's max_tokens_per_step default
WAIT_S = 600.0           # longest wait for one result before the run is declared stuck


class HFGenerate(System):
    name, label = "hf-generate", "transformers generate() (padded static batches)"
    serves_online = False    # a padded batch has no way to let a request join: measured offline only

    def __init__(self, hf_model, pad_token_id: int):
        self.model, self.pad = hf_model, pad_token_id

    def prepare(self, batch_size: int, max_len: int) -> None:
        self.batch_size = batch_size
        self._batch([[1, 2, 3, 4]], [4])                              # warm-up

    @torch.inference_mode()
    def _batch(self, prompts, lens) -> list[list[int]]:
        width = max(map(len, prompts))
        ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)          # (B, width), left padding
        mask = torch.zeros_like(ids)
        for row, p in enumerate(prompts):
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1
        out = self.model.generate(ids.to(self.model.device), attention_mask=mask.to(self.model.device),
                                  pad_token_id=self.pad, **greedy_kwargs(max(lens)))  # (B, width + max(lens))
        return [out[row, width:width + n].tolist() for row, n in enumerate(lens)]

    def offline(self, prompts, output_lens) -> RunResult:
        outputs, start = [], time.perf_counter()
        for i in range(0, len(prompts), self.batch_size):               # in arrival order, like a static scheduler
            outputs += self._batch(prompts[i:i + self.batch_size], output_lens[i:i + self.batch_size])
        return RunResult(outputs, time.perf_counter() - start)


class HFContinuous(System):
    name, label = "hf-continuous", "transformers continuous batching (generate_batch)"
    serves_online = True

    def __init__(self, hf_model):
        self.model = hf_model

    def prepare(self, batch_size: int, max_len: int) -> None:
        self.config = ContinuousBatchingConfig(
            page_size=BLOCK_SIZE,                                        # tokens per KV page, as minibatch's blocks
            num_blocks=batch_size * math.ceil(max_len / BLOCK_SIZE) + 1,  # every slot's longest request fits
            max_batch_tokens=MAX_BATCH_TOKENS,                           # token budget of a step
            max_requests_per_batch=batch_size,                           # the max batch size
            allow_block_sharing=False)                                   # no prefix caching: minibatch has none
        self.offline([[1, 2, 3, 4]], [4])                                # warm-up

    def _serve(self, prompts, output_lens, arrivals, timestamps: bool):
        """Add each request at its arrival time (seconds after the start) and wait for all; returns
        (results in workload order, start time on perf_counter)."""
        config = GenerationConfig(do_sample=False, max_new_tokens=max(output_lens),
                                  eos_token_id=-1, pad_token_id=self.model.generation_config.pad_token_id)  # -1: no EOS
        with self.model.continuous_batching_context_manager(generation_config=config, block=True, timeout=WAIT_S,
                                                            continuous_batching_config=self.config) as manager:
            start = time.perf_counter()
            for i, (p, n, a) in enumerate(zip(prompts, output_lens, arrivals)):
                time.sleep(max(0.0, start + a - time.perf_counter()))
                manager.add_request(list(p), request_id=f"r{i}", max_new_tokens=int(n), eos_token_id=-1,
                                    record_timestamps=timestamps)
            results = {}
            while len(results) < len(prompts):
                result = manager.get_result(timeout=WAIT_S)
                if result is None or result.error is not None:
                    why = result.error if result else f"no result within {WAIT_S:.0f} s"
                    raise RuntimeError(f"transformers continuous batching failed: {why}")
                if result.is_finished():
                    results[result.request_id] = result
        return [results[f"r{i}"] for i in range(len(prompts))], start

    def offline(self, prompts, output_lens) -> RunResult:
        results, start = self._serve(prompts, output_lens, [0.0] * len(prompts), timestamps=False)
        end = max(r.lifespan[1] for r in results)
        return RunResult([list(r.generated_tokens) for r in results], end - start)

    def online(self, prompts, output_lens, arrivals) -> RunResult:
        results, start = self._serve(prompts, output_lens, arrivals, timestamps=True)
        metrics = []
        for i, r in enumerate(results):
            born, ts, n = r.created_time, r.timestamps, len(r.generated_tokens)
            metrics.append(RequestMetrics(i, born - start, r.lifespan[0] - born, ts[0] - born,
                                          (ts[-1] - ts[0]) / (n - 1) if n > 1 else None, r.lifespan[1] - born,
                                          len(r.prompt_ids), n, 0, "length"))
        report = RunReport(metrics, [], self.config.max_requests_per_batch)
        return RunResult([list(r.generated_tokens) for r in results], report.duration, report=report)
