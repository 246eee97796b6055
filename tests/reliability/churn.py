"""DataLoader worker churn through the real probes into the real bus: a
worker's series leave the bus when it exits, and live workers' series are
never refused at the series cap.

``TRAINERS`` training processes (``TRAINER``, run with ``python -c``) each
fork ``WORKERS`` new workers every ``PERIOD`` seconds, for ``rounds`` rounds,
as epochs without ``persistent_workers`` do: each worker names itself
``pt_data_worker``, reads a file with ``pread`` and sleeps between reads for
``PERIOD`` seconds, then exits; its training process reaps it and logs when
(``CLOCK_MONOTONIC``, the clock of this process too). The probes that see
workers (``dataloader_io``, ``sched_numa``) and exits (``proc_exit``) run in a
``ProbeManager``, polled once a second by a ``ProbeSource`` that drops the
series of exited processes from the ``SignalBus`` its samples go to, through
the controller's ``Intake``; each signal's series cap is ``CAP_PER_LIVE``
times the live workers, a fraction of the workers started, and well under
what the exited workers' series would fill before they fell silent
(``SILENT_AFTER``). What must hold, checked once the trainers' logs are
complete:

- every series of a worker reaped before a poll began is gone from the bus,
  and from its Prometheus export (``SignalCollector``), by the end of the next
  poll: a worker's series last a collect or two, not the retention (a pid
  that one of the trainers started again meanwhile is excused: the series may
  be the new worker's; so is one alive as another program's process then);
- no sample was refused at the cap (``reflexarc_samples_dropped_total``,
  reason ``series_limit``);
- two polls after the last worker was reaped, none of their series is left.

Figures (recorded, not asserted): the rate the trainers sustained, workers
started, live workers and the series on the bus per poll, exits seen (every
process on the node) and lost, the time of each poll (probes' collect,
intake, drops) and of a scrape, and the CPU time of this process (the polls,
the scrapes and the checks).

Example::

    figures = run_churn(Path("/tmp/c"), rounds=25)
    figures["failures"], figures["rate_per_s"], figures["series_max"]

Needs root and BPF. Overhead: ``TRAINERS * WORKERS / PERIOD`` forks a second
(~50), each worker ~40 reads a second; three probe compiles (~3 s).
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from reliability.counts import COUNTS

TRAINERS, WORKERS, PERIOD = 10, 5, 1.0          # 50 new workers a second, each living a period
ROUNDS = COUNTS.churn_rounds                   # periods: five minutes in a soak
CAP_PER_LIVE = 12                              # series cap per signal, per live worker
POLL_S = 1.0
PROBES = ("dataloader_io", "sched_numa", "proc_exit")

TRAINER = r"""
import os, random, sys, time
data, log, workers, period, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
out = open(log, "w", buffering=1)
size = os.path.getsize(data)

def work():
    with open("/proc/self/comm", "w") as f:
        f.write("pt_data_worker")
    fd = os.open(data, os.O_RDONLY)
    end = time.monotonic() + period
    while time.monotonic() < end:
        os.pread(fd, 4096, random.randrange(0, size - 4096, 4096))
        time.sleep(0.025)
    os._exit(0)

def reap(block):
    while True:
        try:
            pid, _ = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        out.write(f"x {pid} {time.monotonic()}\n")

due = time.monotonic()
for _ in range(rounds):
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:
            work()
        out.write(f"s {pid} {time.monotonic()}\n")
    due += period
    while time.monotonic() < due:
        reap(False)
        time.sleep(0.01)
