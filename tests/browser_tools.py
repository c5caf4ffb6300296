"""What the browser test needs around Playwright: a JupyterLab server on a free loopback port, headless
Chromium, and the few things a learner does in a notebook (open it, run all, move a slider, flip a
switch), each waiting until the kernel has answered.

The server gets its own settings folder (notebooks render every cell, no news pop-up), so what a
user changed in their own JupyterLab never reaches the test.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

# the flags that let Chromium run headless in a container, alone, without reaching out to the network
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--no-first-run"]
# JupyterLab settings for the test server: every cell stays in the page (no virtual scrolling), so the
# whole notebook can be read from the DOM; no news or update checks (there is no network)
LAB_SETTINGS = {"@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
                "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False}}
SERVER_START_S = 120   # seconds JupyterLab may take to answer (a cold start on a busy 2-core machine)


def chromium_path() -> str | None:
    """The system's Chromium (Debian's package), or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterLab:
    """`jupyter lab` over `root` as a subprocess, on a free loopback port with a random token."""

    def __init__(self, root: Path, state: Path, log: Path):
        self.root, self.port, self.token = root, free_port(), secrets.token_hex(16)
        settings = state / "settings"
        for plugin, values in LAB_SETTINGS.items():
            package, name = plugin.rsplit("/", 1)
            (settings / package).mkdir(parents=True, exist_ok=True)
            (settings / package / f"{name}.jupyterlab-settings").write_text(json.dumps(values))
        command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip", "127.0.0.1", f"--port={self.port}",
                   f"--ServerApp.token={self.token}", f"--ServerApp.root_dir={root}",
                   "--ContentsManager.allow_hidden=True",   # the test's copies live in a hidden folder
                   f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={state / 'workspaces'}"]
        if os.geteuid() == 0:
            command.append("--allow-root")     # Jupyter refuses root otherwise (containers, CI)
        self.log = log.open("w")
        self.process = subprocess.Popen(command, cwd=root, stdout=self.log, stderr=subprocess.STDOUT)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}"

    def wait_ready(self) -> None:
        """Block until the server answers its status API; raise if it exits or takes too long."""
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with code {self.process.returncode}; see {self.log.name}")
            try:
                with urllib.request.urlopen(self.url("api/status"), timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"jupyter lab did not answer within {SERVER_START_S} s; see {self.log.name}")

    def shutdown_kernels(self) -> None:
        """Shut down every kernel the server runs (a chapter's kernel holds the model: gigabytes)."""
        with urllib.request.urlopen(self.url("api/kernels"), timeout=30) as response:
            kernels = json.load(response)
        for kernel in kernels:
            request = urllib.request.Request(self.url(f"api/kernels/{kernel['id']}"), method="DELETE")
            urllib.request.urlopen(request, timeout=60).close()

    def stop(self) -> None:
        """Stop the server (its kernels with it); kill it if it does not stop within 30 s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def open_notebook(page, lab: JupyterLab, path: str, timeout_s: float) -> None:
    """Open the notebook at `path` (relative to the server's root) alone in a workspace of its own (JupyterLab
    would otherwise reopen the notebooks of the last page, with their stale outputs), and wait for its kernel
    to be idle."""
    workspace = re.sub(r"\W", "-", Path(path).stem)
    page.goto(lab.url(f"lab/workspaces/{workspace}/tree/{path}"), timeout=timeout_s * 1000)
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=timeout_s * 1000)
    wait_idle(page, timeout_s)
    opened = page.locator(".jp-NotebookPanel").count()
    assert opened == 1, f"{opened} notebooks open in the page, expected {path} alone"


def wait_idle(page, timeout_s: float) -> None:
    """Wait until the kernel is connected and idle (the status bar says so) and no cell is queued or
    running (no `[*]` prompt)."""
    page.wait_for_function(
        """() => {
            const bar = document.querySelector('.jp-StatusBar-Widget');
            const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')];
            return bar && bar.innerText.includes('| Idle') && prompts.every(p => !p.textContent.includes('*'));
        }""", timeout=timeout_s * 1000, polling=500)


def run_all(page, timeout_s: float) -> None:
    """Run > Run All Cells from the menu bar, then wait until every cell has run."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^Run$")).click()
    page.locator("li[data-command='runmenu:run-all']").click()
    page.locator(".jp-CodeCell .jp-InputArea-prompt", has_text="*").first.wait_for(timeout=30_000)
    wait_idle(page, timeout_s)


