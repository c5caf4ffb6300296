"""The course's panels in a real browser: JupyterLab in headless Chromium runs chapters 04 and 10 from
the menu, then the test moves the batching sliders and flips the edge-mode switch as a learner would
and checks that each panel's figure and metrics table changed, and that no cell shows an error.

The chapters run as copies in a hidden folder under the repository (deleted afterwards), so the
committed notebooks never get outputs. Screenshots before and after every move are saved under
test-artifacts/browser/, with the server's log. Skipped where Chromium or Playwright is missing.
"""
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.browser_tools import (CHROMIUM_ARGS, JupyterLab, chromium_path, error_outputs, image_digest, open_notebook,
                                 press_on_handle, prompts, readout, run_all, save, table_rows, wait_changed, wait_idle,
                                 wait_until, widget)

sync_api = pytest.importorskip("playwright.sync_api", reason="the Python package playwright is not installed "
                               "(pip install -r requirements.txt)")
if chromium_path() is None:
    pytest.skip("no chromium on PATH (Debian: apt-get install chromium); the browser test needs it",
                allow_module_level=True)

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHAPTER_S = 2400   # seconds a chapter may take to run all its cells (ch. 09 runs the real model for minutes on 2 cores,
                   # many more on a machine busy with other work)
REDRAW_S = 300     # seconds a panel may take to rerun and redraw after one move
METRICS = ("throughput (tok/s)", "mean batch", "p50 TTFT (s)", "p99 TTFT (s)", "p50 TPOT (s)", "p99 e2e (s)")


@pytest.fixture(scope="module")
def copies():
    """A hidden folder under the repository holding copies of the chapters; deleted afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=".browser-test-", dir=ROOT))
    for name in ("04_throughput_vs_latency.ipynb", "10_edge_batch_of_one.ipynb"):
        shutil.copy(ROOT / "notebooks" / name, folder / name)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def lab(copies, tmp_path_factory):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    server = JupyterLab(ROOT, tmp_path_factory.mktemp("jupyterlab"), ARTIFACTS / "jupyterlab.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser, lab):
    """A fresh tab; the JavaScript errors it raises are collected in `page.js_errors`. Afterwards the tab
    closes and the chapter's kernel shuts down."""
    tab = browser.new_page(viewport={"width": 1400, "height": 1400})
    tab.js_errors = []
    tab.on("pageerror", lambda error: tab.js_errors.append(str(error)))
    try:
        yield tab
    finally:
        tab.close()
        lab.shutdown_kernels()


def screenshot(page, panel, name: str) -> None:
    """Scroll `panel` into view and save the page as test-artifacts/browser/<name>.png."""
    panel.scroll_into_view_if_needed()
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=path, full_page=True)
    print(f"screenshot: {path}")


def run_chapter(page, lab, copies, name: str) -> None:
    """Open the copy of a chapter, Run > Run All Cells, and check every cell ran without an error."""
    open_notebook(page, lab, f"{copies.name}/{name}", timeout_s=300)
    try:
        run_all(page, timeout_s=CHAPTER_S)
    except Exception:
        screenshot(page, page.locator(".jp-Notebook"), f"{name[:2]}-run-all-failed")
        raise
    shown = prompts(page)
    assert all(re.fullmatch(r"\[\d+\]:", p) for p in shown), f"cells that did not run: {shown}"
    assert not error_outputs(page), error_outputs(page)
    saved = save(page, copies / name)
    errors = [o for cell in saved["cells"] for o in cell.get("outputs", []) if o["output_type"] == "error"]
    assert not errors, [f"{o['ename']}: {o['evalue']}" for o in errors]


def panel_parts(page, control):
    """The output that holds `control`, its metrics (the HTML widget with a table) and its figure."""
    panel = page.locator(".jp-OutputArea-output", has=control)
    metrics, image = panel.locator(".widget-html", has=page.locator("table")), panel.locator("img.widget-image")
    assert panel.count() == 1 and metrics.count() == 1 and image.count() == 1
    return panel, metrics, image


