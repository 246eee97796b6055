"""A real Prometheus (Debian's ``prometheus``) for the tests: started on a free
loopback port with its own config and TSDB in a temp dir, scraping the given
targets every second, ready when ``/-/ready`` answers; stopped and removed on
exit. ``stop()`` and ``start()`` take it down and bring it back on the same port
and data (an outage the PromQL source must ride out).

Example::

    with Exporter(text) as exp, PrometheusServer({"dcgm": [exp.address]}) as prom:
        prom.wait_for('DCGM_FI_DEV_GPU_UTIL', lambda r: len(r) == 2)
        prom.query("up")      # the result vector

Costs ~0.3 s to start and ~60 MB of memory.
"""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

BINARY = "/usr/bin/prometheus"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config_text(targets: dict[str, list[str]], honor_labels: tuple[str, ...] = ()) -> str:
    """A scrape config: each job's targets every second; ``honor_labels`` jobs keep
    the labels their targets export (a training job's own ``job`` label)."""
    jobs = [{"job_name": job, "scrape_interval": "1s", "honor_labels": job in honor_labels,
             "static_configs": [{"targets": list(addresses)}]} for job, addresses in targets.items()]
    return json.dumps({"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": jobs})


class PrometheusServer:
    def __init__(self, targets: dict[str, list[str]], honor_labels: tuple[str, ...] = (),
                 start_timeout: float = 30.0) -> None:
        self.start_timeout = start_timeout
        self.dir = Path(tempfile.mkdtemp(prefix="rxprom-"))
        (self.dir / "prometheus.yml").write_text(config_text(targets, honor_labels))   # JSON is YAML
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.url = ""

    def __enter__(self) -> "PrometheusServer":
        try:
            for _ in range(3):          # a free port can be taken before the server binds it
                if self._start(free_port()):
                    return self
            raise RuntimeError(f"prometheus did not start:\n{self.log()}")
        except BaseException:
            self.__exit__()
            raise

    def _start(self, port: int) -> bool:
        self.port, self.url = port, f"http://127.0.0.1:{port}"
        with open(self.dir / "log", "ab") as log:
            self.proc = subprocess.Popen(
                [BINARY, f"--config.file={self.dir / 'prometheus.yml'}", f"--storage.tsdb.path={self.dir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return True
            except OSError:
                time.sleep(0.1)
        self.stop()
        return False

    def start(self) -> None:
        """Bring a stopped server back on its port, with its data."""
        if not self._start(self.port):
            raise RuntimeError(f"prometheus did not restart on port {self.port}:\n{self.log()}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        path = self.dir / "log"
        return path.read_text(errors="replace") if path.exists() else ""

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

    def __exit__(self, *exc) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
