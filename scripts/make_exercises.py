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
every output and execution count is dropped.

A debugging exercise hands the learner code to fix instead of a blank: right after the solution
region (its END line) comes a `### BEGIN STUB` ... `### END STUB` region whose lines are the buggy
code commented out with `# ` (so the solution notebook runs the fixed code only). In the exercise the
solution region becomes those lines, uncommented; the stub region itself disappears. Its checker
reports the buggy code as not solved (`raise NotSolved(symptom)`, see minibatch/checks/core.py).

tests/test_exercises.py checks that exercises/ is up to date, that every solution is solved and that
every stub is reported unsolved.

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
BEGIN_STUB, END_STUB = "### BEGIN STUB", "### END STUB"
STUB = 'raise NotImplementedError("Exercise: write this part")'


def stub_source(source: str, where: str) -> str:
    """Replace each BEGIN..END region of a cell's source with an indented STUB line, or with the
    uncommented lines of the BEGIN STUB..END STUB region that follows it."""
    out, indent, state = [], None, "code"  # indent: of the last BEGIN line; state: code, solution, after, stub
    for lineno, line in enumerate(source.splitlines(keepends=True), start=1):
        marker = line.strip()
        if state == "after" and not marker.startswith(BEGIN_STUB):
            out.append(f"{indent}{STUB}\n")
            state = "code"
        if marker.startswith(BEGIN_STUB):
            if state != "after":
                raise ValueError(f"{where}, line {lineno}: {BEGIN_STUB!r} must follow an {END!r} line")
            state = "stub"
        elif marker.startswith(END_STUB):
            if state != "stub":
                raise ValueError(f"{where}, line {lineno}: {END_STUB!r} without a {BEGIN_STUB!r} before it")
            state = "code"
        elif marker.startswith(BEGIN):
            if state == "solution":
                raise ValueError(f"{where}, line {lineno}: {BEGIN!r} inside another region")
            indent, state = line[: len(line) - len(line.lstrip())], "solution"
        elif marker.startswith(END):
            if state != "solution":
                raise ValueError(f"{where}, line {lineno}: {END!r} without a {BEGIN!r} before it")
            state = "after"
        elif any(m in line for m in (BEGIN, END, BEGIN_STUB, END_STUB)):
            raise ValueError(f"{where}, line {lineno}: a solution marker must stand on a line of its own")
        elif state == "stub":
            out.append(_uncomment(line, indent, f"{where}, line {lineno}"))
        elif state == "code":
            out.append(line)
    if state == "after":
        out.append(f"{indent}{STUB}\n")
    elif state != "code":
        raise ValueError(f"{where}: {BEGIN!r} or {BEGIN_STUB!r} without a matching end")
    text = "".join(out)
    return text if source.endswith("\n") else text.rstrip("\n")


def _uncomment(line: str, indent: str, where: str) -> str:
    """A stub region's line without its `# `: blank lines stay blank."""
    if not line.strip():
        return line
    if not line.startswith(indent + "#"):
        raise ValueError(f"{where}: a stub line must be commented out with '# ' at the region's indentation")
    body = line[len(indent) + 1:]
    return (indent + (body[1:] if body.startswith(" ") else body)) if body.strip() else body


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
