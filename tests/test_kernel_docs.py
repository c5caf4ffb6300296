"""The engine's code says what and why; its measurements live in docs/performance.md, and only the engine
reaches behind its own public names.

1. No docstring or comment under `minibatch/engine/` quotes a timing (a number with ms, us, GB/s, tok/s ...),
   names a CPU model, a tuning hour or a script: those belong to a table in docs/performance.md, with the
   machine, the date and the command, where they can be measured again; and every section of it that the
   code points to exists.
2. No file outside `minibatch/engine/` imports a leading-underscore name from `minibatch.engine`: the
   experiments, the bench and the course call the kernels through their public entry points, so the engine
   can change its internals without breaking them. (Tests may still reach a private kernel as an
   attribute of its module, to check it directly.)
"""
import ast
import io
import json
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "minibatch" / "engine"

NUMBER = r"\d+(?:\.\d+)?(?:\s*(?:-|to)\s*\d+(?:\.\d+)?)?"
UNIT = r"(?:ms|us|µs|ns|GB/s|MB/s|GFLOP/s|GFLOPS|GFMA/s|tok/s|tokens/s|req/s)"
DIARY = re.compile(
    rf"\b{NUMBER}\s*{UNIT}(?![\w/])"                   # a timing or a rate: 23.3 ms, 5.0 us, 32 GB/s, 54.8 tok/s
    r"|\bXeons?\b|\bEPYC\b|\bSapphire Rapids\b|\bSkylake\b|\bZen \d"   # a CPU model
    r"|a slow(?:er)? hour"                             # a tuning session's conditions
    r"|scripts/"                                       # a script's command line
    r"|\b[Mm]easured on an? (?:\d+-core\b|\w[\w-]* (?:CPU|machine|laptop|host)\b)"   # "measured on a 2-core ..."
)


def engine_files() -> list[Path]:
    return sorted(ENGINE.rglob("*.py"))


