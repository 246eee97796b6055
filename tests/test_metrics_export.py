"""Metrics out: ``reflexarc run --metrics-addr`` scraped by a real Prometheus.

The controller runs for real (``reflexarc run --no-probes --replay``), a real
Prometheus (``simulations/testbed/prometheus.py``) scrapes it, and the values are read back
through Prometheus's HTTP API: every signal under its one exported name and in
its base unit, the rule states, the hook signals per job and rank (the
cross-rank ratio of ``docs/promql.md`` computed by Prometheus). In-process, a
real probe manager (``sched_numa`` compiled and attached) and a real journal
feed the scrape-time families, and a series the bus drops leaves the scrape
and Prometheus. ``promtool check metrics`` reads the scrapes and must find
nothing to say.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import require, require_bpf, run_cli, spawn_cli, two_node_sys
from engine_fixtures import registry as actuator_registry
from prometheus_client import CollectorRegistry, generate_latest
from reflexarc.simulations.testbed.prometheus import PrometheusServer, free_port

from reflexarc.bpf.manager import ProbeManager
from reflexarc.bpf.probe import Selection
from reflexarc.controller.engine.bus import SignalBus
from reflexarc.controller.engine.clock import SimClock
from reflexarc.controller.engine.engine import Controller
from reflexarc.controller.runtime.exporter import MetricsServer, export_live_state, parse_address
from reflexarc.controller.sources.intake import Intake
from reflexarc.controller.engine.journal import Journal
from reflexarc.controller.runtime.live import run_live
from reflexarc.controller.engine.metrics import ControllerMetrics
from reflexarc.controller.runtime.signal_metrics import SignalCollector, exported
from reflexarc.controller.signals.catalogue import CATALOGUE
from reflexarc.controller.sources.readers import ProbeSource

pytestmark = [pytest.mark.kernel]

PROMTOOL = "/usr/bin/promtool"
NODE = os.uname().nodename
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

POLICY = """\
policies:
  - name: slow-steps
    selector: {match: {job: llama}}
    rules:
      - name: step-time
        by: [rank]
        when: {signal: step_time_ms, agg: max, window: 5s, op: ">", threshold: 200}
        actions:
          - actuator: log
            params: {message: slow steps}
