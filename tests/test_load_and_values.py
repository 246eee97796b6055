"""Load and values: a sample its signal cannot have never reaches the bus and
is counted; batches, series per signal and points per series are bounded, and
what a bound drops is counted; a stop request is honoured between chunks; and
``reflexarc run`` under a 1.05 M-sample replay storm (100 k distinct pids,
1.4 % NaN/inf) reverts its change and exits on SIGTERM or SIGINT.

Counts are read back from the controller's Prometheus registry (the in-process
tests) or its metrics endpoint (the storm). Nothing is timed: the storm test
asserts that the process exited and that the shutdown path ran;
``bench/signal_storm.py`` measures how long that takes.
"""
from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT, spawn_cli
from engine_fixtures import policy, registry
from reflexarc.controller.engine.audit import AuditLog
from reflexarc.controller.engine.bus import SignalBus, Stored
from reflexarc.controller.engine.clock import SimClock
from reflexarc.controller.engine.engine import STOP_CHUNK, Controller
from reflexarc.controller.sources.intake import CHUNK, Intake
from reflexarc.controller.runtime.live import run_live
from reflexarc.controller.engine.metrics import ControllerMetrics
from reflexarc.controller.signals.catalogue import CATALOGUE
from reflexarc.controller.signals.values import MAX_AHEAD, UNIT_RANGES, Refusal, timestamp_fault, value_fault
from reflexarc.simulations.testbed.local_server import free_port

sys.path.insert(0, str(ROOT / "bench"))
from signal_storm import SHIPPED, STORM_POLICY, scrape, write_storm  # noqa: E402

NAN, INF = float("nan"), float("inf")


class StopAfter:
    """A stop event that is found set from its ``n``-th look on, as if SIGTERM
    came in the middle of a pass."""

    def __init__(self, n: int) -> None:
        self.n, self.looks = n, 0

    def is_set(self) -> bool:
        self.looks += 1
        return self.looks > self.n


def rejected(metrics: ControllerMetrics, signal_name: str, reason: str) -> float | None:
    return metrics.registry.get_sample_value("reflexarc_samples_rejected_total",
                                             {"signal": signal_name, "reason": reason})


def dropped(metrics: ControllerMetrics, signal_name: str, reason: str) -> float | None:
    return metrics.registry.get_sample_value("reflexarc_samples_dropped_total",
                                             {"signal": signal_name, "reason": reason})


# --- valid ranges ---------------------------------------------------------------------
def test_every_catalogued_unit_has_a_declared_range():
    missing = {spec.name: spec.unit for spec in CATALOGUE.values() if spec.unit not in UNIT_RANGES}
    assert missing == {}, "declare the valid range of these units in controller/signals/values.py"


@pytest.mark.parametrize("name, value, fault", [
    ("dataloader_read_latency_us", -1.0, Refusal.BELOW_RANGE),
    ("dataloader_read_latency_us", NAN, Refusal.NOT_FINITE),
    ("dataloader_read_latency_us", INF, Refusal.NOT_FINITE),
    ("step_time_ms", -INF, Refusal.NOT_FINITE),
    ("step_time_ms", -0.5, Refusal.BELOW_RANGE),
    ("step_time_ms", 180.0, None),
    ("numa_remote_ratio", 1.5, Refusal.ABOVE_RANGE),
    ("numa_remote_ratio", -0.1, Refusal.BELOW_RANGE),
    ("numa_remote_ratio", 1.0, None),
    ("numa_remote_ratio", 0.0, None),
    ("gpu_utilization_pct", -1.0, Refusal.BELOW_RANGE),
    ("link_utilization_pct", 130.0, None),           # a percentage may read above 100
    ("qdisc_backlog_bytes", -4096.0, Refusal.BELOW_RANGE),
    ("dataloader_reads_total", -3.0, Refusal.BELOW_RANGE),
    ("gpu_submit_rate_hz", -2.0, Refusal.BELOW_RANGE),
    ("dataloader_read_amplification_ratio", 4.2, None),     # bytes per byte: not a share
    ("dataloader_read_amplification_ratio", -0.1, Refusal.BELOW_RANGE),
    ("device_numa_local_ratio", 1.2, Refusal.ABOVE_RANGE),  # a share of CPUs
])
def test_a_value_is_checked_against_its_signals_unit(name, value, fault):
    assert value_fault(name, value) == fault


