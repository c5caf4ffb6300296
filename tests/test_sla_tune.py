"""SLA, goodput and the tuner: limits at a percentile, requests that were good enough, the search."""
import itertools
from dataclasses import replace

import pytest

from minibatch import LLM, ConfigError, EngineConfig
from minibatch.analysis.metrics import RunReport
from minibatch.engine.records import RequestMetrics
from minibatch.analysis.sla import SLA, evaluate, goodput
from minibatch.tools.tune import KNOBS, _rank, tune
from minibatch.workloads import ClosedLoop, Poisson, Uniform, make_workload

BASE = EngineConfig(model="tiny", sim_profile="reference-cpu")   # a fixed machine: holds after any recalibration
SPACE = {"max_batch_size": (1, 2, 4, 8, 16), "batch_timeout_s": (0.0, 0.2, 1.0), "max_tokens_per_step": (32, 512)}


def metrics(i, ttft, tpot, e2e, arrival=0.0):
    return RequestMetrics(i, arrival, 0.0, ttft, tpot, e2e, 10, 5, 0, None if e2e is None else "length")


def test_sla_fields_are_checked():
    for kwargs, field in [(dict(ttft_s=0), "SLA.ttft_s=0"), (dict(tpot_s=-1.0), "SLA.tpot_s=-1.0"),
                          (dict(percentile=0), "SLA.percentile=0"), (dict(percentile=101), "SLA.percentile=101"),
                          (dict(ttft_s=None, tpot_s=None), "every limit None")]:
        with pytest.raises(ConfigError, match=field):
            SLA(**kwargs)


def test_request_ok_and_goodput():
    sla = SLA(ttft_s=1.0, tpot_s=0.1)
    requests = [metrics(0, 0.5, 0.05, 2.0), metrics(1, 1.5, 0.05, 4.0),       # good; TTFT too slow
                metrics(2, 0.5, 0.20, 8.0), metrics(3, 0.9, None, 0.9),       # TPOT too slow; one token: no TPOT
                metrics(4, None, None, None)]                                 # never finished
    assert [sla.request_ok(r) for r in requests] == [True, False, False, True, False]
    report = RunReport(requests, [], max_batch_size=4)
    assert report.duration == 8.0
    assert goodput(report, sla) == pytest.approx(2 / 8.0)
    assert not sla.met_by(report)                                             # an unfinished request


def test_percentile_decides_whether_the_sla_is_met():
    report = RunReport([metrics(i, ttft=i / 100, tpot=0.01, e2e=1.0 + i / 100) for i in range(100)], [], 4)
    assert SLA(ttft_s=0.95, tpot_s=None, percentile=90).met_by(report)       # p90 TTFT = 0.891 s
    assert not SLA(ttft_s=0.95, tpot_s=None, percentile=99).met_by(report)   # p99 TTFT = 0.980 s
    result = evaluate(report, SLA(ttft_s=0.95, tpot_s=0.05, percentile=99))
    assert result["sla_p99_ttft_s"] == pytest.approx(0.9801) and result["sla_attainment"] == 0.96
    assert result["sla_met"] is False and result["requests"] == 100


def run_grid(workload, sla, space):
    """Every configuration of the space on the full workload: {knobs: rank}, the exhaustive answer."""
    sim = replace(BASE, clock="simulated", sim_skip_model=True)
    ranks = {}
    for values in itertools.product(*(space[k] for k in KNOBS)):
        knobs = dict(zip(KNOBS, values))
        ranks[values] = _rank(evaluate(LLM(replace(sim, **knobs)).run(workload, use_tqdm=False), sla), sla, knobs)
    return ranks


@pytest.mark.parametrize("rate", [2.0, 40.0])
def test_tuner_finds_the_grid_s_best_with_fewer_full_runs(rate):
    workload = make_workload(48, Poisson(rate), output_len=Uniform(4, 24), seed=rate > 10)
    sla = SLA(ttft_s=1.5, tpot_s=0.25)
    result = tune(workload, sla, base=BASE, space=SPACE, use_tqdm=False)
    grid = run_grid(workload, sla, SPACE)
    full = [t for t in result.trials if t.num_requests == len(workload)]
    assert len(full) < len(grid)                                  # cheaper than the grid...
    assert result.best.rank == max(grid.values())                 # ...and just as good
    assert result.best.rank == max(t.rank for t in full)
    assert result.best_config == replace(BASE, **result.best.knobs) and result.best_config.clock == "real"


def test_the_best_batch_grows_with_load():
    sla = SLA(ttft_s=1.5, tpot_s=0.25)
    best = {rate: tune(make_workload(48, Poisson(rate), output_len=Uniform(4, 24), seed=0), sla, base=BASE,
                       space=SPACE, use_tqdm=False).best.knobs["max_batch_size"] for rate in (0.5, 40.0)}
    assert best[40.0] > best[0.5]


def test_pareto_front_holds_exactly_the_undominated_trials():
    workload = make_workload(40, Poisson(20.0), output_len=Uniform(4, 24), seed=2)
    result = tune(workload, SLA(ttft_s=1.0, tpot_s=0.2), base=BASE, space=SPACE, use_tqdm=False)
    key = result.latency_key
    point = lambda t: (t.result["throughput_tok_s"], t.result[key])
    beats = lambda a, b: point(a) != point(b) and point(a)[0] >= point(b)[0] and point(a)[1] <= point(b)[1]
    full = [t for t in result.trials if t.num_requests == len(workload)]
    assert result.pareto and all(not any(beats(o, t) for o in full) for t in result.pareto)
    assert all(any(beats(f, t) for f in result.pareto) for t in full if point(t) not in map(point, result.pareto))
    assert len(set(map(point, result.pareto))) == len(result.pareto)        # one trial per point: the best ranked
    assert all(t.rank >= o.rank for t in result.pareto for o in full if point(o) == point(t))
    assert [point(t)[1] for t in result.pareto] == sorted(point(t)[1] for t in result.pareto)
    assert len(result.table()) == len(full)


def test_tuner_serves_a_closed_loop_and_checks_its_space():
    workload = make_workload(24, output_len=Uniform(4, 12), seed=0)
    small = {"max_batch_size": (1, 4), "batch_timeout_s": (0.0,), "max_tokens_per_step": (512,)}
    result = tune(workload, SLA(ttft_s=2.0, tpot_s=None), base=BASE, space=small, closed_loop=ClosedLoop(users=4),
                  use_tqdm=False)
    assert result.best.knobs["max_batch_size"] == 4                # with one slot, three of four users queue
    with pytest.raises(ConfigError, match="space="):
        tune(workload, SLA(), base=BASE, space={"max_batch_size": (1, 2)}, use_tqdm=False)
