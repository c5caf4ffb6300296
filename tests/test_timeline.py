"""The batch-slot timeline: bars merged from per-step slot records, occupancy counts, the figure,
and the step scrubber; on hand-made records with known answers and on real runs of `tiny`."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from minibatch import LLM, EngineConfig, SamplingParams, WorkloadRequest  # noqa: E402
from minibatch.analysis.metrics import RunReport  # noqa: E402
from minibatch.engine.records import StepRecord
from minibatch.viz import SlotChange, SlotRun, slot_changes, slot_occupancy, slot_runs, slot_timeline  # noqa: E402
from minibatch.widgets import TimelineScrubber  # noqa: E402


def step(index, slots, start, end, queue_depth=0):
    computing = sum(phase != "held" for _, phase in slots.values())
    return StepRecord(step=index, start=start, end=end, batch_size=computing, num_prefill_tokens=0,
                      num_decode_tokens=computing, queue_depth=queue_depth, kv_blocks_used=0, kv_blocks_total=8,
                      idle_slots=2 - computing, num_preempted=0, slots=slots)


@pytest.fixture
def handmade():
    """Two slots, four steps: request 1 finishes early and holds its slot; slot 1 idles at the end."""
    steps = [step(0, {0: (0, "prefill"), 1: (1, "prefill")}, 10.0, 10.5, queue_depth=1),
             step(1, {0: (0, "decode"), 1: (1, "decode")}, 10.5, 10.6, queue_depth=1),
             step(2, {0: (0, "decode"), 1: (1, "held")}, 10.6, 10.7, queue_depth=1),
             step(3, {0: (2, "prefill")}, 11.0, 11.4)]
    return RunReport(requests=[], steps=steps, max_batch_size=2, start_time=9.0)


def test_runs_merge_consecutive_steps(handmade):
    assert slot_runs(handmade) == [
        SlotRun(0, 0, "prefill", 0, 1), SlotRun(0, 0, "decode", 1, 3), SlotRun(0, 2, "prefill", 3, 4),
        SlotRun(1, 1, "prefill", 0, 1), SlotRun(1, 1, "decode", 1, 2), SlotRun(1, 1, "held", 2, 3)]


def test_runs_in_seconds_and_up_to_a_step(handmade):
    runs = slot_runs(handmade, x="time")
    assert [(r.request_id, r.phase) for r in runs][:3] == [(0, "prefill"), (0, "decode"), (2, "prefill")]
    assert [x for r in runs[:3] for x in (r.x0, r.x1)] == pytest.approx([1.0, 1.5, 1.5, 1.7, 2.0, 2.4])
    assert slot_runs(handmade, upto=2) == [SlotRun(0, 0, "prefill", 0, 1), SlotRun(0, 0, "decode", 1, 2),
                                           SlotRun(1, 1, "prefill", 0, 1), SlotRun(1, 1, "decode", 1, 2)]
    with pytest.raises(ValueError, match="x='seconds' is not allowed"):
        slot_runs(handmade, x="seconds")


def test_occupancy_counts_every_slot_step(handmade):
    assert slot_occupancy(handmade) == {"prefill": 3, "decode": 3, "held": 1, "idle": 1}


def test_changes_are_the_joins_and_leaves(handmade):
    assert slot_changes(handmade) == [SlotChange(0, 0, None, 0), SlotChange(0, 1, None, 1),
                                      SlotChange(3, 0, 0, 2), SlotChange(3, 1, 1, None)]


def bars(fig):
    return [p for p in fig.axes[0].patches if isinstance(p, Rectangle)]


def test_figure_draws_one_bar_per_run(handmade):
    fig = slot_timeline(handmade)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert len(bars(fig)) == 6 and ax.get_xlim() == (0, 4)
    held = [p for p in bars(fig) if p.get_hatch() == "xx"]
    assert len(held) == 1 and held[0].get_x() == 2 and held[0].get_alpha() < 1
    assert "held 12%" in ax.get_title() and "idle 12%" in ax.get_title()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["prefill", "decode", "held (finished)", "idle"]
    partial = slot_timeline(handmade, x="time", upto=2).axes[0]
    assert len(bars(partial.figure)) == 4 and partial.get_xlim() == pytest.approx((0, 2.4))
    assert [line.get_xdata()[0] for line in partial.lines] == pytest.approx([1.6])  # the cursor


WORKLOAD = [WorkloadRequest(0.0, [5 + i, 6, 7], SamplingParams(max_new_tokens=n, ignore_eos=True))
            for i, n in enumerate([2, 9, 4, 3, 8, 1])]


@pytest.fixture(scope="module")
def reports():
    return {name: LLM(EngineConfig(model="tiny", scheduler=name, max_batch_size=3)).run(WORKLOAD, use_tqdm=False)
            for name in ("static", "continuous")}


def test_real_runs_account_for_every_token(reports):
    for name, report in reports.items():
        lengths = {r.request_id: r.num_output_tokens for r in report.requests}
        runs = slot_runs(report)
        for rid, n in lengths.items():
            mine = [r for r in runs if r.request_id == rid]
            assert len({r.slot for r in mine}) == 1, f"{name}: request {rid} moved slots"
            width = {phase: sum(r.x1 - r.x0 for r in mine if r.phase == phase) for phase in ("prefill", "decode")}
            assert width == {"prefill": 1, "decode": n - 1}, f"{name}: request {rid}"
        counts = slot_occupancy(report)
        assert sum(counts.values()) == 3 * len(report.steps)
        assert counts["prefill"] + counts["decode"] == sum(s.batch_size for s in report.steps)


def test_static_holds_slots_and_continuous_does_not(reports):
    static, continuous = (slot_occupancy(reports[n]) for n in ("static", "continuous"))
    # batches [2, 9, 4] and [3, 8, 1]: each member holds its slot until the longest (9, then 8) is done
    assert static["held"] == (9 - 2) + (9 - 4) + (8 - 3) + (8 - 1)
    assert continuous["held"] == 0
    static_joins = {c.step for c in slot_changes(reports["static"]) if c.joined is not None}
    assert static_joins == {0, 9}                          # a whole batch joins at once, nobody in between
    assert len({c.step for c in slot_changes(reports["continuous"]) if c.joined is not None}) > 2
    assert len(reports["continuous"].steps) < len(reports["static"].steps) == 9 + 8


def test_scrubber_redraws_up_to_the_chosen_step(reports):
    panel = TimelineScrubber(reports)
    assert panel.run.value == "static" and panel.step.value == panel.step.max == 17
    assert panel.image.value[:4] == b"\x89PNG" and panel.caption.value.startswith("step 16:")
    panel.step.value = 3
    assert len(panel.figure.axes[0].lines) == 1           # the cursor at step 3
    assert panel.caption.value.startswith("step 2: 2 sequences computing (0 prefill, 2 decode; 2 tokens), 1 slot held")
    panel.run.value = "continuous"
    assert panel.step.max == panel.step.value == len(reports["continuous"].steps)
    assert not any(p.get_hatch() == "xx" for p in bars(panel.figure))
    panel.axis.value = "time"
    assert panel.figure.axes[0].get_xlabel() == "time since start (s)"
