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
- ``reflexarc_audit_records_dropped_total{reason}``: audit records that could
  not be written (``audit.py``);
- ``reflexarc_alert_deliveries_total{receiver,outcome}``: alerts sent, failed
  or dropped per receiver (``actuators/alert.py``);
- with a fleet budget, ``reflexarc_fleet_slots_held{pool}`` (slots this node
  holds now: their sum over nodes is the fleet's slots in use),
  ``reflexarc_fleet_registered`` (1 while the node's lease in etcd is live and
  renewed) and ``reflexarc_fleet_lease_lost_total`` (``budget.py``);
- the controller's own CPU, memory and descriptors (``process_*``).

The rest (rule states, actions, drops, loop lag) is kept by
``ControllerMetrics`` as it happens.

Example::

    server = MetricsServer(parse_address("127.0.0.1:9472"), metrics.registry)
    export_live_state(metrics.registry, bus, manager, journal)
    server.start()          # curl http://127.0.0.1:9472/metrics
    server.close()

Bounds: the port may be open to every user of the node, and a connection
held open costs the controller a thread and a descriptor, so clients get only
so many, for only so long. At most ``MAX_CONNECTIONS`` (32) connections are
served at once, each by its own thread; one over the cap is accepted and
closed at once, without a thread (counted in ``refused``). Each connection
has ``CONNECTION_DEADLINE_S`` (10 s; a scrape takes milliseconds) from its
accept for the whole exchange, request and response: the accepting thread
shuts down the socket of one still open then, so a client that sends nothing,
or trickles its request a byte at a time, loses its slot at the deadline
(counted in ``timed_out``), and the socket's timeout, also 10 s, bounds any
one read or write. Connections not yet accepted wait in the kernel's queue
(64) and hold no descriptor of the controller. A client that reconnects as
fast as it is cut off can still keep scrapes out, but not take more than
``MAX_CONNECTIONS`` threads and descriptors; ``close()`` shuts down the open
connections and returns without waiting for their clients.

Overhead: one HTTP thread, idle between scrapes (it looks for a shutdown and
for connections past their deadline every 0.1 s), and one thread per open
connection, at most ``MAX_CONNECTIONS``; a scrape reads the bus
(``signal_metrics.py``), one status per probe, one ``stat`` of the journal and
a few files under ``/proc/self``.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer

from reflexarc.bpf.probe import DEGRADED, OK, STOPPED, UNSUPPORTED
from reflexarc.core.jobs import SKIP_REASONS

from ..engine.journal import OPEN_STATES
from .signal_metrics import SignalCollector

LOOPBACK = "127.0.0.1"
PROBE_STATES = (OK, DEGRADED, UNSUPPORTED, STOPPED)
MAX_CONNECTIONS = 32            # connections served at once; one more is closed at accept
CONNECTION_DEADLINE_S = 10.0    # from accept to the end of the response


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

    def parse_request(self) -> bool:
        # A connection cut at its deadline reads EOF and may look like a short
        # request: it gets no response.
        if self.server.cut(self.request):
            return False
        return super().parse_request() and not self.server.cut(self.request)


class _Connection:
    __slots__ = ("deadline", "cut")

    def __init__(self, deadline: float) -> None:
        self.deadline, self.cut = deadline, False


class _BoundedServer(ThreadingWSGIServer):
    """prometheus_client's thread-per-connection WSGI server with at most
    ``max_connections`` connections, each shut down ``deadline`` s after its
    accept. The serving thread accepts, refuses and cuts; ``_lock`` guards the
    table of open connections and the counts, and a socket leaves the table
    before it is closed, so a cut never reaches a closed socket."""

    request_queue_size = 64     # the kernel's queue of connections not yet accepted: no descriptors

    def __init__(self, address, handler, max_connections: int, deadline: float) -> None:
        self.max_connections, self.deadline = max_connections, deadline
        self._lock = threading.Lock()
        self._open: dict[socket.socket, _Connection] = {}
        self.refused = self.timed_out = 0
        super().__init__(address, handler)

    def process_request(self, request, client_address) -> None:
        with self._lock:
            full = len(self._open) >= self.max_connections
            if full:
                self.refused += 1
            else:
                self._open[request] = _Connection(time.monotonic() + self.deadline)
        if full:
            self.shutdown_request(request)
            return
        request.settimeout(self.deadline)
        super().process_request(request, client_address)

    def shutdown_request(self, request) -> None:
        with self._lock:
            self._open.pop(request, None)
        super().shutdown_request(request)

    def service_actions(self) -> None:
        super().service_actions()
        now = time.monotonic()
        with self._lock:
            for request, conn in self._open.items():
                if not conn.cut and now >= conn.deadline:
                    conn.cut = True
                    self.timed_out += 1
                    _shut(request)

    def cut(self, request) -> bool:
        with self._lock:
            conn = self._open.get(request)
            return conn is not None and conn.cut

    def cut_all(self) -> None:
        """Shut down every open connection (``close()``: not counted)."""
        with self._lock:
            for request, conn in self._open.items():
                conn.cut = True
                _shut(request)

    def open_connections(self) -> int:
        with self._lock:
            return len(self._open)

    def handle_error(self, request, client_address) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, TimeoutError):       # the socket's timeout ran out before the deadline check
            with self._lock:
                conn = self._open.get(request)
                if conn is not None and not conn.cut:
                    conn.cut = True
                    self.timed_out += 1
        elif not isinstance(error, OSError):      # a reset, a broken pipe, a cut socket: the client's doing
            super().handle_error(request, client_address)


