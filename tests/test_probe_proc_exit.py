"""proc_exit probe against real process exits, and what the exits do further
on: the probes forget the processes, the bus drops their series.

Every process that exits is reported once, whichever of its threads ends it
(a thread calling ``os._exit`` in a two-threaded process), and none that
runs. The fallback order is checked on stand-in tracefs trees. Then real
stand-in DataLoader workers (``pt_data_worker`` reading a file) under the
probes that see workers (``dataloader_io``, ``sched_numa``), polled by a
``ProbeSource`` into a ``SignalBus``: a worker killed while its training
process has not reaped it yet (a zombie, still named ``pt_data_worker`` in
/proc, which every poll's selection refresh scans here) has no series on the
bus, nor in its Prometheus export, two polls after the kill; its sibling's
stay. And ``sched_numa`` watches nothing of a thread past its exit (it
still switches out after the tracepoint): nothing is counted for a process
after the exit ``proc_exit`` reports.
"""
from __future__ import annotations

import ctypes as ct
import os
import signal
import subprocess
import sys
import time

from conftest import fake_tracefs, require_bpf, wait_until

from reflexarc.bpf.manager import ProbeManager
from reflexarc.bpf.probe import OK, UNSUPPORTED, Selection
from reflexarc.bpf.proc_exit import ProcExit
from reflexarc.bpf.sched_numa import SchedNuma
from reflexarc.controller.engine.bus import SignalBus
from reflexarc.controller.runtime.signal_metrics import SignalCollector
from reflexarc.controller.signals.catalogue import CATALOGUE
from reflexarc.controller.sources.readers import ProbeSource
import pytest

pytestmark = [pytest.mark.kernel]

THREAD_EXIT = r"""
import os, threading, time
threading.Thread(target=lambda: (time.sleep(0.1), os._exit(0))).start()
time.sleep(30)
"""

# A stand-in DataLoader worker reading file argv[1] until it is killed.
WORKER = r"""
import os, sys, time
def work(data):
    with open("/proc/self/comm", "w") as f:
        f.write("pt_data_worker")
    fd = os.open(data, os.O_RDONLY)
    while True:
        os.pread(fd, 4096, 0)
        time.sleep(0.02)
"""

# A training process that forks one worker and reaps it only when its stdin closes.
TRAINER = WORKER + r"""
pid = os.fork()
if pid == 0:
    work(sys.argv[1])
print(pid, flush=True)
sys.stdin.read()
os.waitpid(pid, 0)
"""


def test_every_exit_is_reported_once_and_no_running_process():
    require_bpf()
    probe = ProcExit()
    assert probe.start().state == OK, probe.status
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        short = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(5)]
        threaded = subprocess.Popen([sys.executable, "-c", THREAD_EXIT])
        for proc in (*short, threaded):
            proc.wait()
        seen = probe.drain_exits()
        assert {p.pid for p in short} <= seen
        assert threaded.pid in seen, "a process ended by a thread other than its main one"
        assert running.pid not in seen
        assert not ({p.pid for p in (*short, threaded)} & probe.drain_exits()), "an exit reported twice"
        assert probe.collect(time.time()) == [("probe_events_lost_total", {"node": probe.node, "probe": "proc_exit"},
                                               0.0)]
    finally:
        running.kill()
        running.wait()
        probe.stop()
    assert probe.drain_exits() == set()


def test_fallback_order(tmp_path):
    fields = ["comm", "pid", "prio"]
    with_group = ProcExit(features=fake_tracefs(tmp_path / "a",
                                                {"sched": {"sched_process_exit": fields + ["group_dead"]}}))
    assert with_group.choose_attach_points().state == OK and "-DGROUP_DEAD" in with_group.cflags()
    main_thread = ProcExit(features=fake_tracefs(tmp_path / "b", {"sched": {"sched_process_exit": fields}}))
    status = main_thread.choose_attach_points()
    assert status.state == OK and status.attach_points == ["tracepoint:sched:sched_process_exit"]
    assert "-DGROUP_DEAD" not in main_thread.cflags()
    none = ProcExit(features=fake_tracefs(tmp_path / "c", {"sched": {"sched_switch": ["prev_pid"]}}))
    status = none.choose_attach_points()
    assert status.state == UNSUPPORTED and "sched_process_exit" in status.reason


def test_sched_numa_stops_watching_a_thread_at_its_exit():
    require_bpf()
    probe = SchedNuma(Selection(comms=("pt_data_worker",)))
    assert probe.start().state == OK, probe.status
    worker = subprocess.Popen([sys.executable, "-c", WORKER + "work(sys.argv[1])", "/dev/zero"])
    try:
        tasks, exiting = probe.bpf[b"tasks"], probe.bpf[b"exiting"]
        wait_until("the worker watched", lambda: tasks.get(ct.c_uint32(worker.pid)) is not None, every=0.05)
        worker.kill()
        worker.wait()
        assert tasks.get(ct.c_uint32(worker.pid)) is None, "a thread watched again after its exit"
        assert exiting[ct.c_uint32(worker.pid)].value == worker.pid
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        probe.stop()


def test_a_killed_worker_leaves_the_bus_even_unreaped_and_its_sibling_stays(tmp_path):
    require_bpf()
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(1 << 16))
    manager = ProbeManager(Selection(comms=("pt_data_worker",)),
                           probes=["dataloader_io", "sched_numa", "proc_exit"])
    bus = SignalBus()
    source = ProbeSource(manager, refresh_every=0.0, bus=bus)    # every poll rescans /proc
    collector = SignalCollector(bus)
    names = [n for n, spec in CATALOGUE.items() if "pid" in spec.labels]
    trainers, workers = [], []

    def start_trainer() -> int:
        trainers.append(subprocess.Popen([sys.executable, "-c", TRAINER, str(data)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True))
        workers.append(int(trainers[-1].stdout.readline()))
        return workers[-1]

    def on_bus() -> set[int]:
        return {int(s.labels["pid"]) for n in names for s in bus.series(n)} & set(workers)

    def exported() -> set[int]:
        return {int(s.labels["pid"]) for family in collector.collect() for s in family.samples
                if s.labels.get("pid", "").isdigit()} & set(workers)

    def poll() -> set[int]:
        now = time.monotonic()
        for name, labels, value in source.poll(now):
            bus.publish(name, labels, value, now)
        return on_bus()

    def state(pid: int) -> str:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0]

    try:
        statuses = manager.start()
        assert {n: s.state for n, s in statuses.items()} == dict.fromkeys(statuses, OK), statuses
        doomed, sibling = start_trainer(), start_trainer()
        wait_until("both workers' series on the bus", lambda: poll() == {doomed, sibling}, every=0.5)
        os.kill(doomed, signal.SIGKILL)
        wait_until("the killed worker a zombie", lambda: state(doomed) == "Z", every=0.05)
        poll()                                   # sees the exit: its last counts
        newcomer = start_trainer()               # the selection changes while the zombie is listed
        wait_until("the new worker named", lambda: open(f"/proc/{newcomer}/comm").read().strip() == "pt_data_worker",
                   every=0.05)
        assert doomed not in poll(), "the killed worker's series outlived the poll after its exit was seen"
        assert sibling in on_bus() and exported() == on_bus(), (on_bus(), exported())
        assert state(doomed) == "Z", "reaped meanwhile: the case proves nothing about unreaped workers"
        assert doomed not in poll(), "a selection refresh brought the unreaped worker's series back"
        assert sibling in on_bus()
    finally:
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for t in trainers:
            t.stdin.close()
            t.wait()
        manager.stop()
