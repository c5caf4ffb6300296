"""A server in a child process: started with a command line, ready when its `/health` answers 200,
stopped with SIGTERM (the graceful path), and never left behind when the parent ends.

`ServerProcess` (minibatch's own server) and `VllmServer` (vLLM's, for side-by-side runs) are both one.
"""
from __future__ import annotations

import atexit
import ctypes
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx


def _die_with_parent() -> None:
    """In the child, before exec (Linux): get SIGTERM if the parent dies, even if it is killed."""
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)       # 1 = PR_SET_PDEATHSIG


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ChildServer:
    """Run `command` (which serves on `url`) until stopped; the constructor returns once it is healthy."""

    busy_after_s = 0.0        # seconds its processes keep a core busy after a request (a run after it waits)

    def __init__(self, command: list[str], url: str, env: dict, ready_timeout_s: float, log_prefix: str):
        self.url = url
        self.log = tempfile.NamedTemporaryFile("w+", prefix=log_prefix, suffix=".log")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                        preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        atexit.register(self.stop)        # never leave a server behind when this process ends
        self.wait_ready(ready_timeout_s)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def failure(self) -> str:
        """The log's error lines (the root cause is often far above its end), then its last lines."""
        text = self.output()
        causes = [line for line in text.splitlines() if "Error:" in line][:5]
        return "\n".join(causes + ["...", text[-3000:]]) if causes else text[-3000:]

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with status {self.process.returncode}:\n{self.failure()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the server did not become healthy in {timeout_s} s:\n{self.failure()}")

    def stop(self, timeout_s: float = 60) -> int:
        """SIGTERM, then wait for a graceful exit (kill after timeout_s); returns the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        self.log.close()
