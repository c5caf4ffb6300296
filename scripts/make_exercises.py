"""Generate exercises/ from solutions/: the same notebooks with every solution cut out.

How to write an exercise in solutions/NN_topic.ipynb (the source of truth):
- An exercise is one code cell with the cell tag `exercise`. It is self-contained, so it runs in
  a fresh namespace: its imports, the function the learner completes, and a call of the chapter's
  checker from `minibatch.checks` on that function.
- The learner's part sits between a `### BEGIN SOLUTION` line and a `### END SOLUTION` line,
  inside the body of a function the checker calls: then the stub raises only when the checker
  calls it, and the checker turns that into "not solved yet" instead of an error.
- The cell ends with the checker's `CheckResult`, either as its last expression (so Jupyter shows
  it) or assigned to a variable named `result`.
- Markers appear only in `exercise` cells, and every `exercise` cell holds at least one region.

In exercises/NN_topic.ipynb each region, markers included, becomes
`raise NotImplementedError("Exercise: write this part")` at the indentation of its BEGIN line, and
every output and execution count is dropped. tests/test_exercises.py checks that exercises/ is up
to date, that every solution is solved and that every stub is reported unsolved.

A debugging exercise gives the learner a piece with a planted bug instead of a blank: right after a
region's END line, a `### BEGIN STUB` ... `### END STUB` region holds the buggy code as comments
(each line `# ` plus the code, at the region's indentation; `#` alone for a blank line), so the
solution notebook does not run it. In exercises/ that code, uncommented, takes the region's place
(instead of the `raise` line) and the stub markers go. Its checker (`checker(..., debug=True)`) must
report the buggy code unsolved, with a message that points at the symptom.

Usage: python scripts/make_exercises.py [--check] [--solutions DIR] [--exercises DIR]
  --check   write nothing; exit 1 and list the files that are out of date
"""

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TAG = "exercise"
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = 'raise NotImplementedError("Exercise: write this part")'
BUGGY_BEGIN, BUGGY_END = "### BEGIN STUB", "### END STUB"


def stub_source(source: str, where: str) -> str:
    """Replace each BEGIN..END region of a cell's source with an indented STUB line, or with the
    uncommented code of the BEGIN STUB..END STUB region that follows it."""
    out, indent = [], None  # indent is None outside a region
    buggy, last_end = None, None  # the stub region's lines while inside one; out's index of the last END line
    for lineno, line in enumerate(source.splitlines(keepends=True), start=1):
        marker = line.strip()
        if buggy is not None:
            if marker.startswith(BUGGY_END):
                out[last_end:last_end + 1] = buggy  # the buggy code replaces the STUB line
                buggy, last_end = None, None
            elif marker.startswith(("### BEGIN", "### END")):
                raise ValueError(f"{where}, line {lineno}: {marker!r} inside a {BUGGY_BEGIN!r} region")
            elif marker != "#" and not marker.startswith("# "):
                raise ValueError(f"{where}, line {lineno}: every line of a {BUGGY_BEGIN!r} region is a comment")
            else:
                head = line[: len(line) - len(line.lstrip())]
                code = line.lstrip()[2:] if marker != "#" else "\n"
                buggy.append(head + code if code.strip() else "\n")
            continue
        if marker.startswith(BUGGY_BEGIN):
            if last_end is None:
                raise ValueError(f"{where}, line {lineno}: {BUGGY_BEGIN!r} must follow a {END!r} line directly")
            buggy = []
            continue
        if marker.startswith(BEGIN):
            if indent is not None:
                raise ValueError(f"{where}, line {lineno}: {BEGIN!r} inside another region")
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}{STUB}\n")
        elif marker.startswith(END):
            if indent is None:
                raise ValueError(f"{where}, line {lineno}: {END!r} without a {BEGIN!r} before it")
            indent, last_end = None, len(out) - 1
            continue
        elif BEGIN in line or END in line or BUGGY_BEGIN in line or BUGGY_END in line:
            raise ValueError(f"{where}, line {lineno}: a solution marker must stand on a line of its own")
        elif indent is None:
            out.append(line)
        last_end = None
    if indent is not None:
        raise ValueError(f"{where}: {BEGIN!r} without a matching {END!r}")
    if buggy is not None:
        raise ValueError(f"{where}: {BUGGY_BEGIN!r} without a matching {BUGGY_END!r}")
    text = "".join(out)
    return text if source.endswith("\n") else text.rstrip("\n")


def make_exercise(notebook: dict, name: str) -> dict:
    """The exercise version of a solution notebook (a new dict; the input is left as it is)."""
    notebook = json.loads(json.dumps(notebook))  # deep copy
    notebook.get("metadata", {}).pop("widgets", None)  # saved widget state is output too
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        where = f"{name}, cell {index}"
        source = "".join(cell["source"])  # nbformat stores a string or a list of lines
        tagged = TAG in cell.get("metadata", {}).get("tags", [])
        marked = BEGIN in source or END in source
        if tagged and not marked:
            raise ValueError(f"{where}: tagged {TAG!r} but has no {BEGIN!r} region")
        if marked and not tagged:
            raise ValueError(f"{where}: has solution markers but lacks the {TAG!r} cell tag")
        if marked:
            cell["source"] = stub_source(source, where).splitlines(keepends=True)
        cell["outputs"] = []
        cell["execution_count"] = None
    return notebook


def render(notebook: dict) -> str:
    """Notebook JSON laid out as Jupyter saves it, so generated files diff cleanly."""
    return json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def planned(solutions: Path, exercises: Path) -> dict[Path, str | None]:
    """Every file exercises/ should change: its new text, or None for a stale file to delete."""
    wanted = {}
    for path in sorted(solutions.glob("*.ipynb")):
        notebook = json.loads(path.read_text(encoding="utf-8"))
        wanted[exercises / path.name] = render(make_exercise(notebook, shown(path)))
    changes = {p: text for p, text in wanted.items()
               if not p.exists() or p.read_text(encoding="utf-8") != text}
    stale = {p: None for p in exercises.glob("*.ipynb") if p not in wanted}
    return changes | stale


def shown(path: Path) -> str:
    """A path as messages show it: relative to the working folder where it can be."""
    path = path.resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report out-of-date files")
    parser.add_argument("--solutions", type=Path, default=ROOT / "solutions")
    parser.add_argument("--exercises", type=Path, default=ROOT / "exercises")
    args = parser.parse_args(argv)
    try:
        changes = planned(args.solutions, args.exercises)
    except ValueError as err:
        print(f"make_exercises: {err}", file=sys.stderr)
        return 2
    if args.check:
        for path, text in changes.items():
            why = "has no solution notebook" if text is None else "is out of date"
            print(f"{shown(path)} {why}: run `make exercises`", file=sys.stderr)
        return 1 if changes else 0
    args.exercises.mkdir(parents=True, exist_ok=True)
    for path, text in changes.items():
        if text is None:
            path.unlink()
            print(f"removed {shown(path)} (no solution notebook)")
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
