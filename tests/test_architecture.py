"""The package's shape: each wing imports only itself and the wings below it, the top level stays small,
files stay short."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "minibatch"
# The wings, bottom first: each may import itself and the wings before it, never one after it
# (docs/architecture.md draws them). `models` is the top-level models.py, the reference's public path.
WINGS = ("validate", "config", "engine", "models", "sim", "workloads", "analysis", "viz", "llm", "serving", "tools",
         "bench", "widgets", "checks")
ENTRY_POINTS = ("__init__.py", "__main__.py")   # the public names and the command line: they may import any wing
ROOT = "llm"   # `from minibatch import LLM` goes through the package's __init__, which serves llm.py's names
ABOVE_ENGINE = WINGS[WINGS.index("engine") + 1:]


def imported_modules(path: Path) -> list[str]:
    """Every module a file imports, at any depth (function-level imports included), as dotted names."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            names.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def wing_of(path: Path, package: Path = PACKAGE) -> str:
    """The wing a file of the package belongs to: its top-level folder, or its own name at the top level."""
    return path.relative_to(package).parts[0].removesuffix(".py")


def imported_wing(name: str) -> str | None:
    """The wing a dotted import name reaches into (None outside the package); `minibatch` itself or one of
    its names (`minibatch.LLM`) reaches the package's __init__, and through it `llm`."""
    parts = name.split(".")
    if parts[0] != "minibatch":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in WINGS else ROOT


def wrong_imports(paths, package: Path = PACKAGE) -> list[str]:
    """One line per (file, wing listed after the file's own that it imports), with the names imported."""
    wrong = {}
    for path in paths:
        own = wing_of(path, package)
        for name in imported_modules(path):
            wing = imported_wing(name)
            if wing is not None and WINGS.index(wing) > WINGS.index(own):
                wrong.setdefault(f"{path.relative_to(package.parent)} ({own}) imports {wing}", set()).add(name)
    return [f"{line}: {', '.join(sorted(names))}" for line, names in sorted(wrong.items())]


def package_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE or p.name not in ENTRY_POINTS)


def test_every_file_of_the_package_belongs_to_a_listed_wing():
    unlisted = sorted({wing_of(p) for p in package_files()} - set(WINGS))
    assert not unlisted, f"add these to WINGS (and to docs/architecture.md) where they belong: {unlisted}"


def test_each_wing_imports_only_itself_and_the_wings_below_it():
    wrong = wrong_imports(package_files())
    assert not wrong, "a wing imports a wing above it (order: " + " < ".join(WINGS) + "):\n" + "\n".join(wrong)


def test_imports_are_absolute_so_the_order_check_sees_them():
    relative = [f"{p.relative_to(PACKAGE.parent)}:{node.lineno}" for p in package_files()
                for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.ImportFrom) and node.level]
    assert not relative, f"write these imports as `from minibatch.<wing>...`: {relative}"


def test_engine_imports_nothing_above_it():
    wrong = []
    for path in sorted((PACKAGE / "engine").rglob("*.py")):
        for name in imported_modules(path):
            parts = name.split(".")
            if parts[0] == "minibatch" and len(parts) > 1 and parts[1] in ABOVE_ENGINE:
                wrong.append(f"{path.relative_to(PACKAGE.parent)} imports {name}")
    assert not wrong, "the engine must not import the wings above it:\n" + "\n".join(wrong)


def test_the_order_check_sees_an_import_of_a_wing_above_inside_a_function(tmp_path):
    (tmp_path / "minibatch" / "analysis").mkdir(parents=True)
    example = tmp_path / "minibatch" / "analysis" / "example.py"
    example.write_text("def f():\n    from minibatch import LLM\n    from minibatch.sim import clock\n"
                       "    import minibatch.tools.tune\n")
    assert wrong_imports([example], tmp_path / "minibatch") == [
        "minibatch/analysis/example.py (analysis) imports llm: minibatch, minibatch.LLM",
        "minibatch/analysis/example.py (analysis) imports tools: minibatch.tools.tune"]


def test_the_architecture_page_lists_the_wings_in_this_order():
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    order = " ".join(text[text.index("The order, bottom first:"):].split("\n\n")[0].split())
    named = [w.strip("`/ ").removesuffix(".py") for w in order.split(":", 1)[1].strip(" .").split(" < ")]
    assert tuple(named) == WINGS, order


def test_at_most_eight_top_level_modules():
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= 8, f"minibatch/ has {len(modules)} top-level modules: {modules}"


def test_no_file_over_300_lines():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 300}
    assert not long, f"files over 300 lines: {long}"


def test_the_import_walk_sees_function_level_imports(tmp_path):
    source = tmp_path / "example.py"
    source.write_text("def f():\n    from minibatch.sim import clock\n    import minibatch.analysis.sla\n")
    assert {"minibatch.sim", "minibatch.sim.clock", "minibatch.analysis.sla"} <= set(imported_modules(source))
