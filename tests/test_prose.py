"""No chapter is a wall of text: each chapter notebook holds at most MAX_WORDS words of prose
(its markdown cells), about fifteen minutes of reading, so that a learner runs something well
before the reading of a chapter is done. A chapter that must say more is split in two.

The questionnaire and the further reading that close a chapter are not counted: they are what a
learner does after the chapter, not reading before anything runs."""

from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MAX_WORDS = 2000
AFTER_THE_CHAPTER = ("## Review questions", "## Further reading")   # headings of the cells not counted


def prose_words(path: Path) -> int:
    """Words in the notebook's markdown cells, as split on white space, but for the closing questionnaire and
    further reading."""
    return sum(len(c.source.split()) for c in nbformat.read(path, as_version=4).cells
               if c.cell_type == "markdown" and not c.source.lstrip().startswith(AFTER_THE_CHAPTER))


def test_prose_words_are_counted_in_markdown_cells_only(tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# One two\n\nthree, four."),
                                               nbformat.v4.new_code_cell("print('not prose at all')")])
    nbformat.write(notebook, tmp_path / "00_x.ipynb")
    assert prose_words(tmp_path / "00_x.ipynb") == 5


def test_the_questionnaire_and_further_reading_are_not_reading(tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("one two"),
                                               nbformat.v4.new_markdown_cell("## Review questions\n\n1. Why?"),
                                               nbformat.v4.new_markdown_cell("## Further reading\n\n- a paper")])
    nbformat.write(notebook, tmp_path / "00_x.ipynb")
    assert prose_words(tmp_path / "00_x.ipynb") == 2


def test_every_chapter_is_found():
    assert len(CHAPTERS) >= 16


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_prose_fits_the_reading_budget(path):
    words = prose_words(path)
    assert words <= MAX_WORDS, (f"{path.name} has {words} words of prose, over {MAX_WORDS}: cut it to what a learner "
                                "needs, move instructor-only detail to docs/instructors.md, or split the chapter")
