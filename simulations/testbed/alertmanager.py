"""A real Alertmanager (Debian's ``prometheus-alertmanager``) for the testbed, the
benchmarks and the tests, the receiver a remediation's escalation alert
reaches (see ``local_server``). Clustering is off.

Example::

    with Alertmanager() as am:
        post(am.url + "/api/v2/alerts", [...])
        am.alerts()        # GET /api/v2/alerts

Costs ~1 s to start and ~20 MB of memory.
"""
from __future__ import annotations

import json
import urllib.request

from .local_server import LocalServer, free_port

BINARY = "/usr/bin/prometheus-alertmanager"
CONFIG = """\
route:
  receiver: "null"
receivers:
  - name: "null"
"""

__all__ = ["BINARY", "CONFIG", "Alertmanager", "free_port"]


class Alertmanager(LocalServer):
    binary, config_name = BINARY, "alertmanager.yml"

    def __init__(self, config: str = CONFIG, start_timeout: float = 30.0) -> None:
        super().__init__(config, start_timeout, prefix="rxam-")

    def flags(self, port: int) -> list[str]:
        return [f"--config.file={self.config_path}", f"--storage.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="]

    def alerts(self) -> list[dict]:
        """Active alerts as ``GET /api/v2/alerts`` returns them (resolved ones drop out)."""
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts", timeout=5) as response:
            return json.load(response)
