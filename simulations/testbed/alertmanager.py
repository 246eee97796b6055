"""A real Alertmanager (Debian's ``prometheus-alertmanager``) for the testbed and
the tests, the receiver a remediation's escalation alert reaches: started on
a free loopback port with its own config and storage in a temp dir, ready when
``/-/ready`` answers, stopped and removed on exit. Clustering is off.

Example::

    with Alertmanager() as am:
        post(am.url + "/api/v2/alerts", [...])
        am.alerts()        # GET /api/v2/alerts

Costs ~1 s to start and ~20 MB of memory.
"""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

BINARY = "/usr/bin/prometheus-alertmanager"
CONFIG = """\
route:
  receiver: "null"
receivers:
  - name: "null"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Alertmanager:
    def __init__(self, start_timeout: float = 30.0) -> None:
        self.start_timeout = start_timeout
        self.dir = Path(tempfile.mkdtemp(prefix="rxam-"))
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> "Alertmanager":
        (self.dir / "alertmanager.yml").write_text(CONFIG)
        try:
            for _ in range(3):          # a free port can be taken before the server binds it
                if self._start(free_port()):
                    return self
            raise RuntimeError(f"alertmanager did not start:\n{self.log()}")
        except BaseException:
            self.__exit__()
            raise

    def _start(self, port: int) -> bool:
        self.url = f"http://127.0.0.1:{port}"
        with open(self.dir / "log", "ab") as log:
            self.proc = subprocess.Popen(
                [BINARY, f"--config.file={self.dir / 'alertmanager.yml'}", f"--storage.path={self.dir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
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
        self._stop()
        return False

    def log(self) -> str:
        path = self.dir / "log"
        return path.read_text(errors="replace") if path.exists() else ""

    def alerts(self) -> list[dict]:
        """Active alerts as ``GET /api/v2/alerts`` returns them (resolved ones drop out)."""
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts", timeout=5) as response:
            return json.load(response)

    def _stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __exit__(self, *exc) -> None:
        self._stop()
        shutil.rmtree(self.dir, ignore_errors=True)