def save(page, file: Path, timeout_s: float = 60) -> dict:
    """Save the notebook open in `page` (File > Save) and return it as read back from `file`."""
    before = file.stat().st_mtime_ns
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^File$")).click()
    page.locator("li[data-command='docmanager:save']").click()
    deadline = time.monotonic() + timeout_s
    while file.stat().st_mtime_ns == before:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{file} was not saved within {timeout_s} s")
        time.sleep(0.2)
    time.sleep(0.5)                              # let the write finish
    return json.loads(file.read_text())


def prompts(page) -> list[str]:
    """The execution prompt of every code cell, as shown: '[3]:', '[ ]:' for a cell that never ran."""
    return [p.strip() for p in page.locator(".jp-CodeCell .jp-InputArea-prompt").all_inner_texts()]


def error_outputs(page) -> list[str]:
    """The text of every output that shows a Python exception (a traceback, or the `Name: message` line
    JupyterLab prints for an error); warnings and progress bars on stderr are not errors."""
    texts = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts()
    texts += page.locator("[data-mime-type='application/vnd.jupyter.error']").all_inner_texts()
    widget_errors = page.locator(".jp-OutputArea-output", has_text="Error displaying widget").all_inner_texts()
    return [t for t in texts if "Traceback" in t or re.match(r"\w*(Error|Exception)\b", t)] + widget_errors


def widget(page, kind: str, description: str):
    """The one ipywidget of CSS class `kind` (e.g. 'widget-slider') whose description is `description`."""
    label = page.locator(".widget-label, .widget-label-basic", has_text=re.compile(f"^{re.escape(description)}$"))
    found = page.locator(f".{kind}", has=label)
    assert found.count() == 1, f"expected one {kind} described {description!r}, found {found.count()}"
    return found


def readout(slider) -> str:
    """What a slider shows next to its handle."""
    return slider.locator(".widget-readout").inner_text().strip()


def press_on_handle(slider, key: str, times: int = 1) -> None:
    """Focus a slider's handle and press `key` on it (ArrowRight, ArrowLeft, PageUp, Home, End ...)."""
    handle = slider.locator(".noUi-handle")
    handle.focus()
    for _ in range(times):
        handle.press(key)


def image_digest(image) -> str:
    """SHA-256 of the bytes an <img> shows (a widget image's src is a blob: URL, new on every value)."""
    data = image.evaluate("""async img => {
        const bytes = new Uint8Array(await (await fetch(img.src)).arrayBuffer());
        return Array.from(bytes);
    }""")
    return hashlib.sha256(bytes(data)).hexdigest()


def table_rows(html_widget) -> list[dict[str, str]]:
    """The rows of the HTML table in a widget, as {header: cell text}."""
    rows = html_widget.locator("table tr").all()
    headers = [h.strip() for h in rows[0].locator("th").all_inner_texts()]
    return [dict(zip(headers, (c.strip() for c in row.locator("td").all_inner_texts()))) for row in rows[1:]]


def wait_until(predicate, timeout_s: float, what: str) -> None:
    """Poll `predicate()` until it is true; `what` names it in the error."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(0.5)


def wait_changed(read, before, timeout_s: float, what: str):
    """Poll `read()` until it differs from `before`; returns the new value."""
    wait_until(lambda: read() != before, timeout_s, f"{what} did not change")
    return read()
