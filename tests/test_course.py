"""The course reads as one book: chapters 00 to 14 in order, each opening with its question, linked
to the chapters before and after it; every relative link in the notebooks and docs resolves; chapter
00 defines every term of the glossary once."""

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
GLOSSARY = ["request", "sequence", "step", "prefill", "decode", "slot", "batch size", "token budget", "block",
            "block table", "TTFT", "TPOT", "e2e latency", "queue time", "throughput", "goodput", "SLA",
            "utilisation", "preemption"]
LINK = re.compile(r"\]\(([^)#:\s]+)(#[^)]*)?\)")        # a relative markdown link: ](path) or ](path#anchor)


def markdown(path: Path) -> list[str]:
    return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown"]


def test_chapters_are_numbered_00_to_14_without_gaps():
    assert [p.name[:2] for p in CHAPTERS] == [f"{i:02d}" for i in range(15)]


@pytest.mark.parametrize("index", range(len(CHAPTERS)), ids=lambda i: CHAPTERS[i].stem)
def test_chapter_opens_with_its_question_and_links_its_neighbours(index):
    cells = markdown(CHAPTERS[index])
    assert "**The question of this chapter:**" in cells[0], "the first cell states the chapter's question"
    text = "\n".join(cells)
    if index > 0:
        assert f"]({CHAPTERS[index - 1].name})" in cells[0], "the first cell links back to the previous chapter"
    if index + 1 < len(CHAPTERS):
        assert f"]({CHAPTERS[index + 1].name})" in cells[-1], "the last cell links on to the next chapter"
    assert "00_welcome.ipynb" in text or index == 0


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))
                         + [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_relative_links_resolve(path):
    text = "\n".join(markdown(path)) if path.suffix == ".ipynb" else path.read_text()
    missing = [target for target, _ in LINK.findall(text)
               if not target.startswith(("http", "mailto")) and not (path.parent / target).exists()]
    assert not missing, f"{path.name} links to files that do not exist: {missing}"


def test_chapter_00_defines_every_glossary_term_once():
    glossary = next(c for c in markdown(CHAPTERS[0]) if "The words of this course" in c)
    defined = re.findall(r"^\| \*\*(.+?)\*\* \|", glossary, flags=re.M)
    assert sorted(defined) == sorted(GLOSSARY)
