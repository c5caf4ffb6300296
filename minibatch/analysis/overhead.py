"""The fixed cost of a decode step against the model's size, measured on the path the engine runs.

A decode step's time splits in two. Inside the model's forward pass are the layers and the LM head,
which grow with the model. Outside it are scheduling, packing the inputs, sampling, the update and
the step record, which do not: they grow with the batch and the vocabulary, never with the layers
or their width. `forward_timed` times every call of the model's forward pass and of its LM head and
changes nothing else: the layers run as the engine runs them by default (on a CPU in float32, each
layer as one compiled call), and nothing is timed inside them, unlike `EngineConfig(profile_steps=True)`,
which also times one layer's parts apart to share the layers' time out. So, for each decode step,

    fixed  = step - forward         the part that does not grow with the model
    layers = forward - LM head      (the embedding lookup and the loop over the layers included)

A model larger than a laptop holds is measured on its first layers only (`shaped_engine`), with
random weights of its shape: a step's time does not depend on the weights' values, and the fixed
part plus the LM head plus the per-layer time at full depth gives the whole model's step
(`full_depth`). `python -m minibatch overhead` prints the table for the course's four sizes (minibatch.tools.overhead).
"""
from __future__ import annotations

import copy
import time
from contextlib import contextmanager

import numpy as np
import torch

from minibatch.analysis.claims import MIN_ROUNDS, Rounds
from minibatch.config import EngineConfig, SamplingParams
from minibatch.engine.llm_engine import LLMEngine
from minibatch.engine.models import LoadedModel, load_model_spec
from minibatch.engine.models.tiny import random_llama
from minibatch.engine.parts import ModelParts

# The course's sizes: label -> (registry name, layers to run; None: all of them). On a CPU in float32 the engine
# keeps two copies of each weight matrix (`engine.models.linear`): whole, the 360M shape would hold 3 GB and the
# 1.7B shape 14 GB, so the four side by side fit a laptop with their first 8 of 32 layers and 1 of 24.
SIZES = {"tiny": ("tiny", None), "135M": ("smollm2-135m", None), "360M": ("smollm2-360m-random", 8),
         "1.7B": ("smollm2-1.7b-random", 1)}
FIGURES = ("step", "forward", "head", "fixed")   # milliseconds per decode step, in each round's Rounds


class FirstLayers(ModelParts):
    """The real engine's parts, the model cut to its first `num_layers` layers, with random weights."""

    def __init__(self, num_layers: int):
        self.num_layers = num_layers

    def load(self, name: str) -> LoadedModel:
        spec = load_model_spec(name)
        if not 1 <= self.num_layers <= spec.config.num_hidden_layers:
            raise ValueError(f"num_layers={self.num_layers} is not allowed for model={name!r}: "
                             f"from 1 to its {spec.config.num_hidden_layers} layers")
        config = copy.deepcopy(spec.config)
        config.num_hidden_layers = self.num_layers
        state = dict(random_llama(config).state_dict())   # shares the model's storage: no second copy
        return LoadedModel(f"{name} (first {self.num_layers} layers)", config, state, spec.tokenizer,
                           spec.eos_token_ids)


def shaped_engine(model: str, num_layers: int | None = None, **config_fields) -> LLMEngine:
    """An engine for the registry name `model`, whole, or cut to its first `num_layers` layers (random
    weights); `config_fields` go to its EngineConfig (kernels, dtype, ...), the rest are the defaults."""
    config = EngineConfig(model=model, max_batch_size=config_fields.pop("max_batch_size", 8),
                          max_model_len=config_fields.pop("max_model_len", 64), **config_fields)
    return LLMEngine(config, ModelParts() if num_layers is None else FirstLayers(num_layers))


class _Timed:
    """A callable (the forward pass, the LM head's product) whose calls append their seconds to `into`;
    anything else asked of it (nbytes, operands, ...) is the callable's own."""

    def __init__(self, fn, into: list, sync):
        self.fn, self.into, self.sync = fn, into, sync

    def __call__(self, *args, **kwargs):
        if self.sync:
            self.sync()
        start = time.perf_counter()
        out = self.fn(*args, **kwargs)
        if self.sync:
            self.sync()
        self.into.append(time.perf_counter() - start)
        return out

    def __getattr__(self, name):
        return getattr(self.fn, name)


@contextmanager
def forward_timed(engine: LLMEngine):
    """Within the block, the seconds of every call of the model's forward pass and of its LM head are
    appended to the yielded {"forward": [...], "head": [...]}; the model runs exactly as before."""
    model, times = engine.model, {"forward": [], "head": []}
    sync = torch.cuda.synchronize if engine.device.type == "cuda" else None   # charge kernels, not launches
    saved = {name: vars(model).get(name) for name in ("forward", "lm_head")}
    model.forward = _Timed(model.forward, times["forward"], sync)
    model.lm_head = _Timed(model.lm_head, times["head"], sync)   # the forward pass calls it as self.lm_head
    try:
        yield times
    finally:
        for name, fn in saved.items():
            if fn is None:
                delattr(model, name)
            else:
                setattr(model, name, fn)