@pytest.mark.parametrize("ts, fault", [
    (NAN, Refusal.TIMESTAMP_NOT_FINITE),
    (INF, Refusal.TIMESTAMP_NOT_FINITE),
    (-INF, Refusal.TIMESTAMP_NOT_FINITE),
    (1000.0 + MAX_AHEAD + 1.0, Refusal.TIMESTAMP_FUTURE),
    (1000.0 - 900.0, Refusal.TIMESTAMP_PAST),
    (1000.0 + MAX_AHEAD, None),
    (1000.0 - 899.0, None),
])
def test_a_timestamp_must_be_placeable_on_the_bus(ts, fault):
    assert timestamp_fault(ts, now=1000.0, past=900.0) == fault


# --- the intake ---------------------------------------------------------------------
def test_impossible_samples_never_reach_the_bus_and_are_counted_per_signal():
    bus, metrics = SignalBus(retention=900.0), ControllerMetrics()
    lat = {"pid": "7", "quantile": "0.99"}
    samples = [
        ("dataloader_read_latency_us", lat, 120.0),
        ("dataloader_read_latency_us", lat, NAN),
        ("dataloader_read_latency_us", lat, INF),
        ("dataloader_read_latency_us", lat, -5.0),
        ("numa_remote_ratio", {"pid": "7"}, 0.25),
        ("numa_remote_ratio", {"pid": "7"}, 1.5),
        ("numa_remote_ratio", {"pid": "7"}, -INF),
        ("step_time_ms", {"rank": "0"}, 180.0, 999.0),            # carries a plausible time of its own
        ("step_time_ms", {"rank": "0"}, 181.0, NAN),
        ("step_time_ms", {"rank": "0"}, 182.0, 1000.0 + 1e12),
        ("step_time_ms", {"rank": "0"}, 183.0, 1000.0 - 1e12),
    ]
    taken = Intake(bus, metrics).take("replay", samples, now=1000.0)
    assert (taken.published, taken.rejected, taken.dropped, taken.complete) == (3, 8, 0, True)
    on_bus = {name: [v for s in bus.series(name) for v in s.vs] for name in
              ("dataloader_read_latency_us", "numa_remote_ratio", "step_time_ms")}
    assert on_bus == {"dataloader_read_latency_us": [120.0], "numa_remote_ratio": [0.25], "step_time_ms": [180.0]}
    assert all(math.isfinite(t) and t == 1000.0 for s in bus.series("step_time_ms") for t in s.ts), \
        "samples are stamped on the controller's clock"
    assert rejected(metrics, "dataloader_read_latency_us", "not_finite") == 2
    assert rejected(metrics, "dataloader_read_latency_us", "below_range") == 1
    assert rejected(metrics, "numa_remote_ratio", "above_range") == 1
    assert rejected(metrics, "numa_remote_ratio", "not_finite") == 1
    assert rejected(metrics, "step_time_ms", "timestamp_not_finite") == 1
    assert rejected(metrics, "step_time_ms", "timestamp_future") == 1
    assert rejected(metrics, "step_time_ms", "timestamp_past") == 1
    assert metrics.registry.get_sample_value("reflexarc_signal_samples_total", {"source": "replay"}) == 3


def test_a_batch_beyond_the_limit_is_cut_and_the_rest_counted_as_dropped():
    bus, metrics = SignalBus(), ControllerMetrics()
    samples = [("step_time_ms", {"rank": str(i)}, 50.0) for i in range(20)]
    samples += [("dataloader_batch_wait_ms", {"rank": str(i)}, 1.0) for i in range(5)]
    taken = Intake(bus, metrics, limit=10).take("hooks", samples, now=1.0)
    assert (taken.published, taken.dropped) == (10, 15)
    assert bus.series_count() == 10
    assert dropped(metrics, "step_time_ms", "queue_full") == 10
    assert dropped(metrics, "dataloader_batch_wait_ms", "queue_full") == 5


