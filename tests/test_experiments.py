"""The bench's experiments: each one imports, answers --help, and refuses a bad count naming the flag."""
import importlib

import pytest

EXPERIMENTS = {"products": ["paths", "formats", "rates", "blocks"], "layers": ["steps", "parts", "compile"],
               "attention": [], "threads": [], "instructions": [], "phases": []}


@pytest.mark.parametrize("name, sub", [(n, s) for n, subs in EXPERIMENTS.items() for s in [None, *subs]])
def test_an_experiment_answers_help(name, sub, capsys):
    module = importlib.import_module(f"minibatch.bench.experiments.{name}")
    with pytest.raises(SystemExit) as exit_:
        module.main(([sub] if sub else []) + ["--help"])
    assert exit_.value.code == 0
    assert f"python -m minibatch.bench.experiments.{name}" in capsys.readouterr().out


@pytest.mark.parametrize("argv, flag", [
    (["products", "paths", "--rows", "0"], "--rows"),
    (["products", "rates", "--columns", "0"], "--columns"),
    (["products", "blocks", "--reps", "0"], "--reps"),
    (["layers", "parts", "--reps", "0"], "--reps"),
    (["layers", "steps", "--batch-sizes", "1", "-2"], "--batch-sizes"),
    (["attention", "--decode", "8by48"], "--decode"),
    (["threads", "--rounds", "0"], "--rounds"),
    (["instructions", "--seconds", "0"], "--seconds"),
    (["phases", "--batch-sizes", "8", "0"], "--batch-sizes"),
])
def test_an_experiment_refuses_a_bad_count(argv, flag, capsys):
    module = importlib.import_module(f"minibatch.bench.experiments.{argv[0]}")
    with pytest.raises(SystemExit) as exit_:
        module.main(argv[1:])
    assert exit_.value.code == 2
    assert flag in capsys.readouterr().err


def test_interleaved_runs_every_arm_each_round():
    from minibatch.bench.experiments import interleaved
    calls = []
    medians = interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, reps=3)
    assert calls == ["a", "b"] * 4                      # one warm-up call each, then three rounds in turn
    assert set(medians) == {"a", "b"} and all(ms >= 0 for ms in medians.values())
    with pytest.raises(ValueError, match="reps=0"):
        interleaved({"a": lambda: None}, reps=0)


def test_the_tiles_multiply_as_numpy_does():
    """The timed AMX loop's product (the weight laid out as the tiles read it) equals numpy's, up to the order of
    the additions, so the rate it prints is a product's."""
    import numpy as np

    from minibatch.bench.experiments import instructions
    if not instructions.TILES:
        pytest.skip("no AMX bfloat16 tiles on this CPU")
    rng = np.random.default_rng(1)
    x, weight = (instructions.bfloat16_bits(rng.standard_normal((32, 96))) for _ in range(2))
    reference = instructions.widened(x) @ instructions.widened(weight).T            # (32, 32)
    np.testing.assert_allclose(instructions.tiles_product(x, weight), reference, rtol=1e-5, atol=1e-4)
    assert not np.allclose(instructions.tiles_product(x, weight[::-1].copy()), reference, atol=1e-2)   # rows matter


def test_phases_splits_a_run_into_its_prefill_and_decode_steps():
    from types import SimpleNamespace as Step

    from minibatch.bench.experiments.phases import by_rows, split
    steps = [Step(num_prefill_tokens=p, num_decode_tokens=d, duration=ms / 1e3) for p, d, ms in
             [(512, 0, 400), (40, 7, 80), (0, 8, 28), (0, 6, 30), (0, 1, 20), (0, 40, 60)]]
    parts = split(steps)
    assert [s.num_prefill_tokens for s in parts["prefill"]] == [512, 40]     # a step with prompt rows counts there
    assert [s.num_decode_tokens for s in parts["decode"]] == [8, 6, 1, 40]
    assert by_rows(parts["decode"]) == "1: 20.0, 2-8: 29.0, 33+: 60.0"     # medians by band; empty bands left out
