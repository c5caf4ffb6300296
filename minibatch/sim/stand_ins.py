"""What the engine runs instead of the model when `EngineConfig(clock="simulated", sim_skip_model=True)`.

Scheduling, KV accounting and metrics need only the model's shape (layers, KV heads, head size,
vocabulary, context) and its tokenizer, never its weights. So this mode reads the config and the
tokenizer (`minibatch.engine.models.load_model_spec`), takes the model's `ModelShape`, keeps the KV
tensors on PyTorch's "meta" device (sizes without memory), and replaces the forward pass and the
sampler with stand-ins: every sequence that samples gets a placeholder token that is neither an
end-of-sequence token nor one of its stop tokens, so each request runs to exactly `max_new_tokens`,
as with `ignore_eos=True`. Time comes from the simulated clock.
"""
from __future__ import annotations

from minibatch.engine.sampling import SampledToken


class PlaceholderRunner:
    """Runs nothing: a step's only effect is the time the simulated clock charges for it."""

    def execute(self, plan) -> None:
        return None


class PlaceholderSampler:
    """Gives each sampling sequence the smallest token id that would not stop it."""

    def __init__(self, eos_token_ids):
        self.eos_token_ids = set(eos_token_ids)
        self._token: dict[tuple, int] = {}   # stop_token_ids -> the placeholder for requests with them

    def _placeholder(self, stop_token_ids: tuple) -> int:
        if stop_token_ids not in self._token:
            avoid = self.eos_token_ids | set(stop_token_ids)
            self._token[stop_token_ids] = min(set(range(len(avoid) + 1)) - avoid)
        return self._token[stop_token_ids]

    def sample(self, logits, requests: list) -> list[SampledToken]:
        return [SampledToken(self._placeholder(r.params.stop_token_ids)) for r in requests]

    def release(self, request_id: int) -> None:
        pass
