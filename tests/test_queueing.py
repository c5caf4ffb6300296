"""The load sweep and its queueing figures: Little's law on the engine's records, utilisation against
load, the measured capacity, the Pollaczek-Khinchine formula on known values, the figure and the
load slider."""
import math

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch import LLM, EngineConfig
from minibatch.analysis.metrics import RunReport
from minibatch.analysis.queueing import (LITTLE_TOLERANCE, LoadPoint, LoadSweep, littles_law, load_sweep,
                                         measure_capacity, pollaczek_khinchine_wait, time_average)
from minibatch.analysis.sla import SLA
from minibatch.engine.records import RequestMetrics
from minibatch.viz import load_sweep_figure
from minibatch.widgets import LoadSweepPanel
from minibatch.workloads import make_workload
from minibatch.workloads.distributions import Fixed

SHARES = (0.2, 0.5, 0.7, 1.1)


@pytest.fixture(scope="module")
def sim():
    return LLM(EngineConfig(model="tiny", max_batch_size=4, clock="simulated", sim_skip_model=True))


@pytest.fixture(scope="module")
def workload():
    return lambda n, arrival, seed: make_workload(n, arrival, output_len=Fixed(8), seed=seed)


@pytest.fixture(scope="module")
def sweep(sim, workload):
    return load_sweep(sim, workload, shares=SHARES, num_requests=200, use_tqdm=False)


def records(arrivals, e2es, queue_times=None) -> RunReport:
    queue_times = queue_times or [0.0] * len(arrivals)
    return RunReport([RequestMetrics(i, a, q, q, None, e, 4, 1, 0, "length")
                      for i, (a, e, q) in enumerate(zip(arrivals, e2es, queue_times))], [], max_batch_size=1)


# --- Little's law -----------------------------------------------------------------------------------

def test_time_average_counts_overlap_with_the_window():
    assert time_average([0.0, 1.0], [2.0, 3.0], 0.0, 4.0) == pytest.approx((2 + 2) / 4)
    assert time_average([0.0], [10.0], 2.0, 4.0) == 1.0         # covers the whole window
    assert time_average([5.0], [6.0], 0.0, 4.0) == 0.0          # outside it
    with pytest.raises(ValueError, match="window"):
        time_average([0.0], [1.0], 2.0, 2.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0.01, 50)), min_size=2, max_size=40))
def test_littles_law_gap_is_the_time_spent_after_the_window(requests):
    arrivals, e2es = [a for a, _ in requests], [e for _, e in requests]
    if max(arrivals) - min(arrivals) < 1e-3:
        arrivals[0] -= 1.0                                      # a window of some length
    little = littles_law(records(arrivals, e2es))
    end = max(arrivals)
    after = sum(max(0.0, a + e - end) for a, e in zip(arrivals, e2es)) / sum(e2es)
    assert little["L"] <= little["lambda_W"] * (1 + 1e-9)
    assert little["gap"] == pytest.approx(after, abs=1e-9)
    assert little["lambda_W"] == pytest.approx(len(arrivals) / (end - min(arrivals)) * np.mean(e2es))


def test_littles_law_holds_on_the_engines_records_below_capacity(sweep):
    for point in sweep.points:
        little = littles_law(point.report)
        assert little["L"] == pytest.approx(point.figures["mean_in_system"])
        if point.share <= 0.7:
            assert little["gap"] <= LITTLE_TOLERANCE, point.share
            assert little["gap"] <= 2 * little["steady_edge"], "a steady state leaks only its edge"
    past = sweep.points[-1].figures
    assert past["little_gap"] > sweep.points[0].figures["little_gap"], "past capacity there is no steady state"


def test_littles_law_needs_two_finished_requests():
    with pytest.raises(ValueError, match="at least 2"):
        littles_law(records([0.0], [1.0]))


# --- the sweep --------------------------------------------------------------------------------------

def test_capacity_is_measured_and_bounds_the_throughput(sim, workload, sweep):
    capacity = measure_capacity(sim, workload)
    assert capacity > 0 and sweep.capacity == pytest.approx(capacity)
    assert [p.rate for p in sweep.points] == pytest.approx([s * capacity for s in SHARES])
    assert max(sweep.column("throughput_req_s")) <= capacity * 1.02


def test_utilisation_rises_with_load_and_stays_below_the_busy_share(sweep):
    used, busy = sweep.column("utilisation"), sweep.column("busy")
    assert np.all(np.diff(used) > 0), used
    assert np.all(used <= busy + 1e-9) and np.all(busy <= 1 + 1e-9)
    assert used[-1] > 0.85, "past capacity every slot is busy"


def test_latency_and_queue_grow_past_capacity(sweep):
    p99 = sweep.column("p99_ttft_s")
    assert p99[-1] > 5 * p99[0]
    assert sweep.column("mean_queue_depth")[-1] > sweep.column("mean_queue_depth")[0]


