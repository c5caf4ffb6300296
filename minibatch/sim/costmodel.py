"""How long a step takes, without running it: the cost models behind the simulated clock.

A step is described by its `StepShape`: how many prompt tokens it prefills, how many sequences
decode one token, and how many tokens of KV cache its sequences read. Two kinds of model turn a
shape into seconds:

- `BandedCostModel` (`minibatch.sim.stepcost`), MEASURED: a fixed cost and a weight read per step,
  compute per token row (piecewise, by the row bands where the engine's products switch paths), the
  LM head per sampled row and attention per KV token read, fitted to real steps of the engine
  (`python -m minibatch calibrate`). The shipped profile `smollm2-135m-cpu` was measured this way.
  `LinearCostModel` is its one-line ancestor (overhead + a cost per prefill token, per decode
  sequence and per KV token), still read from profiles written in that form.
- `RooflineCostModel`, MODELLED: for hardware you do not have (an H100-class GPU, a phone).
  A step costs its overhead plus the longer of its compute time (FLOPs / peak FLOP/s) and its
  memory time (bytes moved / bandwidth). No such machine was measured: these are estimates.

Profiles are JSON files: the shipped ones live in `minibatch/sim/profiles/` and are loaded by name
(`load_profile("smollm2-135m-cpu")`); any other profile is loaded by its path. A learner's own
profiles, written by `python -m minibatch calibrate`, live in the model cache (`$MINIBATCH_CACHE`,
else `~/.cache/minibatch`) under `profiles/`, and a name finds them first: once a learner has
calibrated, the default `sim_profile="smollm2-135m-cpu"` is their own machine.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from minibatch.config import ConfigError
from minibatch.engine.models.smollm2 import model_cache_dir

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
COEFFICIENTS = ("overhead_s", "per_prefill_token_s", "per_decode_seq_s", "per_kv_token_s")


@dataclass(frozen=True)
class StepShape:
    """What a step computes, in the units the cost models charge for."""

    prefill_tokens: int = 0    # prompt tokens computed (whole prompts and chunks)
    decode_seqs: int = 0       # sequences computing one new token each
    kv_tokens_read: int = 0    # cache tokens the sequences attend to (cached + new), each read once per step
    attention_pairs: int = 0   # (query, key) pairs: every new token attends to each token up to itself
    sampled_rows: int = 0      # sequences that produce a token (they go through the LM head)

    @classmethod
    def of(cls, plan) -> "StepShape":
        """The shape of a scheduler's StepPlan."""
        prefill = decode = context = pairs = sampled = 0
        for seq in plan.seqs:
            q, ctx = seq.num_new_tokens, seq.start + seq.num_new_tokens
            if seq.is_prefill:
                prefill += q
            else:
                decode += 1
            context += ctx
            pairs += q * (ctx - q) + q * (q + 1) // 2   # row j of the q new rows sees ctx - q + j + 1 keys
            sampled += seq.samples
        return cls(prefill, decode, context, pairs, sampled)

    def features(self) -> tuple[float, float, float, float]:
        """The inputs of the linear model, in the order of COEFFICIENTS."""
        return (1.0, float(self.prefill_tokens), float(self.decode_seqs), float(self.kv_tokens_read))


class CostModel:
    """Seconds a step takes; subclasses say how."""

    kind = "?"

    def step_time(self, shape: StepShape) -> float:
        raise NotImplementedError

    def plan_time(self, plan) -> float:
        return self.step_time(StepShape.of(plan))


@dataclass(frozen=True)
class LinearCostModel(CostModel):
    """overhead + prefill tokens x a + decode sequences x b + KV tokens read x c (fitted to measurements)."""

    overhead_s: float             # per step, whatever it computes: scheduling, reading the weights, Python
    per_prefill_token_s: float    # each prompt token through every layer
    per_decode_seq_s: float       # each decoding sequence: its token through every layer and the LM head
    per_kv_token_s: float         # each token of KV cache a sequence reads
    kind = "measured"

    def step_time(self, shape: StepShape) -> float:
        return (self.overhead_s + self.per_prefill_token_s * shape.prefill_tokens
                + self.per_decode_seq_s * shape.decode_seqs + self.per_kv_token_s * shape.kv_tokens_read)

    def coefficients(self) -> tuple[float, float, float, float]:
        return (self.overhead_s, self.per_prefill_token_s, self.per_decode_seq_s, self.per_kv_token_s)


