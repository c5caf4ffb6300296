"""`python -m minibatch doctor`: every check reports its problem, with a fix, when the problem is provoked."""
import json
import os
import re
import socket
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest

from minibatch.analysis import course_memory
from minibatch.tools import doctor

Usage = namedtuple("Usage", "total used free")


def assert_problem(check, status, *words):
    assert check.status == status, check
    assert check.fix, f"{check.name} reports {status} without a fix"
    for word in words:
        assert word in check.detail + " " + check.fix, (word, check)


def test_old_python_fails_with_how_to_install():
    assert_problem(doctor.check_python((3, 10, 12)), "fail", "3.10.12", "3.11", "make clean")
    assert doctor.check_python((3, 11, 0)).status == "ok"
    assert doctor.check_python((3, 13, 1)).status == "ok"


def test_missing_model_cache_fails_with_the_prepare_command(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIBATCH_CACHE", str(tmp_path))
    assert_problem(doctor.check_model_cache(), "fail", str(tmp_path), "python -m minibatch prepare", "make lab")


def test_busy_port_warns_and_names_another():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert_problem(doctor.check_port(port), "warn", str(port), f"--port {port + 1}")
    assert doctor.check_port(port).status == "ok"  # free again once the socket is closed


def test_missing_chromium_only_warns(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert_problem(doctor.check_chromium(), "warn", "optional", "apt-get install chromium")


def test_memory_is_judged_by_the_measured_chapter_peaks(monkeypatch):
    chapter, peak = course_memory.largest()
    roomy = peak + course_memory.DESKTOP_GIB + 0.5
    monkeypatch.setattr(doctor, "memory_gib", lambda: (roomy, roomy - 0.25))   # every chapter fits ...
    check = doctor.check_memory()
    assert check.status == "ok" and chapter in check.detail, check
    assert "leave off" not in check.detail                                       # no setting needs more
    monkeypatch.setattr(doctor, "memory_gib", lambda: (peak - 0.2, peak - 1))
    need = f"at least {peak + course_memory.DESKTOP_GIB:.0f} GB"
    assert_problem(doctor.check_memory(), "fail", chapter, need, "doctor --memory")
    monkeypatch.setattr(doctor, "memory_gib", lambda: (peak + 0.5, peak))
    assert_problem(doctor.check_memory(), "warn", "one notebook open at a time")
    monkeypatch.setattr(doctor, "memory_gib", lambda: (32.0, 2.0))
    assert_problem(doctor.check_memory(), "warn", "close other programs")
    monkeypatch.setattr(doctor, "memory_gib", lambda: (32.0, 20.0))
    assert doctor.check_memory().status == "ok" and "leave off" not in doctor.check_memory().detail


def test_every_chapter_has_a_measured_memory_peak():
    notebooks = (Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb")
    chapters = {re.sub(r"^\d+_", "", p.stem) for p in notebooks}   # the table names chapters without numbers
    assert set(course_memory.PEAK_GIB) == chapters
    peaks = [peak for peak in course_memory.PEAK_GIB.values() if peak is not None]   # None: a chapter in the writing
    assert len(peaks) >= len(chapters) - 1 and all(0.2 < peak < 8 for peak in peaks), course_memory.PEAK_GIB
    table = course_memory.table().splitlines()
    assert len(table) == 1 + len(chapters) + len(course_memory.OPTIONAL_PEAK_GIB)
    assert any(line.startswith(course_memory.largest()[0]) for line in table)


def test_small_disk_and_thread_oversubscription_are_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(doctor.shutil, "disk_usage",
                        lambda path: Usage(100 * doctor.GIB, 99.5 * doctor.GIB, 0.5 * doctor.GIB))
    assert_problem(doctor.check_disk(str(tmp_path / "not" / "yet")), "fail", "MINIBATCH_CACHE")
    import torch
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4 * (os.cpu_count() or 1))
    assert_problem(doctor.check_cpu(), "warn", "OMP_NUM_THREADS")


@pytest.mark.parametrize("native", [True, False])
def test_bfloat16_says_whether_the_cpu_has_it(monkeypatch, native):
    import torch
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: native)
    check = doctor.check_bfloat16()
    assert check.status == "ok" and ("natively" in check.detail) == native
    assert native or "keep the default float32" in check.detail


def test_summary_line_counts_every_check_and_names_the_machine():
    checks = [doctor.Check("a", "ok", ""), doctor.Check("b", "warn", "", "fix"),
              doctor.Check("model", "fail", "", "fix")]
    line = doctor.summary_line(checks)
    pattern = (r"doctor: 1 ok, 1 warn, 1 fail \| py\d+\.\d+\.\d+ \| \d+ cores \| \d+ GiB \| "
               r"torch \S+ \S+ \| model fail")
    assert re.fullmatch(pattern, line), line


@pytest.mark.slow
@pytest.mark.smollm2  # its model-cache check fails (and so the command) until the default model is converted
def test_quick_doctor_runs_clean_in_a_subprocess():
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.run([sys.executable, "-m", "minibatch", "doctor", "--quick", "--json"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    names = {c["name"]: c["status"] for c in report["checks"]}
    assert "jupyter kernel" not in names and names["model"] == "ok"
    assert all(c["fix"] for c in report["checks"] if c["status"] != "ok")
    assert report["summary"].startswith(f"doctor: {sum(s == 'ok' for s in names.values())} ok")
    assert report["summary"].endswith("model tiny ok")
