"""The course reads as one book: chapters 00 to 15 in order, each opening with its question, linked
to the chapters before and after it; every relative link in the notebooks and docs resolves; chapter
00 defines every term of the glossary once; every chapter ends with its further reading; no notebook
asserts on a timing outside minibatch.analysis.claims.claim."""

import ast
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
GLOSSARY = ["request", "sequence", "step", "prefill", "decode", "slot", "batch size", "token budget", "block",
            "block table", "TTFT", "TPOT", "e2e latency", "queue time", "throughput", "goodput", "SLA",
            "utilisation", "preemption", "KV cache", "memory-bound"]
LINK = re.compile(r"\]\(([^)#:\s]+)(#[^)]*)?\)")        # a relative markdown link: ](path) or ](path#anchor)


def markdown(path: Path) -> list[str]:
    return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown"]


def test_chapters_are_numbered_00_to_15_without_gaps():
    assert [p.name[:2] for p in CHAPTERS] == [f"{i:02d}" for i in range(16)]


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


# --- Closing checks that hold on any machine -----------------------------------------------------
# A notebook never asserts on a timing: a wall-clock figure measured once moves by 30% with what
# else the machine runs. It states the claim with minibatch.analysis.claims.claim, on counts, on
# the simulated clock, or on interleaved Rounds against what physics guarantees (see that module).
TIMING = re.compile(r"tok_s|per_s\b|_s$|_ms$|duration|ttft|tpot|e2e|latency|throughput|seconds|elapsed|"
                    r"speed_?up|perf_counter|monotonic|(^|_)(times?|wait)($|_)", re.IGNORECASE)
COUNT_SERIES = re.compile(r"_(count|total)(\{.*)?$")   # a Prometheus counter's name counts events, whatever it counts
NOTEBOOKS_AND_SOLUTIONS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))


def _names(node: ast.AST) -> set[str]:
    """Identifiers, attribute names, called names and string subscripts (except counters' series
    names) inside an expression."""
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
        elif isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Constant) and isinstance(sub.slice.value, str):
            if not COUNT_SERIES.search(sub.slice.value):
                found.add(sub.slice.value)
    return found


def _plain_names(target: ast.AST) -> list[ast.Name]:
    """The names an assignment binds as a whole (`x`, `a, b`), not those it writes into (`d[k] = ...`)."""
    if isinstance(target, ast.Name):
        return [target]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for element in target.elts for n in _plain_names(element)]
    return _plain_names(target.value) if isinstance(target, ast.Starred) else []


def timing_asserts(cells: list[str]) -> list[str]:
    """The asserts of these code cells (in order) that test a timing, directly or through a name
    assigned from one (`x = [r["speedup"] for r in rows]; assert min(x) > 1.1`)."""
    timed, found = set(), []
    for source in cells:
        code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None:
                if any(TIMING.search(n) or n in timed for n in _names(node.value)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    timed |= {n.id for t in targets for n in _plain_names(t)}
            elif isinstance(node, ast.Assert):
                if any(TIMING.search(n) or n in timed for n in _names(node.test)):
                    found.append(ast.unparse(node.test))
    return found


def code_cells(path: Path) -> list[str]:
    return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def test_timing_asserts_are_found():
    assert timing_asserts(["assert tok_s[8] > 1.8 * tok_s[1], tok_s"])
    assert timing_asserts(["%matplotlib inline\nx = [r['speedup'] for r in rows]", "assert min(x) > 1.1"])
    assert timing_asserts(["t0 = time.perf_counter()\nrun()\nassert time.perf_counter() - t0 < 2"])
    assert timing_asserts(["assert eight['mean_tpot_s'] > 1.2 * one['mean_tpot_s']"])
    assert timing_asserts(["def check(r):\n    assert r.duration < 6 * base"])
    assert not timing_asserts(["claim('fewer steps', c['steps'] < 0.8 * s['steps'], on='counts', "
                               "shown={'tokens/s': c['throughput_tok_s']})"])
    assert not timing_asserts(["assert outputs['paged'] == outputs['contiguous']",
                               "assert p['waste_fraction'] < 0.10 and p['max_concurrent_seqs'] >= 2",
                               "assert all(s.num_prefill_tokens == 0 and s.num_decode_tokens == 1 for s in steps)",
                               "runs = {}\nruns['a'] = {'tokens': t, 'tok_s': 3.0}\nassert runs['a']['tokens'] == t",
                               "assert samples['x:time_to_first_token_seconds_count{model_name=\"m\"}'] == 24"])


@pytest.mark.parametrize("path", NOTEBOOKS_AND_SOLUTIONS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_timing_is_asserted_outside_claim(path):
    name, found = f"{path.parent.name}/{path.name}", timing_asserts(code_cells(path))
    assert not found, (f"{name} asserts on a timing: {found}. State the claim with minibatch.analysis.claims.claim "
                       "on counts, the simulated clock or interleaved Rounds")


def further_reading_problems(path: Path) -> list[str]:
    cells = nbformat.read(path, as_version=4).cells
    reading = cells[-2]
    if reading.cell_type != "markdown" or not reading.source.startswith("## Further reading"):
        return ["the cell before the closing navigation cell is not '## Further reading'"]
    if reading.source.count("\n- ") < 2:
        return ["further reading lists fewer than two primary sources (one line each on what it adds)"]
    return []


@pytest.mark.parametrize("index", range(len(CHAPTERS)), ids=lambda i: CHAPTERS[i].stem)
def test_chapter_ends_with_further_reading(index):
    name, found = CHAPTERS[index].stem, further_reading_problems(CHAPTERS[index])
    assert not found, f"{name}: {found}"
