"""A fingerprint of the engine code a profile was measured on, so a kernel change comes with a recalibration.

A measured profile is true of the code that ran when it was measured. `engine_fingerprint()` hashes
the source of every module under `minibatch/engine/` (kernels, models, runner, step loop,
schedulers, KV cache, sampling: what decides a step's cost), each read as its syntax tree with the
docstrings dropped, so editing a docstring or a comment leaves it unchanged and editing code does
not. Calibration stores it in the profile; `tests/test_profile_fingerprint.py` fails when the
shipped profile's fingerprint no longer matches the code. The files are read as text: nothing here
imports them.
"""
from __future__ import annotations

import ast
import hashlib
from pathlib import Path

ENGINE_DIR = Path(__file__).resolve().parent.parent / "engine"
RECALIBRATE = "python -m minibatch calibrate --write-shipped"   # measures and rewrites the shipped profile


def without_docstrings(source: str) -> str:
    """The code of a module as `ast.unparse` writes it, with every module, class and function docstring dropped."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def engine_fingerprint(root: Path = ENGINE_DIR) -> str:
    """sha256 (16 hex digits) over every .py file under `root`: its path and its code without docstrings."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(without_docstrings(path.read_text(encoding="utf-8")).encode() + b"\0")
    return digest.hexdigest()[:16]
