"""The shipped profile belongs to the engine code it measured, and a learner's own profile comes first.

The simulated clock is only as true as its calibration: `engine_fingerprint()` hashes the engine's
code (docstrings and comments left out), calibration stores it in the profile, and the first test
here fails when the engine changed since the shipped profile was measured.
"""
import json

import pytest

from minibatch import EngineConfig
from minibatch.tools.calibrate import SHIPPED, measured_points
from minibatch.sim.costmodel import cost_model, list_profiles, load_profile, own_profile_dir
from minibatch.sim.fingerprint import RECALIBRATE, engine_fingerprint, without_docstrings
from minibatch.sim.fit import decode_table
from minibatch.sim.stepcost import BandedCostModel


def test_shipped_profile_was_measured_on_this_engine_code():
    shipped = json.loads(SHIPPED.read_text())
    assert shipped.get("engine_fingerprint") == engine_fingerprint(), (
        f"the engine code changed since {SHIPPED.name} was measured (fingerprint "
        f"{shipped.get('engine_fingerprint')} in the profile, {engine_fingerprint()} now): the simulated clock "
        f"no longer times this engine. Recalibrate with `{RECALIBRATE}` (2 to 3 minutes on a quiet 2-core "
        f"laptop; run it with nothing else busy) and commit the rewritten {SHIPPED.name}")


def test_shipped_profile_says_what_it_measured_and_fits_every_batch_within_ten_percent():
    shipped = json.loads(SHIPPED.read_text())
    for field in ("processor", "cpus", "threads", "device", "dtype", "attention_backend", "quantization", "torch"):
        assert field in shipped["machine"], field
    assert shipped["date"] and shipped["model"] == "smollm2-135m"
    table = decode_table(cost_model(shipped), measured_points(shipped))
    assert {r["context"] for r in table} >= {64, 1024}
    assert {1, 2, 3, 4, 8, 16, 32, 64} <= {r["batch"] for r in table}
    worst = max(table, key=lambda r: abs(r["error"]))
    assert abs(worst["error"]) <= 0.10, f"the shipped fit misses {worst}: recalibrate with `{RECALIBRATE}`"


CODE = '''"""A module docstring."""
import math


class Step:
    """A class docstring."""

    def cost(self, rows):
        """A function docstring."""
        return math.sqrt(rows)  # a comment
'''


def fingerprint_of(tmp_path, source: str) -> str:
    (tmp_path / "kernels").mkdir(exist_ok=True)
    (tmp_path / "kernels" / "step.py").write_text(source)
    return engine_fingerprint(tmp_path)


def test_docstrings_and_comments_leave_the_fingerprint_and_code_changes_it(tmp_path):
    base = fingerprint_of(tmp_path, CODE)
    assert fingerprint_of(tmp_path, CODE.replace("A class docstring.", "Reworded, at length.")) == base
    assert fingerprint_of(tmp_path, CODE.replace("# a comment", "# another comment")) == base
    assert fingerprint_of(tmp_path, CODE.replace('    """A function docstring."""\n', "")) == base
    assert fingerprint_of(tmp_path, CODE.replace("math.sqrt(rows)", "math.sqrt(rows) + 1")) != base
    assert fingerprint_of(tmp_path, CODE.replace("rows", "tokens")) != base
    assert "docstring" not in without_docstrings(CODE)


def own_profile(description: str) -> dict:
    profile = load_profile(SHIPPED)
    return {**profile, "description": description,
            "coefficients": {**profile["coefficients"], "fixed_s": profile["coefficients"]["fixed_s"] + 1.0}}


def test_a_learners_own_profile_is_found_first(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIBATCH_CACHE", str(tmp_path))
    assert own_profile_dir() == tmp_path / "profiles"
    name = EngineConfig.sim_profile
    shipped = load_profile(name)
    assert shipped == json.loads(SHIPPED.read_text())                    # nobody calibrated: the shipped one
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / f"{name}.json").write_text(json.dumps(own_profile("MEASURED: my laptop")))
    assert load_profile(name)["description"] == "MEASURED: my laptop"
    assert list_profiles()[name] == "MEASURED: my laptop"
    mine, theirs = cost_model(name), cost_model(shipped)
    assert isinstance(mine, BandedCostModel) and mine.fixed_s == pytest.approx(theirs.fixed_s + 1.0)
    assert load_profile(SHIPPED)["description"] == shipped["description"]   # a path is always that file
