"""The fixed cost per step against model size (minibatch.analysis.overhead): the forward-pass timer
leaves the engine's path and tokens unchanged, the split adds up, a model cut to its first layers
runs those layers, and the whole-depth arithmetic is what its docstring says."""
import pytest
from matplotlib.figure import Figure

from minibatch.analysis.claims import Rounds
from minibatch.analysis.overhead import (FIGURES, decode_split, forward_timed, full_depth, measure_by_size,
                                         shaped_engine, table)
from minibatch.config import SamplingParams
from minibatch.viz import fixed_cost_figure


def greedy(engine, prompt, new=6):
    request = engine.add_request(prompt, SamplingParams(max_new_tokens=new, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    return list(request.output_token_ids)


@pytest.fixture(scope="module")
def engines():
    return {"tiny": shaped_engine("tiny"), "tiny, 2 layers": shaped_engine("tiny", num_layers=2)}


def test_timer_changes_nothing_and_is_removed(engines):
    engine = engines["tiny"]
    plain = greedy(engine, [5, 6, 7, 8])
    head = engine.model.lm_head
    with forward_timed(engine) as times:
        timed = greedy(engine, [5, 6, 7, 8])
        assert engine.model.lm_head.nbytes() == head.nbytes()     # the product's own attributes still answer
    assert timed == plain
    assert len(times["forward"]) == len(times["head"]) == 6       # one prefill and five decode steps
    assert all(f >= h > 0 for f, h in zip(times["forward"], times["head"]))
    assert "forward" not in vars(engine.model) and engine.model.lm_head is head


def test_split_adds_up(engines):
    split = decode_split(engines["tiny"], batch_size=2, steps=3)
    assert set(split) == set(FIGURES)
    assert split["step"] >= split["forward"] >= split["head"] > 0
    assert split["fixed"] > 0


def test_first_layers(engines):
    cut = engines["tiny, 2 layers"]
    assert cut.model.num_layers == 2 and engines["tiny"].model.num_layers == 4
    assert cut.model.decode_weight_bytes() < engines["tiny"].model.decode_weight_bytes()
    with pytest.raises(ValueError, match="num_layers=9 is not allowed.*from 1 to its 4 layers"):
        shaped_engine("tiny", num_layers=9)


def test_full_depth_arithmetic():
    rounds = Rounds({"m fixed (ms)": [1.0] * 3, "m head (ms)": [2.0] * 3, "m forward (ms)": [10.0] * 3})
    whole = full_depth(rounds, "m", layers_run=2, layers_full=8)
    assert whole["per_layer"] == pytest.approx(4.0)               # (10 - 2) / 2
    assert whole["step"] == pytest.approx(1 + 2 + 4 * 8)
    assert whole["share"] == pytest.approx(1 / 35)


def test_rounds_table_and_figure(engines):
    with pytest.raises(ValueError, match="rounds=2"):
        measure_by_size(engines, rounds=2)
    rounds = measure_by_size(engines, rounds=3, steps=2)
    assert rounds.num_rounds == 3
    rows = table(engines, rounds)
    assert [r["layers"] for r in rows] == ["4/4", "2/4"]
    assert rows[1]["full_weight_mb"] == pytest.approx(rows[0]["weight_mb"])   # cut model scaled back to 4 layers
    assert all(0 < r["share"] < 1 for r in rows)
    assert isinstance(fixed_cost_figure(rows), Figure)
    with pytest.raises(ValueError, match="rows is not allowed"):
        fixed_cost_figure([{"label": "x"}])