def test_load_sweep_rejects_bad_arguments(sim, workload):
    with pytest.raises(ValueError, match="shares"):
        load_sweep(sim, workload, shares=(0.0, 0.5), capacity=1.0)
    with pytest.raises(ValueError, match="num_requests"):
        load_sweep(sim, workload, num_requests=1, capacity=1.0)
    with pytest.raises(ValueError, match="capacity"):
        load_sweep(sim, workload, capacity=0.0)


def synthetic_sweep(values: dict[str, list[float]], shares, capacity=2.0) -> LoadSweep:
    points = [LoadPoint(s, s * capacity, {k: v[i] for k, v in values.items()}, records([0.0, 1.0], [1.0, 1.0]))
              for i, s in enumerate(shares)]
    return LoadSweep(capacity, points, num_requests=2)


def test_crossing_interpolates_between_levels():
    sweep = synthetic_sweep({"p99_ttft_s": [1.0, 2.0, 6.0, 3.0]}, (0.2, 0.4, 0.6, 0.8))
    assert sweep.crossing("p99_ttft_s", 4.0) == pytest.approx(0.5)      # halfway from 2 to 6
    assert sweep.crossing("p99_ttft_s", 0.5) == 0.2
    assert sweep.crossing("p99_ttft_s", 10.0) is None
    assert sweep.nearest(0.67).share == 0.6
    with pytest.raises(KeyError, match="p99_ttft_s"):
        sweep.column("p98_ttft_s")


def test_agreement_is_the_longest_run_within_the_factor():
    shares = (0.2, 0.4, 0.6, 0.8, 0.9, 1.0)
    md1 = pollaczek_khinchine_wait(np.array(shares), 0.5)
    measured = [md1[0], 10 * md1[1], md1[2], 1.5 * md1[3], 0.6 * md1[4], 5.0]
    sweep = synthetic_sweep({"mean_queue_time_s": measured}, shares)
    assert sweep.agreement() == (0.6, 0.9)
    assert synthetic_sweep({"mean_queue_time_s": [9.0] * 6}, shares).agreement() is None


# --- the Pollaczek-Khinchine formula ------------------------------------------------------------------

def test_pollaczek_khinchine_on_known_values():
    assert pollaczek_khinchine_wait(0.5, 1.0, scv=1.0) == pytest.approx(1.0)   # M/M/1: rho / (mu - lambda)
    assert pollaczek_khinchine_wait(0.5, 1.0) == pytest.approx(0.5)            # M/D/1: half of it
    assert pollaczek_khinchine_wait(0.9, 2.0) == pytest.approx(0.9 * 2.0 / (2 * 0.1))
    assert pollaczek_khinchine_wait(0.0, 1.0) == 0.0
    assert math.isinf(pollaczek_khinchine_wait(1.0, 1.0)) and math.isinf(pollaczek_khinchine_wait(1.3, 1.0))


@given(st.floats(0.0, 0.99), st.floats(0.001, 100.0))
def test_pollaczek_khinchine_m_m_1_is_twice_m_d_1_and_grows_with_load(rho, service_s):
    md1, mm1 = pollaczek_khinchine_wait(rho, service_s), pollaczek_khinchine_wait(rho, service_s, scv=1.0)
    assert mm1 == pytest.approx(2 * md1)
    assert mm1 == pytest.approx(rho * service_s / (1 - rho))                  # M/M/1 in its usual form
    assert pollaczek_khinchine_wait(min(rho + 0.005, 0.995), service_s) >= md1


def test_pollaczek_khinchine_rejects_bad_input():
    for kwargs, field in (({"rho": 0.5, "mean_service_s": 0.0}, "mean_service_s"),
                          ({"rho": 0.5, "mean_service_s": 1.0, "scv": -1.0}, "scv"),
                          ({"rho": -0.1, "mean_service_s": 1.0}, "rho")):
        with pytest.raises(ValueError, match=field):
            pollaczek_khinchine_wait(**kwargs)


# --- the figure and the load slider -----------------------------------------------------------------

def test_figure_marks_the_chosen_load(sweep):
    fig = load_sweep_figure(sweep, at=0.5, sla=SLA(ttft_s=1.0, tpot_s=None))
    assert len(fig.axes) == 4
    assert any("M/D/1" in t.get_text() for t in fig.axes[1].get_legend().get_texts())


def test_load_slider_moves_the_marker_and_the_queue(sweep):
    panel = LoadSweepPanel(sweep, sla=SLA(ttft_s=1.0, tpot_s=None), share=0.2)
    assert panel.load_slider.description == "offered load / capacity"
    assert panel.point.share == 0.2 and panel.curves.value[:4] == b"\x89PNG"
    table, queue = panel.metrics.value, panel.queue.value
    panel.load_slider.value = 1.1
    assert panel.point is sweep.points[-1]
    assert panel.metrics.value != table and panel.queue.value != queue and panel.queue.value[:4] == b"\x89PNG"
    assert "p99 TTFT" in panel.metrics.value and ("met" in panel.metrics.value or "missed" in panel.metrics.value)