reap(True)
out.write("done\n")
"""


def _start_trainers(tmp: Path, rounds: int) -> tuple[list[subprocess.Popen], list[Path]]:
    data = tmp / "dataset.bin"
    data.write_bytes(os.urandom(1 << 20))
    logs = [tmp / f"trainer-{n}.log" for n in range(TRAINERS)]
    procs = [subprocess.Popen([sys.executable, "-c", TRAINER, str(data), str(log), str(WORKERS), str(PERIOD),
                               str(rounds)], stdin=subprocess.DEVNULL) for log in logs]
    return procs, logs


def _instances(procs: list[subprocess.Popen], logs: list[Path]) -> tuple[dict, list[str]]:
    """``{pid: [(started, reaped or None, trainer pid)]}`` of every worker the
    trainers logged, and what went wrong."""
    instances: dict[int, list] = {}
    problems = []
    for proc, log in zip(procs, logs):
        lines = log.read_text().splitlines()
        if proc.returncode != 0 or lines[-1:] != ["done"]:
            problems.append(f"trainer {proc.pid} exited {proc.returncode}, log ending {lines[-1:]}")
        open_: dict[int, list] = {}
        for line in lines:
            kind, *rest = line.split()
            if kind == "s":
                inst = open_[int(rest[0])] = [float(rest[1]), None, proc.pid]
                instances.setdefault(int(rest[0]), []).append(inst)
            elif kind == "x" and int(rest[0]) in open_:
                open_.pop(int(rest[0]))[1] = float(rest[1])
    return {pid: [tuple(i) for i in insts] for pid, insts in instances.items()}, problems


def _worker_series(bus, names) -> list[tuple[str, int, str | None, float]]:
    """(signal, pid, trainer label, newest sample's time) of every series on
    the bus with a pid."""
    out = []
    for name in names:
        for s in bus.series(name):
            pid = s.labels.get("pid")
            if pid is not None and pid.isdigit():
                out.append((name, int(pid), s.labels.get("trainer"), s.last_ts))
    return out


def _exported_pids(collector) -> set[tuple[int, str | None]]:
    return {(int(s.labels["pid"]), s.labels.get("trainer")) for family in collector.collect()
            for s in family.samples if s.labels.get("pid", "").isdigit()}


def _foreign(pids, trainers: set[int], proc: Path = Path("/proc")) -> set[int]:
    """The ``pids`` that are alive now as children of no trainer of ours: another
    program's DataLoader workers on this node that were given a number one of
    ours had (the probes see every ``pt_data_worker``), whose series rightly
    stay while they live."""
    out = set()
    for pid in pids:
        try:
            stat = (proc / str(pid) / "stat").read_text()
        except OSError:
            continue                                  # gone: not excused
        if int(stat.rpartition(")")[2].split()[1]) not in trainers:
            out.add(pid)
    return out


def _stale(pid: int, trainer: str | None, instances: dict, since: float, until: float) -> str | None:
    """Why a series of ``pid`` seen at a poll ending ``until`` should be gone
    (a worker of ours with that pid was reaped before ``since``, the start of
    the poll before), or None: not ours, or an instance of it lived in the
    window (a reused pid: the series may be the new worker's)."""
    mine = [i for i in instances.get(pid, ()) if trainer is None or str(i[2]) == trainer]
    if not mine:
        return None
    if any(start <= until and (reaped is None or reaped >= since) for start, reaped, _ in mine):
        return None
    reaped = max(r for _, r, _ in mine if r is not None)
    return f"reaped at {reaped:.3f}, before the previous poll began at {since:.3f}"


def run_churn(tmp: Path, rounds: int = ROUNDS) -> dict:
    from prometheus_client import CollectorRegistry

    from reflexarc.bpf.manager import ProbeManager
    from reflexarc.bpf.probe import OK, Selection
    from reflexarc.controller.engine.bus import SignalBus
    from reflexarc.controller.sources.intake import Intake
    from reflexarc.controller.engine.metrics import ControllerMetrics
    from reflexarc.controller.runtime.signal_metrics import SignalCollector
    from reflexarc.controller.signals.catalogue import CATALOGUE
    from reflexarc.controller.sources.readers import ProbeSource

    tmp.mkdir(parents=True, exist_ok=True)
    cap = CAP_PER_LIVE * TRAINERS * WORKERS
    names = [n for n, spec in CATALOGUE.items() if "pid" in spec.labels]
    manager = ProbeManager(Selection(comms=("pt_data_worker",)), probes=list(PROBES))
    bus = SignalBus(max_series=cap)
    metrics = ControllerMetrics(CollectorRegistry())
    intake, source, collector = Intake(bus, metrics), ProbeSource(manager, bus=bus), SignalCollector(bus)
    statuses = manager.start()
    not_ok = {n: str(s) for n, s in statuses.items() if s.state != OK}
    if not_ok:
        manager.stop()
        return {"failures": [f"probes not running: {not_ok}"]}
    polls: list[dict] = []

    def poll() -> None:
        began = time.monotonic()
        intake.take(source.name, source.poll(began), began)
        ended = time.monotonic()
        exported = _exported_pids(collector)
        scraped = time.monotonic()
        series = _worker_series(bus, names)
        polls.append({"began": began, "ended": ended, "poll_s": ended - began, "scrape_s": scraped - ended,
                      "exits": len(manager.exited), "series": series, "exported": exported,
                      "bus_series": bus.series_count(),
                      "foreign": _foreign({s[1] for s in series} | {pid for pid, _ in exported},
                                          {p.pid for p in procs})})

    cpu0 = time.process_time()
    procs, logs = _start_trainers(tmp, rounds)
    try:
        while any(p.poll() is None for p in procs):
            poll()
            time.sleep(max(0.0, polls[-1]["began"] + POLL_S - time.monotonic()))
        for _ in range(2):                       # the last exits: seen, then dropped
            time.sleep(max(0.0, polls[-1]["began"] + POLL_S - time.monotonic()))
            poll()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        manager.stop()
    cpu = time.process_time() - cpu0
    lost = next((s.vs[-1] for s in bus.series("probe_events_lost_total") if s.labels.get("probe") == "proc_exit"),
                None)
    instances, failures = _instances(procs, logs)
    starts = sorted(start for insts in instances.values() for start, _, _ in insts)
    per_round = TRAINERS * WORKERS             # the last round's starts end the span the rate is over
    for prev, cur in zip(polls, polls[1:]):
        seen = {(pid, trainer) for _, pid, trainer, _ in cur["series"]} | cur["exported"]
        for pid, trainer in sorted(seen, key=str):
            why = None if pid in cur["foreign"] else _stale(pid, trainer, instances, prev["began"], cur["ended"])
            if why:
                held = sorted((name, round(ts, 3)) for name, p, t, ts in cur["series"] if (p, t) == (pid, trainer))
                failures.append(f"poll at {cur['began']:.3f}: worker {pid} (trainer {trainer}) still has a "
                                f"series: {why}; on the bus (signal, newest sample): {held or 'exported only'}")
    mine = {str(p.pid) for p in procs}
    left = [s[:3] for s in polls[-1]["series"]
            if s[1] in instances and s[1] not in polls[-1]["foreign"] and (s[2] is None or s[2] in mine)]
    if left:
        failures.append(f"{len(left)} series of exited workers left after the churn: {left[:5]}")
    limit = {key: v for key, v in _dropped(metrics).items() if key[1] == "series_limit"}

    def live(at: float) -> int:
        return sum(1 for insts in instances.values() for start, reaped, _ in insts
                   if start <= at and (reaped is None or reaped > at))

    per_poll = [(p, len({s[1] for s in p["series"] if s[1] in instances}), live(p["began"])) for p in polls]
    return {
        "trainers": TRAINERS, "workers_per_round": WORKERS, "period_s": PERIOD, "rounds": rounds,
        "cap_per_signal": cap, "started": len(starts),
        "rate_asked_per_s": TRAINERS * WORKERS / PERIOD,
        "rate_per_s": round((len(starts) - per_round) / (starts[-1] - starts[0]), 1) if rounds > 1 else None,
        "polls": len(polls),
        "live_max": max((n for _, _, n in per_poll), default=0),
        "worker_pids_on_bus_max": max((n for _, n, _ in per_poll), default=0),
        "series_max": max((sum(1 for s in p["series"] if s[1] in instances) for p in polls), default=0),
        "bus_series_max": max((p["bus_series"] for p in polls), default=0),
        "exits_per_poll_max": max((p["exits"] for p in polls), default=0),
        "exits_lost": lost,
        "series_limit": sum(limit.values()),
        "series_limit_by_signal": {name: n for (name, _), n in limit.items()},
        "poll_s_median": round(statistics.median(p["poll_s"] for p in polls), 4) if polls else None,
        "poll_s_max": round(max((p["poll_s"] for p in polls), default=0.0), 4),
        "scrape_s_max": round(max((p["scrape_s"] for p in polls), default=0.0), 4),
        "cpu_s": round(cpu, 1),
        "failures": failures,
    }


def _dropped(metrics) -> dict[tuple[str, str], float]:
    """``reflexarc_samples_dropped_total`` by (signal, reason)."""
    return {(s.labels["signal"], s.labels["reason"]): s.value for family in metrics.dropped.collect()
            for s in family.samples if s.name.endswith("_total")}