"""

# what the replay says (t=0, once): each signal in its own unit
REPLAY = [
    ("step_time_ms", {"job": "llama", "rank": "0"}, 250),
    ("dataloader_batch_wait_ms", {"job": "llama", "rank": "0"}, 12),
    *[("step_pre_collective_ms", {"job": "llama", "rank": str(r)}, ms) for r, ms in enumerate((100, 100, 100, 180))],
    ("dataloader_read_latency_us", {"job": "llama", "pid": "4242", "quantile": "0.99"}, 1500),
    ("link_utilization_pct", {"iface": "eth0", "netns": "", "traffic": "job"}, 42),
    ("tcp_retransmits_total", {"flow": "10.0.0.1:41000-10.0.0.2:29500", "port": "29500"}, 7),
]

# What promtool says of the catalogue's exposition: a signal whose own name has
# a type in it (bpf/rdma_counters.py), which the naming rule keeps. Renaming the
# signal empties this; the test then asks for it to be emptied.
CATALOGUE_LINT = {"reflexarc_rdma_hw_counter_rate metric name should not include type 'counter'"}

# docs/promql.md's cross-rank query, on the exported name
RANK_RATIO = ('avg_over_time(reflexarc_step_pre_collective_seconds{{node="{node}"}}[2m])'
              " / on (job) group_left"
              " quantile by (job) (0.5, avg_over_time(reflexarc_step_pre_collective_seconds[2m]))")


def promtool_says(text: str) -> tuple[int, str]:
    """``promtool check metrics`` on an exposition: exit status and what it printed."""
    require(Path(PROMTOOL).exists(), f"promtool at {PROMTOOL} (Debian's prometheus)")
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    return r.returncode, (r.stdout + r.stderr).strip()


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        return response.read().decode()


def one(result: list[dict]) -> float:
    assert len(result) == 1, result
    return float(result[0]["value"][1])


def by_label(result: list[dict], label: str) -> dict[str, float]:
    return {r["metric"][label]: float(r["value"][1]) for r in result}


# --- the naming rule ----------------------------------------------------------------
def test_one_rule_names_every_signal_in_its_base_unit():
    cases = {"step_time_ms": ("reflexarc_step_time_seconds", 1e-3, "gauge"),
             "dataloader_read_latency_us": ("reflexarc_dataloader_read_latency_seconds", 1e-6, "summary"),
             "link_utilization_pct": ("reflexarc_link_utilization_ratio", 1e-2, "gauge"),
             "tcp_retransmits_total": ("reflexarc_tcp_retransmits_total", 1.0, "counter"),
             "qdisc_backlog_bytes": ("reflexarc_qdisc_backlog_bytes", 1.0, "gauge"),
             "deep_probe_events_per_s": ("reflexarc_deep_probe_events_per_second", 1.0, "gauge"),
             "step_pre_collective_ms": ("reflexarc_step_pre_collective_seconds", 1e-3, "gauge")}
    for signal_name, (name, factor, kind) in cases.items():
        e = exported(CATALOGUE[signal_name])
        assert (e.name, e.factor, e.type) == (name, factor, kind), signal_name
    assert exported(CATALOGUE["step_time_ms"]).help == "Training step time (seconds; signal step_time_ms)"
    names = [exported(spec).name for spec in CATALOGUE.values()]
    assert len(set(names)) == len(names)
    for spec in CATALOGUE.values():
        e = exported(spec)
        assert METRIC_NAME.fullmatch(e.name) and all(LABEL_NAME.fullmatch(k) for k in spec.labels), spec
        assert (e.type == "counter") == e.name.endswith("_total"), spec
        # a unit that is not a base unit is in the name, and the rule scales it away
        scaled = {"ms": 1e-3, "us": 1e-6, "%": 1e-2}.get(spec.unit, 1.0)
        assert e.factor == scaled, f"{spec.name} is in {spec.unit}, exported x{e.factor}"


def test_every_catalogued_signal_passes_promtool():
    """One live series of each signal, every label of its spec set: the whole
    catalogue's exposition is what Prometheus's linter accepts."""
    bus = SignalBus()
    for spec in CATALOGUE.values():
        labels = {k: ("0.99" if k == "quantile" else f"{k}-1") for k in spec.labels if k != "node"}
        bus.publish(spec.name, labels, 0.5, ts=1.0)
    registry = CollectorRegistry()
    registry.register(SignalCollector(bus, node="gpu-node-07"))
    text = generate_latest(registry).decode()
    status, said = promtool_says(text)
    assert set(said.splitlines()) == CATALOGUE_LINT and status == (3 if CATALOGUE_LINT else 0), said
    assert ('reflexarc_step_time_seconds{job="job-1",node="gpu-node-07",pid="pid-1",pod="pod-1",rank="rank-1",'
            'trainer="trainer-1"} 0.0005') in text
    assert "# TYPE reflexarc_tcp_srtt_seconds summary" in text
    assert len([line for line in text.splitlines() if line.startswith("# TYPE")]) == len(CATALOGUE)


def test_addresses():
    assert parse_address("9472") == ("127.0.0.1", 9472)
    assert parse_address("0.0.0.0:9472") == ("0.0.0.0", 9472)
    assert parse_address("[::1]:9472") == ("::1", 9472)
    assert parse_address("localhost:1") == ("localhost", 1)
    for bad in ("", ":9472", "host:", "host:0", "host:65536", "host:x", "::1:9472", "[::1]"):
        with pytest.raises(ValueError):
            parse_address(bad)


def test_an_ipv6_address_serves():
    try:
        registry = CollectorRegistry()
        ControllerMetrics(registry).bus_series.set(3)
        server = MetricsServer(("::1", 0), registry)
    except OSError as exc:
        require(False, f"an IPv6 loopback address ::1 ({exc})")
    server.start()
    try:
        assert "reflexarc_bus_series 3.0" in scrape("[::1]:%d" % server.address[1])
    finally:
        server.close()


# --- the real controller, scraped by a real Prometheus ------------------------------------
def _controller(tmp_path: Path, port: int, env: dict | None = None) -> subprocess.Popen:
    hooks = tmp_path / "hooks"
    hooks.mkdir(mode=0o755, exist_ok=True)
    replay = tmp_path / "replay.jsonl"
    records = [(0, *sample) for sample in REPLAY]
    records += [(t / 2, *REPLAY[0]) for t in range(1, 600)]      # rank 0's steps stay slow
    replay.write_text("".join(json.dumps({"t": t, "name": n, "labels": labels, "value": v}) + "\n"
                              for t, n, labels, v in records))
    (tmp_path / "policy.yaml").write_text(POLICY)
    return spawn_cli(
        "--state-dir", str(tmp_path / "state"), "--hook-dir", str(hooks),
        "run", "--no-probes", "--replay", str(replay), "--policy", str(tmp_path / "policy.yaml"),
        "--interval", "0.5", "--duration", "600",       # a guard: the test stops it with SIGTERM
        "--metrics-addr", f"127.0.0.1:{port}", "--kill-switch", str(tmp_path / "disable"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def test_run_serves_signals_in_base_units_to_prometheus(tmp_path):
    port = free_port()
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    ctl = _controller(tmp_path, port, env={**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify")})
    try:
        with PrometheusServer({"reflexarc": [f"127.0.0.1:{port}"]}, honor_labels=("reflexarc",)) as prom:
            step = prom.wait_for("reflexarc_step_time_seconds", lambda r: len(r) == 1)
            assert float(step[0]["value"][1]) == 0.25
            assert {k: step[0]["metric"][k] for k in ("job", "rank", "node")} == {
                "job": "llama", "rank": "0", "node": NODE}
            assert one(prom.query("reflexarc_dataloader_batch_wait_seconds")) == 0.012
            assert one(prom.query('reflexarc_dataloader_read_latency_seconds{quantile="0.99",pid="4242"}')) == 0.0015
            assert one(prom.query('reflexarc_link_utilization_ratio{iface="eth0",traffic="job"}')) == 0.42
            assert one(prom.query("reflexarc_tcp_retransmits_total")) == 7
            pre = by_label(prom.query("reflexarc_step_pre_collective_seconds"), "rank")
            assert pre == {"0": 0.1, "1": 0.1, "2": 0.1, "3": 0.18}
            # the straggler query of docs/promql.md, as the cluster's Prometheus runs it
            ratio = by_label(prom.wait_for(RANK_RATIO.format(node=NODE), lambda r: len(r) == 4), "rank")
            assert ratio == pytest.approx({"0": 1.0, "1": 1.0, "2": 1.0, "3": 1.8})
            # the rule states (an Enum) and what the dry-run held back, beside them: rank 0 steps are slow
            prom.wait_for('reflexarc_would_have_acted_total{policy="slow-steps",actuator="log"}',
                          lambda r: len(r) == 1 and float(r[0]["value"][1]) >= 1)
            states = prom.query('reflexarc_rule_state{policy="slow-steps",rule="step-time",target="rank=0"}')
            assert len(states) == 11 and sum(float(r["value"][1]) for r in states) == 1, states
            assert one(prom.query("reflexarc_journal_open_entries")) == 0
            assert one(prom.query("process_resident_memory_bytes")) > 0
            assert one(prom.query("reflexarc_loop_tick_lag_seconds_count")) >= 1
            text = scrape(f"127.0.0.1:{port}")
    finally:
        ctl.send_signal(signal.SIGTERM)
        out, err = ctl.communicate(timeout=60)
    assert ctl.returncode == 0, err
    assert promtool_says(text) == (0, "")
    assert "reflexarc_probe_up" not in text, "no probes were loaded"
    notify.settimeout(5)
    assert [notify.recv(256), notify.recv(256)] == [b"READY=1", b"STOPPING=1"]
    notify.close()


def _bad_run(tmp_path: Path, *metrics: str) -> subprocess.CompletedProcess:
    (tmp_path / "policy.yaml").write_text(POLICY)
    return run_cli("--state-dir", str(tmp_path / "state"), "--hook-dir", str(tmp_path / "hooks"),
                   "run", "--no-probes", "--duration", "0", "--policy", str(tmp_path / "policy.yaml"),
                   "--kill-switch", str(tmp_path / "disable"), *metrics, timeout=60)


def test_an_address_in_use_or_not_here_is_one_error_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for option in (("--metrics-addr", f"127.0.0.1:{port}"), ("--metrics-port", str(port))):
            r = _bad_run(tmp_path, *option)
            assert r.returncode == 1, r.stderr
            assert r.stderr.splitlines() == [
                f"error: --metrics-addr 127.0.0.1:{port}: cannot listen there: Address already in use"]
    r = _bad_run(tmp_path, "--metrics-addr", "192.0.2.1:9472")          # TEST-NET-1: no address of this host
    assert r.returncode == 1 and r.stderr.splitlines() == [
        "error: --metrics-addr 192.0.2.1:9472: cannot listen there: Cannot assign requested address"], r.stderr
    assert not (tmp_path / "state" / "audit.jsonl").exists(), "nothing started"


@pytest.mark.parametrize("option,word", [
    (("--metrics-addr", "127.0.0.1:99999"), "port 1-65535"),
    (("--metrics-addr", ":9472"), "names no host"),
    (("--metrics-addr", "::1:9472"), "in brackets"),
    (("--metrics-addr", "9472", "--metrics-port", "9472"), "not allowed with"),
])
def test_a_bad_address_is_one_usage_error(tmp_path, option, word):
    r = _bad_run(tmp_path, *option)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("error: ") and word in r.stderr, r.stderr


# --- in process: probes, journal, a series that goes away, the loop ------------------------
def test_probes_journal_and_a_series_that_leaves_the_bus(tmp_path):
    """A real sched_numa probe and an unknown one, a real journal with an open
    change, two ranks on the bus; then the change is reverted and one rank's
    series expires: both show in the scrape and in Prometheus."""
    require_bpf()
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry)
    bus = SignalBus(retention=30.0)
    manager = ProbeManager(Selection(comms=("pt_data_worker",)), probes=["sched_numa", "no_such_probe"],
                           sys_root=str(two_node_sys(tmp_path / "sys")))
    journal = Journal(tmp_path / "journal.jsonl")
    server = MetricsServer(("127.0.0.1", 0), registry)
    address = "%s:%d" % server.address
    try:
        statuses = manager.start()
        assert statuses["sched_numa"].state == "ok", statuses["sched_numa"]
        jid = journal.intent({"actuator": "sysctl", "target": {"labels": {}, "selector": {}},
                              "params": {"key": "kernel.numa_balancing", "value": "0"}}, policy="p", rule="r")
        export_live_state(registry, bus, manager, journal)
        server.start()
        intake, now = Intake(bus, metrics), time.time()
        intake.take("probes", ProbeSource(manager).poll(now), now)
        intake.take("hooks", [("step_time_ms", {"job": "llama", "rank": r}, 300.0) for r in ("0", "1")], now)
        with PrometheusServer({"reflexarc": [address]}, honor_labels=("reflexarc",)) as prom:
            up = prom.wait_for('reflexarc_probe_up == 1', lambda r: len(r) == 2)
            assert {r["metric"]["probe"]: r["metric"]["state"] for r in up} == {
                "sched_numa": "ok", "no_such_probe": "unsupported"}
            assert len(prom.query('reflexarc_probe_up{probe="sched_numa"}')) == 4     # one per state
            lost = prom.query('reflexarc_probe_events_lost_total{probe="sched_numa"}')
            assert one(lost) == 0 and lost[0]["metric"]["node"] == NODE
            assert one(prom.query("reflexarc_journal_open_entries")) == 1
            assert one(prom.query("reflexarc_journal_bytes")) == (tmp_path / "journal.jsonl").stat().st_size
            assert set(by_label(prom.wait_for("reflexarc_step_time_seconds", lambda r: len(r) == 2), "rank")) \
                == {"0", "1"}

            journal.mark(jid, "reverted")
            intake.take("hooks", [("step_time_ms", {"job": "llama", "rank": "0"}, 310.0)], now + 20)
            assert bus.expire(now + 35) >= 1           # rank 1 silent for 35 s > retention
            text = scrape(address)
            # (series of other jobs that discovery finds on the node may carry a rank 1 of their own)
            assert [line for line in text.splitlines() if line.startswith("reflexarc_step_time_seconds{")] == \
                ['reflexarc_step_time_seconds{job="llama",node="%s",rank="0"} 0.31' % NODE]
            steps = prom.wait_for("reflexarc_step_time_seconds", lambda r: len(r) == 1)
            assert by_label(steps, "rank") == {"0": 0.31}
            prom.wait_for("reflexarc_journal_open_entries == 0", lambda r: len(r) == 1)
    finally:
        server.close()
        manager.stop()
        journal.close()
    assert promtool_says(text) == (0, "")
    with pytest.raises(urllib.error.URLError):
        scrape(address)


class _Late:
    """A source whose poll takes ``late`` seconds of the controller's clock, and
    which scrapes the exporter while the loop runs."""

    name = "late"

    def __init__(self, clock: SimClock, late: float, address: str, stop: threading.Event) -> None:
        self.clock, self.late, self.address, self.stop = clock, late, address, stop
        self.polls, self.scraped = 0, ""

    def poll(self, now):
        self.polls += 1
        self.clock.set(now + self.late)
        if self.polls == 3:
            self.scraped = scrape(self.address)
            self.stop.set()
        return []

    def close(self):
        pass


def test_loop_lag_is_how_late_a_tick_started(tmp_path):
    """Interval 1 s, each poll takes 3 s of the clock: every tick after the
    first starts 2 s late. The exporter serves while the loop runs, stops with it."""
    clock, stop = SimClock(100.0), threading.Event()
    registry = CollectorRegistry()
    ctl = Controller([], SignalBus(), actuator_registry({}, []), clock, metrics=ControllerMetrics(registry))
    server = MetricsServer(("127.0.0.1", 0), registry)
    export_live_state(registry, ctl.bus)
    src = _Late(clock, 3.0, "%s:%d" % server.address, stop)
    run_live(ctl, [src], clock, interval=1.0, exporter=server, stop=stop)
    assert registry.get_sample_value("reflexarc_loop_lag_seconds") == 2.0
    assert registry.get_sample_value("reflexarc_loop_tick_lag_seconds_count") == 3
    assert registry.get_sample_value("reflexarc_loop_tick_lag_seconds_sum") == 4.0
    assert registry.get_sample_value("reflexarc_loop_tick_lag_seconds_bucket", {"le": "0.001"}) == 1
    assert "reflexarc_loop_lag_seconds 2.0" in src.scraped
    with pytest.raises(urllib.error.URLError):
        scrape(src.address)

