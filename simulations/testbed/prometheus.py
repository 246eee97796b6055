"""A real Prometheus (Debian's ``prometheus``) for the benchmarks and the tests,
scraping the given targets every second (see ``local_server``).

Example::

    with Exporter(text) as exp, PrometheusServer({"dcgm": [exp.address]}) as prom:
        prom.wait_for('DCGM_FI_DEV_GPU_UTIL', lambda r: len(r) == 2)
        prom.query("up")      # the result vector

Costs ~0.3 s to start and ~60 MB of memory.
"""
from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request

from .local_server import LocalServer, free_port

BINARY = "/usr/bin/prometheus"

__all__ = ["BINARY", "PrometheusServer", "config_text", "free_port"]


def config_text(targets: dict[str, list[str]], honor_labels: tuple[str, ...] = ()) -> str:
    """A scrape config: each job's targets every second; ``honor_labels`` jobs keep
    the labels their targets export (a training job's own ``job`` label)."""
    jobs = [{"job_name": job, "scrape_interval": "1s", "honor_labels": job in honor_labels,
             "static_configs": [{"targets": list(addresses)}]} for job, addresses in targets.items()]
    return json.dumps({"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": jobs})


class PrometheusServer(LocalServer):
    binary, config_name = BINARY, "prometheus.yml"

    def __init__(self, targets: dict[str, list[str]], honor_labels: tuple[str, ...] = (),
                 start_timeout: float = 30.0) -> None:
        super().__init__(config_text(targets, honor_labels), start_timeout, prefix="rxprom-")   # JSON is YAML

    def flags(self, port: int) -> list[str]:
        return [f"--config.file={self.config_path}", f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"]

    def query(self, expr: str) -> list[dict]:
        """The result of an instant query, as the HTTP API returns it."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.load(response)["data"]["result"]

    def wait_for(self, expr: str, ready, timeout: float = 60.0) -> list[dict]:
        """The result of ``expr`` once ``ready(result)`` holds (the targets scraped);
        AssertionError with the last result and the targets' health otherwise."""
        deadline = time.monotonic() + timeout
        result: list[dict] = []
        while time.monotonic() < deadline:
            result = self.query(expr)
            if ready(result):
                return result
            time.sleep(0.2)
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=5) as response:
            active = json.load(response)["data"]["activeTargets"]
        targets = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in active]
        raise AssertionError(f"{expr}: not ready after {timeout:g}s; last result {result}; targets {targets}")
