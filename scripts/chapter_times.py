"""Print how long each notebook took under nbval, and the total, from pytest's JUnit XML report.

`make test-notebooks` writes the report to test-artifacts/notebooks.xml and then runs this script:

    python scripts/chapter_times.py [test-artifacts/notebooks.xml]
"""
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def notebook_seconds(report: Path) -> dict[str, float]:
    """Seconds per notebook: the sum of its cells' test times."""
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(report).getroot().iter("testcase"):
        notebook = case.get("classname", "")            # "notebooks.01_why_batch.ipynb": folders joined by dots
        if notebook.endswith(".ipynb"):
            notebook = notebook.removesuffix(".ipynb").replace(".", "/") + ".ipynb"
        seconds[notebook] += float(case.get("time", 0.0))
    return dict(seconds)


def main() -> int:
    report = Path(sys.argv[1] if len(sys.argv) > 1 else "test-artifacts/notebooks.xml")
    if not report.is_file():
        print(f"no report at {report}: run `make test-notebooks` first")
        return 1
    seconds = notebook_seconds(report)
    print(f"{'notebook':<48} {'seconds':>8}")
    for notebook, s in sorted(seconds.items()):
        print(f"{notebook:<48} {s:8.1f}")
    print(f"{'total':<48} {sum(seconds.values()):8.1f}  ({sum(seconds.values()) / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
