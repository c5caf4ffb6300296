"""Every chapter carries slide metadata (scripts/mark_slides.py's rule), and its deck builds with nbconvert."""
import importlib.util
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))
spec = importlib.util.spec_from_file_location("mark_slides", ROOT / "scripts" / "mark_slides.py")
mark_slides = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mark_slides)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_every_cell_carries_the_rule_s_slide_type(path):
    """A cell added since the chapter was last marked only joins the slide before it in the deck, so unmarked
    cells are let through up to a third of the chapter (`mark_slides.py --check` is strict); a marked cell
    must follow the rule."""
    cells = nbformat.read(path, as_version=4).cells
    found = [cell.metadata.get("slideshow", {}).get("slide_type") for cell in cells]
    fix = f"run: .venv/bin/python scripts/mark_slides.py {path.relative_to(ROOT)}"
    wrong = [i for i, (got, rule) in enumerate(zip(found, mark_slides.slide_types(cells))) if got not in (None, rule)]
    assert not wrong, f"cells {wrong} are marked against the rule; {fix}"
    assert found[0] == "slide", f"a deck opens with the chapter's question; {fix}"
    unmarked = [i for i, slide_type in enumerate(found) if slide_type is None]
    assert len(unmarked) <= len(cells) // 3, f"cells {unmarked} are unmarked; {fix}"


def test_the_rule_marks_question_sections_pictures_and_claims():
    new_md, new_code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    cells = [new_md("# 99 · A chapter\n\n**The question:** why?"), new_code("import torch"),
             new_md("## A section"), new_md("**Predict** a number."), new_code("plot()\nplt.show()"),
             new_code("widgets.interact(show)"), new_md("## Check"), new_code("assert ok"),
             new_code("claim('it holds', True)"), new_md("<!-- course navigation -->\nNext")]
    assert mark_slides.slide_types(cells) == ["slide", "skip", "slide", "notes", "subslide", "skip", "slide",
                                              "subslide", "subslide", "skip"]


@pytest.mark.parametrize("name", ["02_static_batching", "08_small_model_specifics"])
def test_a_chapter_builds_into_a_deck_with_a_section_per_slide(name, tmp_path):
    from nbconvert import SlidesExporter
    path = next((ROOT / "notebooks").glob(f"*{name[2:]}.ipynb"))  # chapters may be renumbered
    notebook = nbformat.read(path, as_version=4)
    html, _ = SlidesExporter().from_notebook_node(notebook)
    types = [cell.metadata["slideshow"]["slide_type"] for cell in notebook.cells]
    sections = len(re.findall(r"<section\b", html))
    # reveal.js nests each slide's subslides in an outer <section>: one per slide, one per (sub)slide page
    assert sections == types.count("slide") * 2 + types.count("subslide"), sections
    assert "aside class=\"notes\"" in html  # the explanations travel as speaker notes
