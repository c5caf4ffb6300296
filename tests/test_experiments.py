"""The bench's experiments: each one imports, answers --help, and refuses a bad count naming the flag."""
import importlib

import pytest

EXPERIMENTS = {"products": ["paths", "formats", "rates"], "layers": ["steps", "parts", "compile"], "attention": [],
               "threads": []}


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
    (["layers", "parts", "--reps", "0"], "--reps"),
    (["layers", "steps", "--batch-sizes", "1", "-2"], "--batch-sizes"),
    (["attention", "--decode", "8by48"], "--decode"),
    (["threads", "--rounds", "0"], "--rounds"),
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
