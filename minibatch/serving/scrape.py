"""Reading a server's /metrics from the outside: one scrape, or a thread sampling it while load runs.

Names are kept without their prefix (`minibatch:num_requests_waiting` becomes
`num_requests_waiting`), so the same code reads vLLM (`vllm:`) too. Samples that differ only in
their labels (one per model, per finish reason) are summed.
"""
from __future__ import annotations

import threading
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

GAUGES = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")   # what a load test watches


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {sample name without prefix: value summed over labels}."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.split(":", 1)[-1]
            values[name] = values.get(name, 0.0) + sample.value
    return values


def scrape(url: str, client: httpx.Client | None = None) -> dict[str, float]:
    """GET {url}/metrics, parsed. Pass a `client` when scraping often: a new one costs a TLS setup's CPU."""
    response = (client or httpx).get(url.rstrip("/") + "/metrics", timeout=10)
    return parse_metrics(response.raise_for_status().text)


class MetricsSampler:
    """Scrape `url` every `every_s` seconds in a background thread while the `with` block runs.

        with MetricsSampler(server.url) as sampler:
            loadtest.run(server.url, workload)
        sampler.series("num_requests_waiting")   # (times in s since start, values)
    """

    def __init__(self, url: str, every_s: float = 0.25):
        self.url, self.every_s = url, every_s
        self.samples: list[tuple[float, dict[str, float]]] = []   # (seconds since start, scrape)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-sampler", daemon=True)

    def _run(self) -> None:
        start = time.perf_counter()
        with httpx.Client() as client:
            while True:
                self.samples.append((time.perf_counter() - start, scrape(self.url, client)))
                if self._stop.wait(self.every_s):
                    return

    def series(self, name: str) -> tuple[list[float], list[float]]:
        return [t for t, _ in self.samples], [s.get(name, 0.0) for _, s in self.samples]

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
