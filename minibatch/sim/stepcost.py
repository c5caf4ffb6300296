"""The measured cost model: what a step of the engine costs, term by term, fitted to its real steps.

    step time = fixed + weights                          per step, whatever it computes
              + band step + per row x rows               compute: every token row through the products
              + per sampled row x sampled rows           the LM head, for the rows that produce a token
              + per KV token x KV tokens read            attention reads each sequence's cache
              + per lone KV token x KV tokens read       ... more per token when one sequence decodes alone:
                 (decode steps of one sequence)           its attention splits over only its few KV heads
              + per pair x attention pairs               a prompt's rows attend to each other

`fixed` is the time a step spends outside the model (scheduling, sampling, bookkeeping, Python);
`weights` is the model's own cost at one row: reading every weight once, which a decode step pays
whether it has 1 or 64 rows. The compute term is piecewise, one line per *row band*: the engine's
products switch paths at a few row counts (`engine.kernels.gemv_cpu`: a few rows streamed at once,
blocks of four rows above `BLOCK_ROWS`, columns in chunks up to `CHUNKED_ROWS`, oneDNN's GEMM above
`STREAM_ROWS`), and each path has its own cost per row and its own start; one more band ends where the
blocks' arithmetic stops hiding under the reading of the weights (about eight rows, `tools.calibrate`).
One straight line through all of them misses the steps of a few rows by a third. The bands a profile
was fitted with are stored in it, so the model reads the same on a machine whose engine switches elsewhere.

`minibatch.sim.fit` fits it (least squares on relative error, every term >= 0).
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from minibatch.sim.costmodel import CostModel, StepShape

def band_of(rows: int, row_bands: tuple[int, ...]) -> int:
    """The band of a step of `rows` token rows: 0 up to row_bands[0] rows, 1 up to row_bands[1], ..."""
    return bisect_left(row_bands, rows)


def grouped_rows(rows: int, band: int, row_groups: tuple[int, ...]) -> int:
    """Rows as the band's products take them: groups of row_groups[band] rows, a partial group counting whole
    (three rows in blocks of four cost four)."""
    group = row_groups[band] if row_groups else 1
    return -(-rows // group)


SCALAR_TERMS = ("fixed_s", "weights_s", "per_sampled_row_s", "per_kv_token_s", "per_attention_pair_s",
                "per_lone_kv_token_s")


def lone_kv_tokens(shape: StepShape) -> int:
    """The KV tokens of a decode step of one sequence (its attention has only a few KV heads to split among the
    threads, so each token costs more), else 0."""
    return shape.kv_tokens_read if shape.prefill_tokens == 0 and shape.decode_seqs == 1 else 0


@dataclass(frozen=True)
class BandedCostModel(CostModel):
    """fixed + weights + compute by row band + LM head + KV read + attention pairs (fitted to measurements)."""

    fixed_s: float                    # per step outside the model: scheduling, sampling, bookkeeping
    weights_s: float                  # per step inside the model at one row: every weight read once
    row_bands: tuple[int, ...]        # the last row count of each band but the last (which is open)
    band_step_s: tuple[float, ...]    # per band: a step in it costs this more than the first band's line
    per_row_s: tuple[float, ...]      # per band: each token row (or group of rows) through every layer's products
    per_sampled_row_s: float          # each sampling row through the LM head
    per_kv_token_s: float             # each cached token a sequence's queries read
    per_attention_pair_s: float       # each (query, key) pair: a prompt's rows each attend to all keys before them
    row_groups: tuple[int, ...] = ()  # per band: rows the products take together (4: blocks of four rows); () all 1
    per_lone_kv_token_s: float = 0.0  # each cached token more, when one sequence decodes alone
    kind = "measured"

    def __post_init__(self):
        bands = len(self.row_bands) + 1
        if len(self.band_step_s) != bands or len(self.per_row_s) != bands or len(self.row_groups) not in (0, bands):
            raise ValueError(f"BandedCostModel: {len(self.row_bands)} row_bands make {bands} bands, but band_step_s "
                             f"has {len(self.band_step_s)}, per_row_s {len(self.per_row_s)} and row_groups "
                             f"{len(self.row_groups)} (or none)")

    def band(self, rows: int) -> int:
        return band_of(rows, self.row_bands)

    def band_names(self) -> list[str]:
        lows = [1, *(edge + 1 for edge in self.row_bands)]
        highs = [str(edge) for edge in self.row_bands] + [""]
        return [f"{lo}-{hi}" for lo, hi in zip(lows, highs)]

    def terms(self, shape: StepShape) -> dict[str, float]:
        """Seconds per term of a step of this shape; they add up to step_time(shape)."""
        rows = shape.prefill_tokens + shape.decode_seqs
        band = self.band(rows)
        return {"fixed": self.fixed_s, "weights": self.weights_s,
                "compute": self.band_step_s[band] + self.per_row_s[band] * grouped_rows(rows, band, self.row_groups),
                "lm_head": self.per_sampled_row_s * shape.sampled_rows,
                "kv_read": (self.per_kv_token_s * shape.kv_tokens_read
                            + self.per_lone_kv_token_s * lone_kv_tokens(shape)),
                "attention": self.per_attention_pair_s * shape.attention_pairs}

    def step_time(self, shape: StepShape) -> float:
        return sum(self.terms(shape).values())

    def coefficients(self) -> dict[str, float]:
        """Every coefficient under a flat name (a profile's "coefficients"): band i's as band{i}_..."""
        flat = {name: getattr(self, name) for name in SCALAR_TERMS}
        for i, (step, row) in enumerate(zip(self.band_step_s, self.per_row_s)):
            flat[f"band{i}_step_s"], flat[f"band{i}_per_row_s"] = step, row
        return flat

    @classmethod
    def from_profile(cls, profile: dict) -> "BandedCostModel":
        c, bands = profile["coefficients"], tuple(int(b) for b in profile["row_bands"])
        return cls(**{name: float(c.get(name, 0.0)) for name in SCALAR_TERMS}, row_bands=bands,
                   row_groups=tuple(int(g) for g in profile.get("row_groups", ())),
                   band_step_s=tuple(float(c[f"band{i}_step_s"]) for i in range(len(bands) + 1)),
                   per_row_s=tuple(float(c[f"band{i}_per_row_s"]) for i in range(len(bands) + 1)))


def decode_shape(batch: int, context: int) -> StepShape:
    """A decode step of `batch` sequences that each hold `context` tokens before it."""
    kv = batch * (context + 1)
    return StepShape(decode_seqs=batch, kv_tokens_read=kv, attention_pairs=kv, sampled_rows=batch)


def decode_step_ratios(model: CostModel, batches=(1, 2, 4, 8, 16), context: int = 64) -> dict[int, float]:
    """step(b) / step(smallest b) of decode steps, as a cost model predicts them."""
    first = model.step_time(decode_shape(min(batches), context))
    return {b: model.step_time(decode_shape(b, context)) / first for b in batches}


def decode_capacity(model: CostModel, batch: int, new_tokens: float, context: int = 64) -> float:
    """Requests per second that full decode steps of `batch` sequences sustain when every request decodes
    `new_tokens` tokens at about `context` tokens: batch / (new_tokens x step). Prefill is left out, so a
    real server serves a little less: a rate above this overloads it whatever its machine."""
    return batch / (new_tokens * model.step_time(decode_shape(batch, context)))
