"""A real Alertmanager (Debian's ``prometheus-alertmanager``) for the testbed, the
benchmarks and the tests, the receiver a remediation's escalation alert
reaches (see ``local_server``). Clustering is off.

Example::

    with Alertmanager() as am:
        post(am.url + "/api/v2/alerts", [...])
        am.alerts()        # GET /api/v2/alerts

    Alertmanager(webhook_config("http://127.0.0.1:8080/hook", group_wait="30s"))

Costs ~1 s to start and ~20 MB of memory.
"""
from __future__ import annotations

import json
import shutil
import urllib.request

from .local_server import LocalServer, free_port

BINARY = "/usr/bin/prometheus-alertmanager"
CONFIG = """\
route:
  receiver: "null"
receivers:
  - name: "null"
"""

__all__ = ["BINARY", "CONFIG", "Alertmanager", "free_port", "webhook_config"]


def webhook_config(url: str, group_wait: str, group_by: tuple[str, ...] = ("alertname",),
                   group_interval: str = "5m", repeat_interval: str = "4h") -> str:
    """One route to one webhook receiver, notified ``group_wait`` after a group's
    first alert (Alertmanager's defaults for the other two)."""
    return json.dumps({"route": {"receiver": "hook", "group_by": list(group_by), "group_wait": group_wait,
                                 "group_interval": group_interval, "repeat_interval": repeat_interval},
                       "receivers": [{"name": "hook", "webhook_configs": [{"url": url, "send_resolved": False}]}]})


class Alertmanager(LocalServer):
    binary, config_name = BINARY, "alertmanager.yml"

    def __init__(self, config: str = CONFIG, start_timeout: float = 30.0) -> None:
        super().__init__(config, start_timeout, prefix="rxam-")

    def flags(self, port: int) -> list[str]:
        return [f"--config.file={self.config_path}", f"--storage.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="]

    def reset(self) -> None:
        """Stop, forget every group, silence and notification, start again on the same port."""
        self.stop()
        shutil.rmtree(self.dir / "data", ignore_errors=True)
        self.start()

    def alerts(self) -> list[dict]:
        """Active alerts as ``GET /api/v2/alerts`` returns them (resolved ones drop out)."""
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts", timeout=5) as response:
            return json.load(response)