def test_series_beyond_a_signals_cap_are_refused_until_silent_ones_expire():
    bus, metrics = SignalBus(retention=60.0, max_series=3), ControllerMetrics()
    intake = Intake(bus, metrics)
    pids = [("dataloader_read_latency_us", {"pid": str(p), "quantile": "0.5"}, 10.0) for p in range(5)]
    taken = intake.take("probes", pids + [("step_time_ms", {"rank": "0"}, 50.0)], now=0.0)
    assert (taken.published, taken.dropped) == (4, 2)
    assert sorted(s.labels["pid"] for s in bus.series("dataloader_read_latency_us")) == ["0", "1", "2"]
    assert len(bus.series("step_time_ms")) == 1, "the cap is per signal"
    assert dropped(metrics, "dataloader_read_latency_us", "series_limit") == 2
    intake.take("probes", pids[:3], now=10.0)                  # known series still take points
    assert dropped(metrics, "dataloader_read_latency_us", "series_limit") == 2
    assert bus.expire(now=71.0) == 4                           # the processes went away
    intake.take("probes", pids[3:], now=72.0)
    assert sorted(s.labels["pid"] for s in bus.series("dataloader_read_latency_us")) == ["3", "4"]
    assert dropped(metrics, "dataloader_read_latency_us", "series_limit") == 2


def test_a_series_keeps_its_newest_points_up_to_its_cap():
    bus = SignalBus(retention=900.0, max_points=4)
    outcomes = [bus.publish("step_time_ms", {"rank": "0"}, float(v), ts=float(v)) for v in range(10)]
    assert outcomes == [Stored.STORED] * 4 + [Stored.SERIES_FULL] * 6
    (series,) = bus.series("step_time_ms")
    lo, hi = series.bounds(since=-1.0, until=100.0)
    assert series.vs[lo:hi] == [6.0, 7.0, 8.0, 9.0]


def test_the_intake_stops_between_chunks():
    bus, metrics = SignalBus(), ControllerMetrics()
    samples = [("step_time_ms", {"rank": str(i)}, 50.0) for i in range(2 * CHUNK + 10)]
    taken = Intake(bus, metrics).take("replay", samples, now=1.0, stop=StopAfter(1))
    assert (taken.published, taken.complete) == (CHUNK, False)
    assert bus.series_count() == CHUNK


# --- the controller and the loop ----------------------------------------------------------
def test_a_tick_returns_between_chunks_of_runs_once_stopped():
    clock = SimClock()
    ctl = Controller([policy(mode="dry-run")], SignalBus(), registry({}, []), clock, audit=AuditLog(None, clock))
    ranks = 3 * STOP_CHUNK
    for rank in range(ranks):
        ctl.bus.publish("step_time_ms", {"job": "j", "rank": str(rank)}, 50.0, 1.0)
    clock.set(1.0)
    ctl.tick(1.0, stop=StopAfter(1))
    assert len(ctl.runs) == STOP_CHUNK, "one chunk of runs was started, then the tick returned"
    ctl.tick(1.0, stop=threading.Event())
    assert len(ctl.runs) == ranks


class StormSource:
    """Delivers a large batch and, while doing so, is told to stop (SIGTERM in
    the middle of a storm)."""

    name = "replay"

    def __init__(self, stop: threading.Event, n: int) -> None:
        self.stop, self.n, self.polls, self.closed = stop, n, 0, False

    def poll(self, now):
        self.polls += 1
        if self.polls == 3:
            self.stop.set()
            return [("step_time_ms", {"job": "j", "rank": str(i)}, 500.0) for i in range(self.n)]
        return [("step_time_ms", {"job": "j", "rank": "0"}, 500.0)]

    def close(self):
        self.closed = True


