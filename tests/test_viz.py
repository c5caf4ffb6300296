"""Figures of latency and load: each draws exactly what the records hold, and bad arguments are named."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
from hypothesis import given, strategies as st

from minibatch import LLM, EngineConfig
from minibatch.workloads.distributions import Poisson, Uniform
from minibatch.viz import (budget_tradeoff, decode_token_waits, latency_cdf, load_over_time, pareto_rows, sla_map,
                           step_durations, step_series, step_time_vs_tokens, step_tokens, throughput_latency)
from minibatch.viz.phases import PREFILL_COLOUR
from minibatch.workloads import make_workload


def simulated_run(num_kv_blocks=None, max_batch_size=4, n=12, rate=8.0):
    config = EngineConfig(model="tiny", clock="simulated", sim_skip_model=True, max_batch_size=max_batch_size,
                          num_kv_blocks=num_kv_blocks)
    return LLM(config).run(make_workload(n, arrival=Poisson(rate), output_len=Uniform(4, 24), seed=3),
                           use_tqdm=False)


@pytest.fixture(scope="module")
def report():
    return simulated_run()


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_latency_cdf_draws_every_request_once_per_metric(report):
    fig = latency_cdf(report, metrics=("ttft", "e2e"))
    assert len(fig.axes) == 2
    for ax, metric in zip(fig.axes, ("ttft", "e2e")):
        line = ax.lines[0]
        expected = np.sort([getattr(r, metric) for r in report.requests])
        np.testing.assert_allclose(line.get_xdata(), expected)
        np.testing.assert_allclose(line.get_ydata(), np.arange(1, len(expected) + 1) / len(expected))


def test_latency_cdf_compares_runs_with_a_legend(report):
    other = simulated_run(max_batch_size=1)
    fig = latency_cdf({"batch 4": report, "batch 1": other}, metrics=("ttft",))
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["batch 4", "batch 1"]
    # a batch of one queues more: its CDF of TTFT lies to the right
    assert np.median(fig.axes[0].lines[1].get_xdata()) > np.median(fig.axes[0].lines[0].get_xdata())


@pytest.mark.parametrize("bad, error", [({"metrics": ("ttft", "speed")}, "metrics=('ttft', 'speed')"),
                                        ({"metrics": ()}, "metrics=()")])
def test_latency_cdf_names_bad_metrics(report, bad, error):
    with pytest.raises(ValueError, match=error.replace("(", r"\(").replace(")", r"\)")):
        latency_cdf(report, **bad)


def test_latency_cdf_rejects_what_is_not_a_report():
    with pytest.raises(TypeError, match="reports="):
        latency_cdf([1, 2, 3])


rows_strategy = st.lists(st.fixed_dictionaries({"lat": st.floats(0.01, 100), "thr": st.floats(0, 1000)}),
                         min_size=1, max_size=30)


@given(rows_strategy)
def test_pareto_rows_are_exactly_the_undominated_rows(rows):
    front = pareto_rows(rows, latency="lat", throughput="thr")

    def dominated(r):
        return any(o["lat"] <= r["lat"] and o["thr"] >= r["thr"] and (o["lat"], o["thr"]) != (r["lat"], r["thr"])
                   for o in rows)

    assert {(r["lat"], r["thr"]) for r in front} == {(r["lat"], r["thr"]) for r in rows if not dominated(r)}
    assert [r["lat"] for r in front] == sorted(r["lat"] for r in front)
    assert all(a["thr"] < b["thr"] for a, b in zip(front, front[1:])), "slower points on the front carry more"


def test_throughput_latency_joins_series_and_draws_the_front():
    rows = [{"max_batch_size": b, "batch_timeout_s": t, "p99_e2e_s": 1.0 + b / 8 + t, "throughput_tok_s": 10 * b - 5 * t}
            for b in (1, 2, 4, 8) for t in (0.0, 0.5)]
    fig = throughput_latency(rows, series="batch_timeout_s", along="max_batch_size")
    ax = fig.axes[0]
    curves = [line for line in ax.lines if line.get_label().startswith("batch_timeout_s=")]
    assert len(curves) == 2
    np.testing.assert_allclose(curves[0].get_xdata(), [1.125, 1.25, 1.5, 2.0])
    assert {t.get_text() for t in ax.texts} == {"1", "2", "4", "8"}
    front = [line for line in ax.lines if line.get_label() == "Pareto front"][0]
    np.testing.assert_allclose(front.get_ydata(), [r["throughput_tok_s"] for r in pareto_rows(rows)])


def test_throughput_latency_names_a_missing_field():
    with pytest.raises(KeyError, match="no field 'p99_ttft_s'"):
        throughput_latency([{"p99_e2e_s": 1.0, "throughput_tok_s": 2.0}], latency="p99_ttft_s")


def test_sla_map_puts_each_row_at_its_tails():
    rows = [{"x": 0.5, "y": 0.05, "goodput_req_s": 2.0}, {"x": 3.0, "y": 0.2, "goodput_req_s": 0.5}]
    fig = sla_map(rows, "x", "y", x_limit=1.0, y_limit=0.1)
    points = fig.axes[0].collections[0].get_offsets()
    np.testing.assert_allclose(points, [[0.5, 0.05], [3.0, 0.2]])


def test_step_series_reads_the_step_records(report):
    series = step_series(report)
    steps = report.steps
    np.testing.assert_allclose(series["time"], [s.start - report.start_time for s in steps])
    assert series["batch_size"].tolist() == [s.batch_size for s in steps]
    assert series["queue_depth"].tolist() == [s.queue_depth for s in steps]
    np.testing.assert_allclose(series["kv_usage"], [s.kv_blocks_used / s.kv_blocks_total for s in steps])


def test_load_over_time_draws_the_chosen_panels(report):
    fig = load_over_time(report)
    assert len(fig.axes) == 3
    np.testing.assert_allclose(fig.axes[0].lines[0].get_ydata(), [s.batch_size for s in report.steps])
    fig = load_over_time(report, panels=("queue_depth",))
    assert len(fig.axes) == 1 and fig.axes[0].get_ylabel() == "queue depth"
    with pytest.raises(ValueError, match="panels=\\('kv',\\)"):
        load_over_time(report, panels=("kv",))


def test_load_over_time_marks_preemptions():
    starved = simulated_run(num_kv_blocks=6, max_batch_size=4, n=10, rate=50.0)   # too few blocks: preemptions
    preempting = [s for s in starved.steps if s.num_preempted]
    assert preempting, "the starved run must preempt"
    kv_axis = load_over_time(starved).axes[2]
    marks = [line for line in kv_axis.lines if line.get_label() == "preemption"][0]
    assert len(marks.get_xdata()) == len(preempting)


def test_step_time_vs_tokens_plots_each_step():
    report = simulated_run()
    prefill = [s for s in report.steps if s.num_prefill_tokens][:4]
    decode = [s for s in report.steps if not s.num_prefill_tokens][:4]
    fig = step_time_vs_tokens({"prefill": prefill, "decode": decode})
    left, right = fig.axes
    tokens = sorted(step_tokens(s) for s in prefill)
    np.testing.assert_allclose(left.lines[0].get_xdata(), tokens)
    slowest = max(prefill, key=lambda s: (step_tokens(s), s.duration))
    assert 1e3 * slowest.duration in left.lines[0].get_ydata()
    np.testing.assert_allclose(right.lines[1].get_ydata(),
                               [step_tokens(s) / s.duration for s in sorted(decode, key=step_tokens)])
    with pytest.raises(ValueError, match="groups"):
        step_time_vs_tokens({"empty": []})


def test_step_durations_draws_a_bar_per_step_coloured_by_phase(report):
    fig = step_durations({"a": report, "b": simulated_run(max_batch_size=1)})
    bars = fig.axes[0].patches
    assert len(bars) == len(report.steps)
    for bar, step in zip(bars, report.steps):
        assert bar.get_height() == pytest.approx(1e3 * step.duration)
        assert bar.get_x() == pytest.approx(step.start - report.start_time)
        assert (bar.get_facecolor() == matplotlib.colors.to_rgba(PREFILL_COLOUR)) == (step.num_prefill_tokens > 0)


def test_decode_token_waits_is_one_entry_per_decode_token(report):
    waits = decode_token_waits(report)
    assert len(waits) == sum(s.num_decode_tokens for s in report.steps)
    assert sorted(set(waits.tolist())) == sorted({s.duration for s in report.steps if s.num_decode_tokens})


def test_budget_tradeoff_orders_runs_by_budget():
    rows = [{"max_tokens_per_step": b, "p99_ttft_s": 10 / b, "p99_decode_wait_s": b / 100} for b in (512, 32, 128)]
    ax = budget_tradeoff(rows).axes[0]
    np.testing.assert_allclose(ax.lines[0].get_xdata(), [10 / 32, 10 / 128, 10 / 512])
    assert [t.get_text() for t in ax.texts] == ["32", "128", "512"]
    with pytest.raises(KeyError, match="p99_decode_wait_s"):
        budget_tradeoff([{"max_tokens_per_step": 1, "p99_ttft_s": 1.0}])
