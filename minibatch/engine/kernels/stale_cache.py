"""Compiled code cached on disk, dropped when a file it was compiled from has changed.

Numba caches a compiled function (`cache=True`) and checks the cache against the function's own
source file only. A kernel that compiles other modules' functions into itself (`inline="always"`
helpers, the vector lanes, a whole layer's kernels) would otherwise keep running the old machine
code after one of those files is edited. `forget_stale(kernel, modules)` keeps a digest of the
modules' sources beside the kernel's cache and empties the cache when the digest differs.
"""
from __future__ import annotations

import hashlib
import pathlib


def digest(modules) -> str:
    """A digest of the modules' source files."""
    return hashlib.sha256(b"".join(pathlib.Path(m.__file__).read_bytes() for m in modules)).hexdigest()


def forget_stale(kernel, modules) -> None:
    """Drop `kernel`'s (a Numba dispatcher with cache=True) cached machine code if one of `modules`, the files it
    compiles into itself, changed since it was compiled."""
    name = f"{kernel.py_func.__module__.rsplit('.', 1)[-1]}.{kernel.__name__}"         # gemv_cpu._stream
    stamp = pathlib.Path(kernel._cache.cache_path) / f"{name}.callees.sha256"            # beside Numba's files
    now = digest(modules)
    try:
        if stamp.read_text() == now:
            return
    except OSError:                                                              # no stamp yet
        pass
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        kernel._cache.flush()                                                    # an empty index: compiled afresh
        stamp.write_text(now)
    except OSError:                                                              # a read-only cache: Numba copes
        pass