class StepClock(SimClock):
    """Time that moves on by a second at every look, as wall time does for the loop."""

    def now(self) -> float:
        self.set(super().now() + 1.0)
        return super().now()


def test_a_stop_in_the_middle_of_a_storm_reverts_and_ends_the_loop():
    state = {}
    clock = StepClock()
    audit = AuditLog(None, clock)
    ctl = Controller([policy(mode="enforce", verify=False, for_=0.0)], SignalBus(), registry(state, []), clock,
                     audit=audit)
    ctl.start("test")
    stop = threading.Event()
    src = StormSource(stop, n=5 * CHUNK)
    summary = run_live(ctl, [src], clock, interval=0.0, stop=stop)
    assert src.polls == 3 and src.closed
    published = ctl.metrics.registry.get_sample_value("reflexarc_signal_samples_total", {"source": "replay"})
    assert published == 2, "the storm's batch was not published once stop was set"
    assert summary["applied"] == 1 and summary["reverted"] == 1
    assert state == {"rank=0": 0}, "the shutdown rollback undid the change"
    assert [r["kind"] for r in audit.records][-1] == "end"


# --- the real thing: reflexarc run under a replay storm -------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_under_a_replay_storm_reverts_and_exits(tmp_path, sig):
    storm = tmp_path / "storm.jsonl"
    written = write_storm(storm)
    assert written["samples"] == 1_050_000 and written["pids"] == 100_000
    (tmp_path / "storm.yaml").write_text(STORM_POLICY)
    knob = tmp_path / "proc" / "sys" / "kernel" / "numa_balancing"
    knob.parent.mkdir(parents=True)
    knob.write_text("1\n")
    hooks = tmp_path / "hooks"
    hooks.mkdir(mode=0o755)
    port = free_port()
    state = tmp_path / "state"
    ctl = spawn_cli(
        "--state-dir", str(state), "--proc-root", str(tmp_path / "proc"), "--hook-dir", str(hooks),
        "run", "--no-probes", "--replay", str(storm), "--policy", str(tmp_path / "storm.yaml"),
        *[arg for name in SHIPPED for arg in ("--policy", str(ROOT / "policies" / name))],
        "--mode", "policy", "--interval", "1", "--duration", "3600",
        "--metrics-port", str(port), "--kill-switch", str(tmp_path / "disable"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        metrics: dict = {}
        deadline = time.monotonic() + 300           # a guard against a hang, not a measurement
        while time.monotonic() < deadline:
            assert ctl.poll() is None, ctl.stderr.read()
            if knob.read_text().strip() == "0":
                metrics = scrape(port)
                if any(k.endswith("/series_limit") for k in metrics.get("dropped", {})):
                    break                            # applied, and the storm is beyond the series cap
            time.sleep(0.2)
        else:
            pytest.fail(f"the change was not applied under the storm; metrics: {metrics}")
        ctl.send_signal(sig)
        out, err = ctl.communicate(timeout=120)
    finally:
        if ctl.poll() is None:
            ctl.kill()
            ctl.communicate()
    assert ctl.returncode == 0, err
    summary = json.loads(out.splitlines()[0])
    assert summary["applied"] == 1 and summary["reverted"] == 1, summary
    assert knob.read_text().strip() == "1", "the shutdown rollback ran"
    records = [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]
    assert records[-1]["kind"] == "end"
    reverts = [r for r in records if r["kind"] == "action" and r["outcome"] == "reverted"]
    assert [r["policy"] for r in reverts] == ["storm-enforce"]
    assert metrics["rejected"].get("dataloader_read_latency_us/not_finite", 0) > 0
    assert metrics["rejected"].get("numa_remote_ratio/not_finite", 0) > 0
    assert metrics["dropped"]["dataloader_read_latency_us/series_limit"] > 0
    assert metrics["bus_series"] <= 3 * SignalBus().max_series + 1, "series bounded per signal"
