"""Metrics out: the HTTP endpoint of ``reflexarc run --metrics-addr [HOST:]PORT``.

``MetricsServer`` binds its address when it is made, so an address that is
in use or not this host's is an error before the controller starts anything,
and serves the controller's registry from ``start()`` to ``close()``.
``export_live_state`` adds to that registry what is read at scrape time:

- the live signals (``signal_metrics.py``: ``reflexarc_step_time_seconds``...);
- ``reflexarc_probe_up{probe,state}``: 1 for the state each probe is in, 0
  for the others (a deep session is ``probe[key]`` while it exists); lost
  events are the probes' own signal, ``reflexarc_probe_events_lost_total``;
- ``reflexarc_journal_bytes`` and ``reflexarc_journal_open_entries``;
- the controller's own CPU, memory and descriptors (``process_*``).

The rest (rule states, actions, drops, loop lag) is kept by
``ControllerMetrics`` as it happens.

Example::

    server = MetricsServer(parse_address("127.0.0.1:9472"), metrics.registry)
    export_live_state(metrics.registry, bus, manager, journal)
    server.start()          # curl http://127.0.0.1:9472/metrics
    server.close()

Overhead: one HTTP thread, idle between scrapes (it looks for a shutdown
every 0.1 s); a scrape reads the bus (``signal_metrics.py``), one status per
probe, one ``stat`` of the journal and a few files under ``/proc/self``.
"""
from __future__ import annotations

import os
import socket
import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer

from reflexarc.bpf.probe import DEGRADED, OK, STOPPED, UNSUPPORTED
from reflexarc.core.jobs import SKIP_REASONS

from .journal import OPEN_STATES
from .signal_metrics import SignalCollector

LOOPBACK = "127.0.0.1"
PROBE_STATES = (OK, DEGRADED, UNSUPPORTED, STOPPED)


def parse_address(text: str) -> tuple[str, int]:
    """``PORT`` (on loopback), ``HOST:PORT`` or ``[IPV6]:PORT`` as (host, port);
    ValueError says what is wrong."""
    host, sep, port = text.strip().rpartition(":")
    if not sep:
        host = LOOPBACK
    elif host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"'{text}': write an IPv6 address in brackets, e.g. [::1]:9472")
    if not host:
        raise ValueError(f"'{text}' names no host: e.g. 127.0.0.1:9472, or 0.0.0.0:9472 for every address")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"'{text}' is not [HOST:]PORT with a port 1-65535, e.g. 127.0.0.1:9472")
    return host, int(port)


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args) -> None:   # a scrape is not news
        pass


class MetricsServer:
    def __init__(self, address: tuple[str, int], registry: CollectorRegistry) -> None:
        """Binds ``address``; OSError (``socket.gaierror`` for a host that does
        not resolve) when it cannot."""
        host, port = address
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        server = type("Server", (ThreadingWSGIServer,), {"address_family": family})
        self.httpd = make_server(host, port, make_wsgi_app(registry), server, handler_class=_Quiet)
        self.address = self.httpd.server_address[:2]
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.1,), name="metrics",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join()
            self._thread = None
        self.httpd.server_close()


class ProbeCollector:
    def __init__(self, manager) -> None:
        self.manager = manager

    def _statuses(self) -> dict:
        for _ in range(2):
            try:
                return self.manager.statuses()
            except RuntimeError:     # the loop started or ended a deep session mid-copy: again
                pass
        return self.manager.statuses()

    def collect(self):
        up = GaugeMetricFamily("reflexarc_probe_up", "1 for the state a probe is in (ok or degraded: running; "
                               "unsupported: reflexarc probes says why; stopped), 0 for the others",
                               labels=["probe", "state"])
        for name, status in sorted(self._statuses().items()):
            for state in PROBE_STATES:
                up.add_metric([name, state], 1.0 if status.state == state else 0.0)
        yield up
        jobs, skipped = self.manager.jobs, self.manager.skipped      # the last refresh's, replaced whole
        info = GaugeMetricFamily("reflexarc_job_info", "1 for each training process of a job found on the node "
                                 "(reflexarc jobs): its job, rank, pod and launcher",
                                 labels=["job", "rank", "pod", "launcher", "pid"])
        for job in jobs:
            for t in job.trainers:
                i = t.identity
                info.add_metric([job.name, "" if i.rank is None else str(i.rank), i.pod, i.launcher, str(t.pid)], 1.0)
        yield info
        lost = CounterMetricFamily("reflexarc_job_discovery_skipped", "Processes job discovery skipped, by "
                                   "reason (unreadable, vanished, oversized, malformed, fd-exhausted)",
                                   labels=["reason"])
        for reason in SKIP_REASONS:
            lost.add_metric([reason], float(skipped.get(reason, 0)))
        yield lost


class JournalCollector:
    def __init__(self, journal) -> None:
        self.journal = journal

    def collect(self):
        try:
            size = os.stat(self.journal.path).st_size
        except FileNotFoundError:
            size = 0
        yield GaugeMetricFamily("reflexarc_journal_bytes", "Size of the write-ahead journal file", value=size)
        yield GaugeMetricFamily("reflexarc_journal_open_entries",
                                "Journaled changes still at intent or applied: what a restart reverts or adopts",
                                value=sum(e.state in OPEN_STATES for e in self.journal.entries()))


def export_live_state(registry: CollectorRegistry, bus, manager=None, journal=None) -> None:
    """Register the scrape-time collectors on ``registry``: the bus's signals,
    the probes of ``manager`` and ``journal`` when given, this process."""
    registry.register(SignalCollector(bus))
    if manager is not None:
        registry.register(ProbeCollector(manager))
    if journal is not None:
        registry.register(JournalCollector(journal))
    ProcessCollector(registry=registry)
