"""A real Prometheus (Debian's ``prometheus``) for the benchmarks and the tests,
scraping the given targets every second, or at the given intervals with
alerting rules sent to an Alertmanager (see ``local_server``).

Example::

    with Exporter(text) as exp, PrometheusServer({"dcgm": [exp.address]}) as prom:
        prom.wait_for('DCGM_FI_DEV_GPU_UTIL', lambda r: len(r) == 2)
        prom.query("up")      # the result vector

    PrometheusServer({"node": [addr]}, scrape="15s", evaluation="15s", rules=RULES_YAML,
                     alertmanager="127.0.0.1:9093")

Costs ~0.3 s to start and ~60 MB of memory.
"""
from __future__ import annotations

import json
import signal
import time
import urllib.parse
import urllib.request

from .local_server import LocalServer, free_port

BINARY = "/usr/bin/prometheus"

__all__ = ["BINARY", "PrometheusServer", "config_text", "free_port"]


def config_text(targets: dict[str, list[str]], honor_labels: tuple[str, ...] = (), *, scrape: str = "1s",
                evaluation: str = "1s", rule_files: tuple[str, ...] = (), alertmanager: str | None = None) -> str:
    """A scrape config: each job's targets every ``scrape``; ``honor_labels`` jobs keep
    the labels their targets export (a training job's own ``job`` label); rules
    evaluated every ``evaluation``, their alerts sent to ``alertmanager`` (host:port)."""
    jobs = [{"job_name": job, "scrape_interval": scrape, "honor_labels": job in honor_labels,
             "static_configs": [{"targets": list(addresses)}]} for job, addresses in targets.items()]
    doc = {"global": {"scrape_interval": scrape, "evaluation_interval": evaluation}, "scrape_configs": jobs}
    if rule_files:
        doc["rule_files"] = list(rule_files)
    if alertmanager:
        doc["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    return json.dumps(doc)


class PrometheusServer(LocalServer):
    binary, config_name = BINARY, "prometheus.yml"

    def __init__(self, targets: dict[str, list[str]], honor_labels: tuple[str, ...] = (),
                 start_timeout: float = 30.0, *, scrape: str = "1s", evaluation: str = "1s",
                 rules: str | None = None, alertmanager: str | None = None) -> None:
        super().__init__("", start_timeout, prefix="rxprom-")
        rule_files = ()
        if rules is not None:
            (self.dir / "rules.yml").write_text(rules)
            rule_files = (str(self.dir / "rules.yml"),)
        self.config_path.write_text(config_text(targets, honor_labels, scrape=scrape, evaluation=evaluation,
                                                rule_files=rule_files, alertmanager=alertmanager))  # JSON is YAML

    def flags(self, port: int) -> list[str]:
        return [f"--config.file={self.config_path}", f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"]

    def reload_rules(self, rules: str, loaded, timeout: float = 30.0) -> None:
        """Write a new rule file and reload it (SIGHUP), returning once ``loaded(groups)``
        holds for the rule groups the HTTP API reports."""
        (self.dir / "rules.yml").write_text(rules)
        self.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"{self.url}/api/v1/rules", timeout=5) as response:
                if loaded(json.load(response)["data"]["groups"]):
                    return
            time.sleep(0.1)
        raise RuntimeError(f"prometheus did not load the new rules within {timeout:g} s:\n{self.log()[-2000:]}")

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
