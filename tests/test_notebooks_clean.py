"""Every notebook in notebooks/, solutions/ and exercises/ is valid nbformat and committed clean:
no outputs, no execution counts, no saved widget state (outputs are made by running, not stored)."""

from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p.relative_to(ROOT) for folder in ("notebooks", "solutions", "exercises")
                   for p in (ROOT / folder).glob("*.ipynb"))


def problems(path: Path) -> list[str]:
    """What keeps a notebook from being committed; raises if it is not valid nbformat 4."""
    notebook = nbformat.read(path, as_version=nbformat.NO_CONVERT)
    if notebook.nbformat != 4:
        return [f"nbformat {notebook.nbformat}, expected 4"]
    nbformat.validate(notebook)  # ValidationError names the broken field
    found = []
    dirty = [i for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"
             and (cell.outputs or cell.execution_count is not None)]
    if dirty:
        found.append(f"cells {dirty} hold outputs or execution counts; clear them with "
                     f".venv/bin/jupyter nbconvert --clear-output --inplace {path}")
    if "widgets" in notebook.metadata:
        found.append("metadata.widgets holds saved widget state; delete that key (JupyterLab "
                     "saves it when 'Save Widget State Automatically' is on)")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=str)
def test_notebook_is_valid_and_clean(path):
    found = problems(ROOT / path)
    assert not found, f"{path}: " + "; ".join(found)


def test_problems_are_found(tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A chapter"),
                                               nbformat.v4.new_code_cell("1 + 1")])
    nbformat.write(notebook, tmp_path / "clean.ipynb")
    assert problems(tmp_path / "clean.ipynb") == []
    notebook.cells[1].execution_count = 1
    notebook.cells.append(nbformat.v4.new_code_cell(
        "print(2)", outputs=[nbformat.v4.new_output("stream", text="2\n")]))
    notebook.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {}}
    nbformat.write(notebook, tmp_path / "dirty.ipynb")
    found = problems(tmp_path / "dirty.ipynb")
    assert len(found) == 2 and "cells [1, 2]" in found[0] and "metadata.widgets" in found[1]
    (tmp_path / "broken.ipynb").write_text('{"cells": [], "nbformat": 4}')
    with pytest.raises(nbformat.ValidationError):
        problems(tmp_path / "broken.ipynb")
