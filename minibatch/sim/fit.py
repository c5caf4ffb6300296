"""Fitting the banded cost model to measured steps, and how far it is from them.

Each measured step gives one equation: its time = the sum of its terms (`BandedCostModel.terms`),
unknown coefficients times known counts (rows in its band, sampled rows, KV tokens, pairs). With
many steps that is an over-determined linear system X c = y. Two choices make the fit honest:

- every equation is divided by its measured time, so the fit minimises *relative* errors (a 20 ms
  step and a 2 s step count alike: the goal is "within 10% everywhere", not a small sum of seconds);
- every coefficient is >= 0 (a cost cannot be negative). Non-negative least squares has an exact
  solution among the ordinary least-squares fits on subsets of the columns (the others held at 0):
  the best subset fit whose coefficients are all >= 0. With a dozen columns there are a few
  thousand subsets, each a small `lstsq`: a second, and nothing to tune.

`fixed_s` (time outside the model) is measured directly, so the fit finds fixed + weights as one
constant and the weights term is what remains of it.
"""
from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np

from minibatch.sim.costmodel import StepShape
from minibatch.sim.stepcost import BandedCostModel, band_of, grouped_rows, lone_kv_tokens


def nonnegative_least_squares(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """c >= 0 minimising |X c - y|^2: the best least-squares fit over subsets of columns that stays >= 0."""
    best, best_loss = np.zeros(X.shape[1]), float(np.sum(y ** 2))
    for keep in itertools.product((True, False), repeat=X.shape[1]):
        cols = np.flatnonzero(keep)
        if len(cols) == 0:
            continue
        c, *_ = np.linalg.lstsq(X[:, cols], y, rcond=None)
        if (c < 0).any():
            continue
        coef = np.zeros(X.shape[1])
        coef[cols] = c
        loss = float(np.sum((X @ coef - y) ** 2))
        if loss < best_loss:
            best, best_loss = coef, loss
    return best


def features(shape: StepShape, row_bands: tuple[int, ...], row_groups: tuple[int, ...] = ()) -> list[float]:
    """One equation's counts: [1, band indicators 1.., rows (grouped) per band, sampled rows, KV tokens, pairs,
    a lone sequence's KV tokens]."""
    rows = shape.prefill_tokens + shape.decode_seqs
    band = band_of(rows, row_bands)
    bands = len(row_bands) + 1
    indicator = [float(band == i) for i in range(1, bands)]      # band 0's start is the constant's
    per_band_rows = [float(grouped_rows(rows, band, row_groups)) * (band == i) for i in range(bands)]
    return [1.0, *indicator, *per_band_rows, float(shape.sampled_rows), float(shape.kv_tokens_read),
            float(shape.attention_pairs), float(lone_kv_tokens(shape))]


def fit_banded(points: list[tuple[StepShape, float]], row_bands: tuple[int, ...], fixed_s: float = 0.0,
               row_groups: tuple[int, ...] = ()) -> BandedCostModel:
    """The banded model closest to the measured (shape, seconds) points in relative error, every term >= 0;
    `fixed_s` is the measured time outside the model, split off the fitted constant."""
    X = np.array([features(s, row_bands, row_groups) for s, _ in points])   # (N, 2 x bands + 4)
    y = np.array([t for _, t in points])                                 # (N,)
    c = nonnegative_least_squares(X / y[:, None], np.ones_like(y))      # each equation divided by its time
    bands = len(row_bands) + 1
    constant, steps, rows = c[0], (0.0, *c[1:bands]), c[bands:2 * bands]
    head, kv, pairs, lone_kv = c[2 * bands:]
    fixed = min(fixed_s, constant)
    return BandedCostModel(float(fixed), float(constant - fixed), tuple(int(b) for b in row_bands),
                           tuple(map(float, steps)), tuple(map(float, rows)), float(head), float(kv), float(pairs),
                           tuple(int(g) for g in row_groups), float(lone_kv))


def fit_errors(model, points: list[tuple[StepShape, float]]) -> dict:
    """Relative errors |predicted - measured| / measured of a model on measured points."""
    rel = np.array([abs(model.step_time(s) - t) / t for s, t in points])
    return {"points": len(points), "median_rel_error": float(np.median(rel)),
            "p90_rel_error": float(np.percentile(rel, 90)), "max_rel_error": float(rel.max())}


def decode_table(model, points: list[tuple[StepShape, float]]) -> list[dict]:
    """Decode steps grouped by (batch, context): the median measured and modelled step and the error.
    A step's context is the tokens per sequence it reads, rounded down to the grid's (a multiple of 16)."""
    groups = defaultdict(list)
    for shape, seconds in points:
        if shape.prefill_tokens == 0 and shape.decode_seqs:
            context = shape.kv_tokens_read // shape.decode_seqs // 16 * 16
            groups[shape.decode_seqs, context].append((seconds, model.step_time(shape)))
    table = []
    for (batch, context), pairs in sorted(groups.items()):
        measured, modelled = (float(np.median([p[i] for p in pairs])) for i in (0, 1))
        table.append({"batch": batch, "context": context, "measured_s": measured, "model_s": modelled,
                      "error": modelled / measured - 1})
    return table


def prefill_table(model, points: list[tuple[StepShape, float]]) -> list[dict]:
    """Steps that prefill: their prompt tokens, measured and modelled seconds and the error."""
    return [{"prefill_tokens": s.prefill_tokens, "measured_s": t, "model_s": model.step_time(s),
             "error": model.step_time(s) / t - 1}
            for s, t in sorted(points, key=lambda p: p[0].prefill_tokens) if s.prefill_tokens]
