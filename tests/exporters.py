"""Small real exporters for the tests: HTTP servers on free loopback ports that
serve ``/metrics`` in the Prometheus text format, for a real Prometheus to
scrape.

- ``DcgmExporter``: shaped like NVIDIA dcgm-exporter, with its metric names and
  labels (``DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-...",device="nvidia0",
  modelName="...",Hostname="...",DCGM_FI_DRIVER_VERSION="..."}``), per GPU.
- ``RankExporter``: one training rank's step signals as a node's controller
  exports them (``reflexarc_step_time_seconds``,
  ``reflexarc_step_pre_collective_seconds`` with ``job``, ``rank`` and
  ``node``) for the ranks to be compared (scrape it with honor_labels).

Values are set at any time and served from the next scrape on.

Example::

    with DcgmExporter("node-a", {0: 87.0, 1: 12.0}) as dcgm:
        dcgm.address          # "127.0.0.1:40411": a scrape target
        dcgm.set(1, 93.0)

Costs one thread per exporter; a scrape renders a few lines.
"""
from __future__ import annotations

import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Exporter:
    """Serves ``self.render()`` at ``/metrics``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.address = ""

    def render(self) -> str:
        raise NotImplementedError

    def __enter__(self):
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                with exporter._lock:
                    body = exporter.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:     # scrapes every second: keep the test output clean
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="test-exporter", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=10)


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


class DcgmExporter(Exporter):
    MODEL = "NVIDIA H100 80GB HBM3"
    DRIVER = "550.54.15"

    def __init__(self, hostname: str, utilisation: dict[int, float]) -> None:
        super().__init__()
        self.hostname = hostname
        self.utilisation = dict(utilisation)

    def set(self, gpu: int, value: float) -> None:
        with self._lock:
            self.utilisation[gpu] = value

    def render(self) -> str:
        lines = ["# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).", "# TYPE DCGM_FI_DEV_SM_CLOCK gauge"]
        series = {gpu: _labels(gpu=str(gpu), UUID=f"GPU-{zlib.crc32(self.hostname.encode()):08x}-4b1e-9c3a-{gpu:012x}",
                               device=f"nvidia{gpu}", modelName=self.MODEL, Hostname=self.hostname,
                               DCGM_FI_DRIVER_VERSION=self.DRIVER)
                  for gpu in sorted(self.utilisation)}
        lines += [f"DCGM_FI_DEV_SM_CLOCK{labels} 1980" for labels in series.values()]
        lines += ["# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).", "# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
        lines += [f"DCGM_FI_DEV_GPU_UTIL{series[gpu]} {value:g}" for gpu, value in sorted(self.utilisation.items())]
        return "\n".join(lines) + "\n"


class RankExporter(Exporter):
    def __init__(self, job: str, rank: int, node: str, pre_collective_ms: float, step_ms: float) -> None:
        super().__init__()
        self.job, self.rank, self.node = job, rank, node
        self.pre_collective_ms, self.step_ms = pre_collective_ms, step_ms

    def set(self, pre_collective_ms: float) -> None:
        with self._lock:
            self.pre_collective_ms = pre_collective_ms

    def render(self) -> str:
        labels = _labels(job=self.job, rank=str(self.rank), node=self.node)
        return ("# HELP reflexarc_step_time_seconds Training step time.\n"
                "# TYPE reflexarc_step_time_seconds gauge\n"
                f"reflexarc_step_time_seconds{labels} {self.step_ms / 1000.0:g}\n"
                "# HELP reflexarc_step_pre_collective_seconds Time a step ran before entering its collective.\n"
                "# TYPE reflexarc_step_pre_collective_seconds gauge\n"
                f"reflexarc_step_pre_collective_seconds{labels} {self.pre_collective_ms / 1000.0:g}\n")
