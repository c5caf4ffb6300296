"""OpenVINO GenAI in the benchmark: its `ContinuousBatchingPipeline`, run in its own Python (`make peer-openvino`).

The engine a learner on an Intel CPU would install for this job: continuous batching over a paged KV cache,
chunked prefill (dynamic split-fuse) and prefix caching, with knobs that map onto minibatch's one for one
(`SchedulerConfig.max_num_seqs` is `max_batch_size`, though read only with `dynamic_split_fuse` off;
`max_num_batched_tokens` is `max_tokens_per_step`,
`num_kv_blocks` / `cache_size` the KV pool, `enable_prefix_caching` the same). `make peer-openvino` installs
`openvino-genai` and `optimum-intel` into `.peers/openvino/` and exports the converted SmolLM2 folder to
OpenVINO's format in float32 (`optimum-cli export openvino ... --weight-format fp32`).

- `OpenVino("float32")`: with INFERENCE_PRECISION_HINT and the KV, key and value cache precisions "f32",
  checked against transformers in float32 by the near-tie rule (its kernels sum in another order and may fuse
  differently). The precision hint alone leaves the keys and values in OpenVINO's CPU default, u8.
- `OpenVino("default")`: OpenVINO's own defaults, bfloat16 arithmetic on a CPU with AMX or AVX512-BF16
  (float32 elsewhere) and keys and values in u8, checked against transformers in bfloat16 by the near-tie rule:
  what its users run.

One pipeline, at the bench's thread count, serves every max batch size: its runner admits at most that many
requests at a time (with split-fuse on, OpenVINO's default, `max_num_seqs` would not bound the batch).
"""
from __future__ import annotations

import torch

from minibatch.bench.check import BF16_TIE_TOLERANCE, PEER_TIE_TOLERANCE
from minibatch.bench.peers.external import ExternalSystem, peers_dir

PRECISIONS = {"float32": "f32", "default": None}


def exported_model():
    """The converted model in OpenVINO's format, as `make peer-openvino` exports it."""
    return peers_dir() / "openvino" / "model"


class OpenVino(ExternalSystem):
    """OpenVINO GenAI's continuous-batching pipeline on the exported model, in float32 or its default precision."""

    peer, script = "openvino", "openvino_runner.py"

    def __init__(self, precision: str = "default"):
        super().__init__()
        if precision not in PRECISIONS:
            raise ValueError(f"precision={precision!r} is not allowed: {', '.join(PRECISIONS)}")
        self.precision = precision
        self.name = "openvino-fp32" if precision == "float32" else "openvino-default"
        self.label = "OpenVINO GenAI, " + ("float32" if precision == "float32"
                                           else "its default (bfloat16 where the CPU has it, u8 KV cache)")
        self.reference, self.tie_tolerance = ("float32", PEER_TIE_TOLERANCE) if precision == "float32" else \
            ("bfloat16", BF16_TIE_TOLERANCE)

    def unavailable(self, model: str) -> str | None:
        reason = super().unavailable(model)
        if reason is None and not (exported_model() / "openvino_model.xml").exists():
            return f"no exported model in {exported_model()}: `make peer-openvino` exports it"
        return reason

    def spec(self, batch_size: int, max_len: int) -> dict:
        return {"model": str(exported_model()), "precision": PRECISIONS[self.precision], "max_len": max_len,
                "threads": torch.get_num_threads()}

    def release(self) -> None:
        """Kept for the next batch size (the same pipeline serves it); close() ends it."""

    def weight_bytes(self, size) -> int:
        bf16 = self.precision == "default" and torch.ops.mkldnn._is_mkldnn_bf16_supported()
        return (2 if bf16 else 4) * (size.body_params + size.lm_head_params)


OPENVINO_SYSTEMS = {"openvino-fp32": lambda: OpenVino("float32"), "openvino-default": lambda: OpenVino("default")}
