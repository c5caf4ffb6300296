"""Mark every chapter's cells for `jupyter nbconvert --to slides`, so each chapter projects as a deck of its
question, its pictures and its claim: `python scripts/mark_slides.py` (all of notebooks/) or name notebooks.

The rule, applied to each cell's `metadata.slideshow.slide_type` (any other metadata is left alone):
- `slide`: the first cell (the chapter's title and question) and every markdown cell that opens with a
  `## ` section heading (the check and further reading included);
- `subslide`: a code cell that draws a figure (it calls `plt.show()`), and a code cell that checks the
  chapter's claim (it calls `claim(` or sits in the `## Check` section): the picture or the printed check
  gets a slide of its own under its section, its output shown when the notebook was run first;
- `notes`: every other markdown cell (predictions, "what it means", explanations): the speaker notes,
  shown in reveal.js's speaker view (press `s`);
- `skip`: every other code cell (imports, measurements, widgets, which do not render in a static deck) and
  the closing navigation cell.
Running it again gives the same metadata; `--check` lists the notebooks whose metadata differs and exits 1.
"""
import argparse
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
NAVIGATION = "<!-- course navigation -->"


def slide_types(cells) -> list[str]:
    """The slide type of each cell, by the rule in this module's docstring."""
    types, in_check = [], False
    for i, cell in enumerate(cells):
        text = cell.source.lstrip()
        heading = cell.cell_type == "markdown" and text.startswith("## ")
        if heading:
            in_check = text.startswith("## Check")
        if i == 0 or heading:
            types.append("slide")
        elif cell.cell_type == "markdown":
            types.append("skip" if text.startswith(NAVIGATION) else "notes")
        elif "plt.show()" in cell.source or "claim(" in cell.source or in_check:
            types.append("subslide")
        else:
            types.append("skip")
    return types


def mark(path: Path, write: bool = True) -> bool:
    """Set the slide types of one notebook; True when they changed (written unless write=False)."""
    notebook = nbformat.read(path, as_version=nbformat.NO_CONVERT)
    changed = False
    for cell, slide_type in zip(notebook.cells, slide_types(notebook.cells)):
        if cell.metadata.get("slideshow", {}).get("slide_type") != slide_type:
            cell.metadata.setdefault("slideshow", {})["slide_type"] = slide_type
            changed = True
    if changed and write:
        nbformat.write(notebook, path)
    return changed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook in notebooks/")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook is not marked")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    changed = [path for path in paths if mark(path, write=not args.check)]
    for path in changed:
        print(f"{'not marked' if args.check else 'marked'}: {path}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
