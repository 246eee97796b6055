"""A server of the Prometheus family (one binary, one config file) run for the
testbed, the benchmarks and the tests: started on a free loopback port with its
config and data in a temp dir, ready when ``/-/ready`` answers, stopped and
removed on exit. ``stop()`` and ``start()`` take it down and bring it back on the
same port and data. Subclasses name the binary, the config file and the flags.

Example::

    class Alertmanager(LocalServer):
        binary, config_name = "/usr/bin/prometheus-alertmanager", "alertmanager.yml"
        def flags(self, port): return [f"--web.listen-address=127.0.0.1:{port}", ...]

    with Alertmanager(CONFIG) as am:
        urllib.request.urlopen(am.url + "/api/v2/alerts")

Overhead: the server's own (Prometheus ~60 MB, Alertmanager ~20 MB); starting
polls ``/-/ready`` every 0.1 s.
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    """A loopback TCP port free now (another process may take it before it is bound)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    binary = ""
    config_name = ""

    def __init__(self, config: str, start_timeout: float = 30.0, prefix: str = "rxsrv-") -> None:
        self.start_timeout = start_timeout
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.config_path = self.dir / self.config_name
        self.config_path.write_text(config)
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.url = ""

    def flags(self, port: int) -> list[str]:
        """The command-line flags after the binary for listening on ``port``."""
        raise NotImplementedError

    def __enter__(self):
        try:
            for _ in range(3):          # a free port can be taken before the server binds it
                if self._start(free_port()):
                    return self
            raise RuntimeError(f"{Path(self.binary).name} did not start:\n{self.log()}")
        except BaseException:
            self.__exit__()
            raise

    def _start(self, port: int) -> bool:
        self.port, self.url = port, f"http://127.0.0.1:{port}"
        with open(self.dir / "log", "ab") as log:
            self.proc = subprocess.Popen([self.binary, *self.flags(port)], stdout=log, stderr=subprocess.STDOUT)
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
            raise RuntimeError(f"{Path(self.binary).name} did not restart on port {self.port}:\n{self.log()}")

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

    def __exit__(self, *exc) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
