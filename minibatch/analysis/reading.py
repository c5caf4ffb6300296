"""What a reader opens to follow one step: the package's files a call enters, and their lengths.

`files_entered(fn)` runs fn under `sys.settrace` and returns, for every file of `minibatch/` in which a
Python function ran, its number of lines: the files a learner following that call from the first line to
the last would have to read. Compiled kernels count as the files that define them (their Python source);
torch's and Numba's own code is not counted. The course uses it to compare the reference path's decode
step with the fast path's (tests/test_paths_reading.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent


def files_entered(fn) -> dict[str, int]:
    """{path relative to the package's parent: lines in the file} for each package file fn's call entered."""
    entered: set[str] = set()

    def tracer(frame, event, arg):
        if event == "call":
            entered.add(frame.f_code.co_filename)
        return None                                    # no line events: calls are all we need

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(previous)
    files = {}
    for name in entered:
        path = Path(name)
        if path.suffix == ".py" and path.is_file() and PACKAGE in path.resolve().parents:
            files[str(path.resolve().relative_to(PACKAGE.parent))] = len(path.read_text().splitlines())
    return dict(sorted(files.items()))


def summary(files: dict[str, int]) -> str:
    """'N files, L lines' for a `files_entered` result."""
    return f"{len(files)} files, {sum(files.values())} lines"
