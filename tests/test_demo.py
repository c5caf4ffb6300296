"""`python -m minibatch demo`: the workload, both runs on `tiny`, the side-by-side table, the check
that both schedulers produced the same tokens, and the command line."""

import pytest

from minibatch.__main__ import main
from minibatch.bench.demo import Comparison, compare, demo_workload, table, verdict
from minibatch.viz import slot_occupancy


def test_workload_lengths_are_seeded_and_bounded():
    workload = demo_workload(num_requests=40, mean_new_tokens=10, max_new_tokens=25, seed=3)
    lengths = [w.params.max_new_tokens for w in workload]
    assert len(workload) == 40 and min(lengths) >= 1 and max(lengths) <= 25 and len(set(lengths)) > 5
    assert all(w.arrival_s == 0.0 and w.params.ignore_eos and w.params.greedy for w in workload)
    assert lengths == [w.params.max_new_tokens for w in demo_workload(40, 10, 25, seed=3)]
    assert lengths != [w.params.max_new_tokens for w in demo_workload(40, 10, 25, seed=4)]


@pytest.fixture(scope="module")
def comparison():
    workload = demo_workload(num_requests=7, mean_new_tokens=6, max_new_tokens=12, seed=1)
    return compare(workload, model="tiny", max_batch_size=3, use_tqdm=False)


def test_both_runs_serve_the_whole_workload(comparison):
    lengths = [w.params.max_new_tokens for w in demo_workload(7, 6, 12, seed=1)]
    for name in ("static", "continuous"):
        report = comparison.reports[name]
        assert [r.num_output_tokens for r in report.requests] == lengths
        assert [len(tokens) for tokens in comparison.outputs[name]] == lengths
        assert report.max_batch_size == 3 and max(s.batch_size for s in report.steps) <= 3
    assert slot_occupancy(comparison.reports["static"])["held"] > 0        # the static run really was static
    assert slot_occupancy(comparison.reports["continuous"])["held"] == 0


def test_table_has_both_columns_and_every_metric(comparison):
    lines = table(comparison).splitlines()
    assert lines[0].split() == ["static", "continuous", "cont/static"]
    rows = {line[:18].strip(): line[18:].split() for line in lines[1:]}
    assert list(rows) == ["tokens/s", "requests/s", "p50 TTFT (ms)", "p99 TTFT (ms)", "mean TPOT (ms)",
                          "mean e2e (s)", "slot utilisation", "steps"]
    summaries = comparison.summaries()
    assert rows["steps"][:2] == [str(summaries["static"]["steps"]), str(summaries["continuous"]["steps"])]
    assert rows["slot utilisation"][0] == f"{summaries['static']['slot_utilisation']:.0%}"
    assert all(len(cells) == 3 for cells in rows.values())


def test_outputs_are_compared(comparison):
    assert comparison.identical and comparison.mismatches == []
    assert verdict(comparison).startswith("outputs identical: yes, all 7 requests")
    changed = {name: [list(t) for t in tokens] for name, tokens in comparison.outputs.items()}
    changed["continuous"][4][-1] += 1
    broken = Comparison(comparison.reports, changed, "tiny", 3)
    assert not broken.identical and broken.mismatches == [4]
    assert verdict(broken).startswith("outputs identical: NO, 1 of 7 requests differ (workload indices [4])")


def test_command_line(capsys):
    assert main(["demo", "--model", "tiny", "--requests", "4", "--batch-size", "2", "--max-tokens", "6"]) == 0
    out = capsys.readouterr().out
    assert "4 requests arriving at once on tiny, max_batch_size=2" in out
    assert "static  continuous" in out and "outputs identical: yes, all 4 requests" in out


def test_command_line_rejects_bad_numbers(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--requests", "0"])
    assert "argument --requests: '0' is not allowed: an integer >= 1" in capsys.readouterr().err