def decode_split(engine: LLMEngine, batch_size: int = 1, steps: int = 4, prompt_tokens: int = 16) -> dict:
    """Median milliseconds over `steps` decode steps of `batch_size` sequences: the whole step, the
    forward pass, its LM head and the fixed part (step - forward)."""
    vocab = engine.model.vocab_size
    params = SamplingParams(max_new_tokens=steps + 1, ignore_eos=True)
    first = len(engine.step_records)
    with forward_timed(engine) as times:
        for i in range(batch_size):
            prompt = [(97 * i + 31 * j) % (vocab - 16) + 8 for j in range(prompt_tokens)]
            engine.check_request(prompt, params)
            engine.add_request(prompt, params)
        while engine.has_unfinished():
            engine.step()
    records = engine.step_records[first:]
    if not len(records) == len(times["forward"]) == len(times["head"]):
        raise RuntimeError(f"{len(records)} steps but {len(times['forward'])} forward passes: "
                           "the split needs one forward pass per step (no speculative decoding)")
    rows = [(sum(r.phase_times.values()), fwd, head) for r, fwd, head in zip(records, times["forward"], times["head"])
            if r.num_prefill_tokens == 0 and r.batch_size == batch_size]
    if not rows:
        raise RuntimeError(f"no decode step ran all {batch_size} sequences together: raise max_batch_size")
    step, forward, head = (1e3 * float(np.median(column)) for column in zip(*rows))
    fixed = float(np.median([1e3 * (s - f) for s, f, _ in rows]))
    return {"step": step, "forward": forward, "head": head, "fixed": fixed}


def measure_by_size(engines: dict[str, LLMEngine], rounds: int = 3, steps: int = 4, batch_size: int = 1) -> Rounds:
    """Interleaved rounds (A B C, A B C, ...) of `decode_split` over the engines: for each label, its
    FIGURES in ms and the fixed part's share of the step ("label share"), one value per round."""
    if rounds < MIN_ROUNDS:
        raise ValueError(f"rounds={rounds}: a measured claim needs at least {MIN_ROUNDS} rounds")
    for engine in engines.values():            # warm-up: first calls, page faults, compiled kernels
        decode_split(engine, batch_size, 1)
    result = Rounds()
    for _ in range(rounds):
        for label, engine in engines.items():
            split = decode_split(engine, batch_size, steps)
            for figure in FIGURES:
                result.add(f"{label} {figure} (ms)", split[figure])
            result.add(f"{label} share", split["fixed"] / split["step"])
    return result


def layers_of(engine: LLMEngine) -> tuple[int, int]:
    """(layers the engine runs, layers of the model it was cut from)."""
    full = load_model_spec(engine.config.model).config.num_hidden_layers
    return engine.model.num_layers, full


def full_depth(rounds: Rounds, label: str, layers_run: int, layers_full: int) -> dict:
    """The whole model's decode step (ms) from the medians of one measured at layers_run of its layers_full
    layers: fixed + LM head + (forward - LM head) / layers_run per layer, times layers_full."""
    fixed, head, forward = (rounds.median(f"{label} {f} (ms)") for f in ("fixed", "head", "forward"))
    per_layer = (forward - head) / layers_run
    step = fixed + head + per_layer * layers_full
    return {"fixed": fixed, "head": head, "per_layer": per_layer, "step": step, "share": fixed / step}


def table(engines: dict[str, LLMEngine], rounds: Rounds) -> list[dict]:
    """One row per engine: the weight MB a step reads (as run and at full depth), the layers run, the
    medians of the rounds (ms) and the whole model's step from `full_depth`."""
    rows = []
    for label, engine in engines.items():
        run, full = layers_of(engine)
        whole = full_depth(rounds, label, run, full)
        model = engine.model
        read = model.decode_weight_bytes()                                   # bytes a step reads
        head = model.lm_head.nbytes() + model.final_norm.numel() * model.final_norm.element_size()   # once per step
        medians = {f: rounds.median(f"{label} {f} (ms)") for f in FIGURES}
        rows.append({"label": label, "layers": f"{run}/{full}", "weight_mb": read / 1e6,
                     "full_weight_mb": (head + (read - head) * full / run) / 1e6, **medians,
                     "share": rounds.median(f"{label} share"), "per_layer": whole["per_layer"],
                     "full_step": whole["step"], "full_share": whole["share"]})
    return rows


def format_table(rows: list[dict]) -> str:
    """The table as text: medians of the interleaved rounds, in ms."""
    lines = [f"{'model':>6} {'weights read':>12} {'layers':>6} {'step':>8} {'layers+head':>11} {'fixed':>7} "
             f"{'fixed share':>11} {'per layer':>9} {'whole model: step':>17} {'fixed share':>11}"]
    for r in rows:
        lines.append(f"{r['label']:>6} {r['weight_mb']:>9.0f} MB {r['layers']:>6} {r['step']:>8.2f} "
                     f"{r['forward']:>11.2f} {r['fixed']:>7.2f} {r['share']:>11.1%} {r['per_layer']:>9.3f} "
                     f"{r['full_step']:>17.2f} {r['full_share']:>11.1%}")
    return "\n".join(lines)