def move(page, slider, key: str, times: int, metrics, column: str) -> dict:
    """Press `key` on a slider's handle, wait until the table's last row (the current setting) is the
    slider's new value, and return that row."""
    before = readout(slider)
    press_on_handle(slider, key, times)
    after = readout(slider)                  # the handle moves with the key, before the kernel answers
    assert after != before, f"{key} did not move the {column} slider"
    wait_until(lambda: float(table_rows(metrics)[-1][column]) == float(after), REDRAW_S,
               f"the table's last row shows {column} = {after}")
    wait_idle(page, REDRAW_S)
    return table_rows(metrics)[-1]


def test_batching_panel_follows_its_sliders(page, lab, copies):
    run_chapter(page, lab, copies, "04_throughput_vs_latency.ipynb")
    size, timeout = widget(page, "widget-slider", "max batch size"), widget(page, "widget-slider", "batch timeout (s)")
    panel, metrics, image = panel_parts(page, size)
    first = table_rows(metrics)
    assert len(first) == 1 and float(first[0]["max batch"]) == float(readout(size))
    figure = image_digest(image)
    screenshot(page, panel, "04-before")

    row = move(page, timeout, "PageUp", 2, metrics, "timeout (s)")      # 0.00 -> 0.50: an idle engine waits
    screenshot(page, panel, "04-after-timeout")
    assert float(row["timeout (s)"]) > float(first[0]["timeout (s)"])
    assert [row[m] for m in METRICS] != [first[0][m] for m in METRICS], "the metrics did not follow the timeout"
    assert image_digest(image) != figure, "the figure did not follow the timeout"
    figure = image_digest(image)

    row = move(page, size, "Home", 1, metrics, "max batch")             # down to a batch of one
    screenshot(page, panel, "04-after-batch-size")
    assert row["max batch"] == "1" and float(row["mean batch"]) == 1.0
    assert float(row["p50 TTFT (s)"]) > float(first[0]["p50 TTFT (s)"]), "a batch of one makes requests queue"
    assert image_digest(image) != figure, "the figure did not follow the batch size"
    assert table_rows(metrics)[0] == first[0], "the table keeps the earlier settings"
    assert not error_outputs(page) and not page.js_errors, (error_outputs(page), page.js_errors)


def test_edge_switch_redraws_the_lanes(page, lab, copies):
    run_chapter(page, lab, copies, "10_edge_batch_of_one.ipynb")
    switch = widget(page, "widget-checkbox", "edge mode")
    panel, metrics, image = panel_parts(page, switch)
    checkbox = switch.locator("input[type=checkbox]")
    server_figure, server_metrics = image_digest(image), metrics.inner_text()
    assert not checkbox.is_checked() and "the lanes show server" in server_metrics
    screenshot(page, panel, "09-before")

    checkbox.click()
    edge_metrics = wait_changed(metrics.inner_text, server_metrics, REDRAW_S, "the metrics after the switch")
    wait_idle(page, REDRAW_S)
    screenshot(page, panel, "09-after-edge-on")
    assert checkbox.is_checked() and "the lanes show edge (batch of one)" in edge_metrics
    assert image_digest(image) != server_figure, "the figure did not follow the switch"
    rows = {row["mode"]: row for row in table_rows(metrics)}
    edge, server = rows["edge (batch of one)"], next(r for mode, r in rows.items() if mode.startswith("server"))
    assert float(edge["mean batch"]) == 1.0 < float(server["mean batch"])
    assert float(edge["p50 queue (s)"]) > float(server["p50 queue (s)"]), "edge mode queues later arrivals"

    checkbox.click()
    wait_changed(metrics.inner_text, edge_metrics, REDRAW_S, "the metrics after switching back")
    wait_idle(page, REDRAW_S)
    screenshot(page, panel, "09-after-edge-off")
    assert metrics.inner_text() == server_metrics and image_digest(image) == server_figure, "switching back restores"
    assert not error_outputs(page) and not page.js_errors, (error_outputs(page), page.js_errors)