def _shut(request: socket.socket) -> None:
    try:
        request.shutdown(socket.SHUT_RDWR)        # the handler's read or write returns at once
    except OSError:                               # the peer is already gone
        pass


class MetricsServer:
    def __init__(self, address: tuple[str, int], registry: CollectorRegistry, *,
                 max_connections: int = MAX_CONNECTIONS, deadline: float = CONNECTION_DEADLINE_S) -> None:
        """Binds ``address``; OSError (``socket.gaierror`` for a host that does
        not resolve) when it cannot. ``max_connections`` and ``deadline``
        (seconds) bound the connections (module docstring)."""
        host, port = address
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        server = type("Server", (_BoundedServer,), {"address_family": family})
        self.httpd = server((host, port), _Quiet, max_connections, deadline)
        self.httpd.set_app(make_wsgi_app(registry))
        self.address = self.httpd.server_address[:2]
        self._thread: threading.Thread | None = None

    @property
    def refused(self) -> int:
        """Connections closed at accept because ``max_connections`` were open."""
        with self.httpd._lock:
            return self.httpd.refused

    @property
    def timed_out(self) -> int:
        """Connections shut down at their deadline (or by their socket's timeout)."""
        with self.httpd._lock:
            return self.httpd.timed_out

    @property
    def connections(self) -> int:
        """Connections open now, each with its thread."""
        return self.httpd.open_connections()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.1,), name="metrics",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop accepting, close the port and shut down the open connections;
        returns without waiting for their clients."""
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join()
            self._thread = None
        self.httpd.server_close()
        self.httpd.cut_all()


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


class AuditCollector:
    """``reflexarc_audit_records_dropped_total{reason}``: audit records that could
    not be written (a full disk: ``ENOSPC``), read from the audit log."""

    def __init__(self, audit) -> None:
        self.audit = audit

    def collect(self):
        family = CounterMetricFamily("reflexarc_audit_records_dropped",
                                     "Audit records not written (the controller went on without them), by errno",
                                     labels=["reason"])
        for reason, n in sorted(self.audit.dropped.items()):
            family.add_metric([reason], n)
        yield family


class AlertCollector:
    """``reflexarc_alert_deliveries_total{receiver,outcome}``: alerts the alert
    actuator sent, failed to send or dropped, per receiver; nothing before it
    is first used. ``alerts`` returns the actuator once built, else None."""

    def __init__(self, alerts) -> None:
        self.alerts = alerts

    def collect(self):
        family = CounterMetricFamily("reflexarc_alert_deliveries",
                                     "Alert deliveries by receiver and outcome (sent, failed, dropped)",
                                     labels=["receiver", "outcome"])
        sender = self.alerts()
        for (receiver, outcome), n in sorted(getattr(sender, "deliveries", {}).items()):
            family.add_metric([receiver, outcome], n)
        yield family


class FleetCollector:
    """What a node's fleet budget holds now: its slots per pool, whether its
    lease is live, how often the lease ran out under it."""

    def __init__(self, budget) -> None:
        self.budget = budget

    def collect(self):
        held = GaugeMetricFamily("reflexarc_fleet_slots_held", "Fleet budget slots this node holds now, by pool "
                                 "(summed over nodes: the fleet's slots in use)", labels=["pool"])
        for pool, holders in sorted(self.budget.held().items()):
            held.add_metric([pool], 1.0 if holders else 0.0)
        yield held
        yield GaugeMetricFamily("reflexarc_fleet_registered", "1 while this node's lease in the fleet store is "
                                "live and renewed; 0 while the store is out of reach (enforce changes refused)",
                                value=1.0 if self.budget.renewing else 0.0)
        yield CounterMetricFamily("reflexarc_fleet_lease_lost", "Times this node's lease in the fleet store "
                                  "ran out under it (the store out of its reach longer than the TTL)",
                                  value=float(self.budget.lost))


def export_live_state(registry: CollectorRegistry, bus, manager=None, journal=None, audit=None,
                      alerts=None, budget=None) -> None:
    """Register the scrape-time collectors on ``registry``: the bus's signals,
    the probes of ``manager``, ``journal``, ``audit``, ``alerts`` and the fleet
    ``budget`` when given, this process."""
    registry.register(SignalCollector(bus))
    if manager is not None:
        registry.register(ProbeCollector(manager))
    if journal is not None:
        registry.register(JournalCollector(journal))
    if audit is not None:
        registry.register(AuditCollector(audit))
    if alerts is not None:
        registry.register(AlertCollector(alerts))
    if budget is not None:
        registry.register(FleetCollector(budget))
    ProcessCollector(registry=registry)