def docstrings_and_comments(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every docstring (module, class, function) and every comment in a Python file."""
    source = path.read_text()
    found = []
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found.append((node.body[0].lineno, doc))
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found.append((token.start[0], token.string))
    return found


def diary_lines(path: Path) -> list[str]:
    """'file:line: the match' for every timing, CPU model, tuning hour or script named in its docs and comments."""
    wrong = []
    for line, text in docstrings_and_comments(path):
        for match in DIARY.finditer(text):
            at = line + text.count("\n", 0, match.start())
            wrong.append(f"{path.relative_to(ROOT)}:{at}: {match.group(0)!r}")
    return wrong


@pytest.mark.parametrize("text", [
    "on a 2-core Xeon with AVX-512", "a 2-core AMD EPYC", "took 23.3 ms against 28.7", "5.0 / 6.1 us at 1 row",
    "121-129 us", "reads at about 20 GB/s", "162 GFLOP/s", "54.8 tok/s", "(a slower hour than above)",
    "`python scripts/linear_ab.py --rows 8`", "measured on a 2-core machine", "92.2-95.8 ms", "7 µs",
    "Measured on a 2-core AVX2 CPU", "measured on a busy laptop",
])
def test_the_check_sees_a_diary_line(text):
    assert DIARY.search(text), f"the check misses {text!r}"


@pytest.mark.parametrize("text", [
    "x (T, K), weight (N, K)", "STREAM_ROWS (64) rows", "sixteen lanes in AVX-512's 32 registers",
    "docs/performance.md, section \"Blocks of rows\"", "chunks of 768 columns (24 KB of x)", "a 2-core CPU",
    "the status is a bus (not a unit)", "x86's prefetcht1", "one decode step of the model",
    "the crossover is measured on this machine, once", "measured on the machine the first time it is needed",
])
def test_the_check_leaves_plain_explanations(text):
    assert not DIARY.search(text), f"the check flags {text!r}: {DIARY.search(text).group(0)!r}"


def test_no_engine_docstring_or_comment_quotes_a_measurement():
    wrong = [line for path in engine_files() for line in diary_lines(path)]
    assert not wrong, ("measurements belong in docs/performance.md (machine, date, command, table); the code "
                       "names the section:\n" + "\n".join(wrong))


SECTIONS = re.compile(r'performance\.md,? (?:sections? )?((?:"[^"]+"(?:,? and |, )?)+)')


def sections_named(text: str) -> list[str]:
    """The docs/performance.md sections a text points to: 'performance.md, sections "A" and "B"' -> [A, B]."""
    return [name for chain in SECTIONS.findall(" ".join(text.split())) for name in re.findall(r'"([^"]+)"', chain)]


def test_the_section_check_reads_a_pointer():
    assert sections_named('docs/performance.md, sections "Streamed\n    products" and "bfloat16".') == [
        "Streamed products", "bfloat16"]
    assert sections_named('(docs/performance.md, "Threads"; each kernel\'s own)') == ["Threads"]


def test_every_section_the_code_names_exists():
    """A docstring's pointer to its measurements leads to a heading of docs/performance.md."""
    headings = set(re.findall(r"^## (.+)$", (ROOT / "docs" / "performance.md").read_text(), re.MULTILINE))
    named = {(str(path.relative_to(ROOT)), name) for path in sorted((ROOT / "minibatch").rglob("*.py"))
             for name in sections_named(path.read_text())}
    assert any(path.startswith("minibatch/engine/") for path, _ in named), "no engine docstring names a section"
    missing = sorted(f"{path}: {name!r}" for path, name in named if name not in headings)
    assert not missing, "docs/performance.md has no such section:\n" + "\n".join(missing)


def private_engine_imports(source: str) -> list[str]:
    """Every `from minibatch.engine... import _name` (or a module path with a leading-underscore part)."""
    wrong = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[:2] == ["minibatch", "engine"]:
            private_module = any(part.startswith("_") for part in node.module.split("."))
            for alias in node.names:
                if private_module or (alias.name.startswith("_") and not alias.name.startswith("__")):
                    wrong.append(f"line {node.lineno}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[:2] == ["minibatch", "engine"] and any(p.startswith("_") for p in parts):
                    wrong.append(f"line {node.lineno}: import {alias.name}")
    return wrong


def notebook_source(path: Path) -> str:
    """A notebook's code cells as one Python source, its IPython magics and shell lines left out."""
    cells = json.loads(path.read_text())["cells"]
    lines = [line for cell in cells if cell["cell_type"] == "code"
             for line in "".join(cell["source"]).splitlines() if not line.lstrip().startswith(("%", "!"))]
    return "\n".join(lines)


def outside_engine() -> list[Path]:
    """Every Python file and notebook of the project outside minibatch/engine/."""
    found = []
    for folder in ("minibatch", "tests", "scripts", "notebooks", "solutions", "exercises"):
        for path in sorted((ROOT / folder).rglob("*")):
            checkpoint = ".ipynb_checkpoints" in path.parts
            if path.suffix in (".py", ".ipynb") and ENGINE not in path.parents and not checkpoint:
                found.append(path)
    return found


def test_private_import_check_sees_one(tmp_path):
    assert private_engine_imports("from minibatch.engine.kernels.gemv_cpu import _stream, streamed_linear\n")
    assert private_engine_imports("import minibatch.engine.kernels._private\n")
    assert not private_engine_imports("from minibatch.engine.kernels.gemv_cpu import streamed_linear\n"
                                      "from minibatch.engine import __version__\nfrom os import _exit\n")


def test_nothing_outside_the_engine_imports_its_private_names():
    files = outside_engine()
    assert any(p.suffix == ".py" for p in files) and any(p.parts[-2] == "tests" for p in files)
    wrong = []
    for path in files:
        source = notebook_source(path) if path.suffix == ".ipynb" else path.read_text()
        wrong += [f"{path.relative_to(ROOT)} {line}" for line in private_engine_imports(source)]
    assert not wrong, "call the engine's public entry points instead:\n" + "\n".join(wrong)