@dataclass(frozen=True)
class ModelSize:
    """The numbers of a Llama-family model that set its FLOPs and bytes."""

    body_params: int          # weights every token passes through (all layers)
    lm_head_params: int       # vocab x hidden: only the rows that sample pass through it
    attention_width: int      # layers x query heads x head_dim: FLOPs per (query, key) pair are 4x this
    kv_values_per_token: int  # 2 (K and V) x layers x KV heads x head_dim

    @classmethod
    def of(cls, config) -> "ModelSize":
        """From a Hugging Face Llama config."""
        c, L, inter = config.hidden_size, config.num_hidden_layers, config.intermediate_size
        hq, hkv = config.num_attention_heads, config.num_key_value_heads
        d = getattr(config, "head_dim", None) or c // hq
        per_layer = c * (hq + 2 * hkv) * d + hq * d * c + 3 * c * inter + 2 * c
        return cls(L * per_layer + c, config.vocab_size * c, L * hq * d, 2 * L * hkv * d)


@dataclass(frozen=True)
class RooflineCostModel(CostModel):
    """overhead + max(compute time, memory time): an estimate for hardware that was not measured."""

    peak_flops: float          # FLOP/s the chip can do at this precision
    memory_bandwidth: float    # bytes/s between memory and the chip
    overhead_s: float          # per step: launching kernels, scheduling, Python (assumed, not measured)
    bytes_per_value: int       # 2 for bfloat16/float16 weights and KV, 4 for float32
    efficiency: float          # share of the peaks real kernels reach
    size: ModelSize
    kind = "roofline"

    def step_time(self, shape: StepShape) -> float:
        tokens = shape.prefill_tokens + shape.decode_seqs
        flops = (2 * (self.size.body_params * tokens + self.size.lm_head_params * shape.sampled_rows)
                 + 4 * self.size.attention_width * shape.attention_pairs)
        moved = self.bytes_per_value * (self.size.body_params + self.size.lm_head_params   # every weight, once
                                        + self.size.kv_values_per_token * shape.kv_tokens_read)
        return self.overhead_s + max(flops / self.peak_flops, moved / self.memory_bandwidth) / self.efficiency


def own_profile_dir() -> Path:
    """Where `python -m minibatch calibrate` saves a learner's own profiles: the model cache's profiles/."""
    return model_cache_dir() / "profiles"


def profile_path(name_or_path) -> Path:
    """The file a profile name or path means: the learner's own profile of that name if there is one,
    else the shipped one, else the path itself."""
    name = str(name_or_path)
    if name and "/" not in name and not name.endswith(".json"):
        for folder in (own_profile_dir(), PROFILE_DIR):
            if (folder / f"{name}.json").is_file():
                return folder / f"{name}.json"
    return Path(name_or_path)


def list_profiles() -> dict[str, str]:
    """Profile names (the learner's own, then the shipped ones) and what each describes."""
    paths = {p.stem: p for folder in (PROFILE_DIR, own_profile_dir()) for p in sorted(folder.glob("*.json"))}
    return {name: json.loads(path.read_text()).get("description", "") for name, path in paths.items()}


def load_profile(name_or_path) -> dict:
    """A profile (a dict) by name or by path to a JSON file; ConfigError if there is none."""
    path = profile_path(name_or_path)
    if not path.is_file():
        raise ConfigError(f"EngineConfig.sim_profile={str(name_or_path)!r} is not allowed: choose one of "
                          f"{', '.join(map(repr, list_profiles()))} or the path of a profile JSON file")
    profile = json.loads(path.read_text())
    if profile.get("kind") not in ("measured", "roofline"):
        raise ConfigError(f"{path}: field 'kind'={profile.get('kind')!r} is not allowed: 'measured' or 'roofline'")
    return profile


def save_profile(profile: dict, path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(profile, indent=1) + "\n")


def cost_model(profile, model_config=None) -> CostModel:
    """The cost model a profile (a dict, a name or a path) describes. A roofline profile needs the
    model's Hugging Face config, since it computes FLOPs and bytes from the model's shape."""
    if not isinstance(profile, dict):
        profile = load_profile(profile)
    if profile["kind"] == "measured" and "row_bands" in profile:
        from minibatch.sim.stepcost import BandedCostModel   # here: stepcost builds on this module
        return BandedCostModel.from_profile(profile)
    if profile["kind"] == "measured":
        return LinearCostModel(**{k: float(profile["coefficients"][k]) for k in COEFFICIENTS})
    if model_config is None:
        raise ConfigError(f"profile {profile.get('name')!r} is a roofline model: pass the model's config")
    hw = profile["hardware"]
    return RooflineCostModel(float(hw["peak_flops"]), float(hw["memory_bandwidth"]), float(hw["overhead_s"]),
                             int(hw["bytes_per_value"]), float(hw["efficiency"]), ModelSize.of(model_config))
