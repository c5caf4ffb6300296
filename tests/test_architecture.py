"""The package's shape: the engine imports nothing above it, the top level stays small, files stay short."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "minibatch"
ABOVE_ENGINE = ("sim", "workloads", "analysis", "serving", "bench", "viz", "widgets", "checks", "llm")


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


def test_engine_imports_nothing_above_it():
    wrong = []
    for path in sorted((PACKAGE / "engine").rglob("*.py")):
        for name in imported_modules(path):
            parts = name.split(".")
            if parts[0] == "minibatch" and len(parts) > 1 and parts[1] in ABOVE_ENGINE:
                wrong.append(f"{path.relative_to(PACKAGE.parent)} imports {name}")
    assert not wrong, "the engine must not import the wings above it:\n" + "\n".join(wrong)


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
