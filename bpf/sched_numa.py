"""Loader of ``sched_numa.bpf.c``: CPU migrations, NUMA crossings and run-queue
latency of selected processes (DataLoader workers).

A worker the scheduler bounces across NUMA nodes reads its memory remotely and
slows down (field reports: loader P99 up 4x); a worker that waits long on the
run queue starves the GPU even when its I/O is fast. The kernel counts each
migration of a watched thread on ``sched:sched_migrate_task`` and flags it as a
crossing through a CPU -> node array the loader fills from
``reflexarc.core.topology`` at start: the topology of the ``sys_root`` sysfs
tree (``/sys``, or a fixture tree declaring more nodes; ``reflexarc
--sys-root``), or a ``NodeMap`` given outright such as ``{0: [0], 1: [1]}``, so
a one-node machine is testable; ``set_topology`` reloads it. It also keeps a
log-linear histogram of wakeup (or preemption) to switch-in delay.

Signals: ``numa_migrations_total{pid,trainer}`` and
``numa_cross_migrations_total{pid,trainer}`` (running counters since the probe
started; selected processes are reported from zero),
``dataloader_runq_latency_us{pid,trainer,quantile}`` (per interval), and
``probe_events_lost_total{probe="sched_numa"}`` (running count of events the
full ring buffer could not take). ``trainer`` is the worker's training process
(``bpf/trainers.py``), the same for the new workers of every epoch; it is left
out for a process that exited before its first collect, or an orphan.

Events: each cross-NUMA migration is also sent through a ring buffer as one
event; ``collect`` polls it without blocking and keeps the last ``MAX_EVENTS``
as plain dicts until ``drain_events()`` takes them::

    {"kind": "cross_numa_migration", "time": 1718000000.25, "ts_ns": 81234567890,
     "tgid": 4242, "tid": 4243, "comm": "pt_data_worker",
     "orig_cpu": 0, "dest_cpu": 1, "orig_node": 0, "dest_node": 1}

Fallback order: sched_migrate_task + sched_wakeup(_new) + sched_switch (ok);
without sched_wakeup_new (degraded: first run of new threads unseen); without
sched_migrate_task or sched_switch (unsupported).

Example::

    probe = SchedNuma(Selection(comms=("pt_data_worker",)), sys_root="/srv/two-node-sys")
    probe = SchedNuma(Selection(comms=("pt_data_worker",)), topology=NodeMap({0: [0], 1: [1]}))
    probe.start()
    ...
    probe.collect(now=time.time())   # [("numa_migrations_total", {"pid": "4250", "trainer": "4242", ...}, 3), ...]
    probe.drain_events()             # [{"kind": "cross_numa_migration", "tgid": 4242, ...}]

Overhead: sched_switch fires on every context switch on the node (~10 ns on
bare metal, plus the selection test for the outgoing task, an array and a hash
lookup, and one lookup for the incoming one); wakeups and migrations cost one
lookup unless the thread is watched; a crossing adds one ring-buffer reserve
and submit (48 bytes; 8 pages hold ~580 events between polls). On the 2-core
test VM a pipe ping-pong between two processes (~10 us a round trip) showed no
difference above noise. Collect: two batched map reads, one non-blocking ring
buffer poll and one per-CPU array read; /proc reads for a worker's ``trainer``
only when the worker is first seen, and one ``stat`` per idle one; a selection
change scans /proc for the comms and lists /proc/<pid>/task of each selected
process.
"""
from __future__ import annotations

import ctypes as ct
import os
import time
from collections import deque

from reflexarc.core.cpus import parse_cpulist
from reflexarc.core.procfs import ProcFS
from reflexarc.core.signals import SignalSpec
from reflexarc.core.topology import NodeMap, Topology

from .loghist import SLOTS, quantiles
from .maps import RunningTotals, drain, drain_hists, sync_selection
from .probe import DEGRADED, EVENTS_LOST, OK, UNSUPPORTED, KernelFeatures, Probe, ProbeStatus, Selection
from .trainers import Trainers

MAX_SELECTED = 1024
MAX_EVENTS = 256        # events kept between drains; older ones are dropped
RING_PAGES = 8
REQUIRED = ("sched_migrate_task", "sched_switch", "sched_wakeup")
CROSS_NUMA_MIGRATION = "cross_numa_migration"


class NumaEvent(ct.Structure):
    """``struct numa_event`` of sched_numa.bpf.c."""
    _fields_ = [("ts_ns", ct.c_uint64), ("tgid", ct.c_uint32), ("tid", ct.c_uint32),
                ("orig_cpu", ct.c_int32), ("dest_cpu", ct.c_int32),
                ("orig_node", ct.c_int32), ("dest_node", ct.c_int32), ("comm", ct.c_char * 16)]


def _possible_cpus(sysfs: str = "/sys") -> int:
    try:
        with open(os.path.join(sysfs, "devices/system/cpu/possible")) as f:
            return max(parse_cpulist(f.read())) + 1
    except OSError:
        return os.cpu_count() or 1


def _comm_is_data_loc(features: KernelFeatures) -> bool:
    """Whether sched_migrate_task's comm is a ``__data_loc`` string (newer
    kernels) rather than a ``char[16]``."""
    path = features.tracefs / "events/sched/sched_migrate_task/format"
    try:
        return "__data_loc char[] comm;" in path.read_text()
    except OSError:
        return False


class SchedNuma(Probe):
    name = "sched_numa"
    tier = "light"
    takes_sys_root = True
    # trainer: the training process that owns the worker; rank: that process's rank.
    signals = (
        SignalSpec("numa_migrations_total", "1", ("node", "job", "pid", "trainer", "rank"), "counter",
                   "Task migrations between CPUs of a selected task"),
        SignalSpec("numa_cross_migrations_total", "1", ("node", "job", "pid", "trainer", "rank"), "counter",
                   "Task migrations that crossed a NUMA node boundary"),
        SignalSpec("dataloader_runq_latency_us", "us", ("node", "job", "pid", "quantile", "trainer", "rank"), "gauge",
                   "Run-queue latency (wakeup to switch-in) of DataLoader worker threads, per interval quantile"),
        EVENTS_LOST,
    )
    fallback_order = (
        "sched:sched_migrate_task + sched:sched_wakeup + sched:sched_wakeup_new + sched:sched_switch",
        "without sched:sched_wakeup_new (degraded: a new thread's first wait unseen)",
    )

    def __init__(self, selection: Selection | None = None, features: KernelFeatures | None = None,
                 node: str = "", topology: NodeMap | None = None, max_pids: int = 1024,
                 max_threads: int = 16384, proc_root: str = "/proc", ring_pages: int = RING_PAGES,
                 sys_root: str = "/sys") -> None:
        super().__init__(selection, features, node)
        if ring_pages < 1 or ring_pages & (ring_pages - 1):
            raise ValueError(f"ring_pages must be a power of two, not {ring_pages}")
        self.topology = topology or Topology(sys_root).node_map()
        self.max_cpus = max(_possible_cpus(str(self.features.sysfs)), max(self.topology.cpus(), default=0) + 1)
        self.max_pids = max_pids
        self.max_threads = max_threads
        self.ring_pages = ring_pages
        self.procs = ProcFS(proc_root)
        self.trainers = Trainers(proc_root)
        self.migrations = RunningTotals()   # key (pid, "all" | "cross")
        self._wakeups: list[str] = []
        self._exit_tracepoint = False
        self._rename = False
        self._pids: set[int] = set()
        self._events: deque[dict] = deque(maxlen=MAX_EVENTS)
        self._comm_data_loc = False

    def cflags(self) -> list[str]:
        flags = [f"-DMAX_SELECTED={MAX_SELECTED}", f"-DMAX_PIDS={self.max_pids}",
                 f"-DMAX_THREADS={self.max_threads}", f"-DMAX_CPUS={self.max_cpus}",
                 f"-DHIST_SLOTS={SLOTS}", f"-DRING_PAGES={self.ring_pages}"]
        return flags + (["-DCOMM_DATA_LOC"] if self._comm_data_loc else [])

    def choose_attach_points(self) -> ProbeStatus:
        missing = [e for e in REQUIRED if not self.features.has_tracepoint("sched", e)]
        if missing:
            return ProbeStatus(UNSUPPORTED, "missing tracepoints: " + ", ".join(f"sched:{e}" for e in missing))
        self._wakeups = ["sched_wakeup"]
        if self.features.has_tracepoint("sched", "sched_wakeup_new"):
            self._wakeups.append("sched_wakeup_new")
        points = ["tracepoint:sched:sched_migrate_task", "tracepoint:sched:sched_switch"]
        points += [f"tracepoint:sched:{e}" for e in self._wakeups]
        self._exit_tracepoint = self.features.has_tracepoint("sched", "sched_process_exit")
        if self._exit_tracepoint:
            points.append("tracepoint:sched:sched_process_exit")
        self._rename = self.features.has_tracepoint("task", "task_rename")
        self._comm_data_loc = _comm_is_data_loc(self.features)
        if self._rename:
            points.append("tracepoint:task:task_rename")
        if "sched_wakeup_new" not in self._wakeups:
            return ProbeStatus(DEGRADED, "no sched:sched_wakeup_new: a new thread's first wait is unseen", points)
        return ProbeStatus(OK, "", points)

    def attach(self) -> None:
        if self._rename:    # before the scan, so no worker is named in between unseen
            self.bpf.attach_tracepoint(tp=b"task:task_rename", fn_name=b"on_rename")
        self.set_topology(self.topology)
        self.update_selection(self.selection)
        self.bpf[b"numa_events"].open_ring_buffer(self._on_event)
        self.bpf.attach_tracepoint(tp=b"sched:sched_migrate_task", fn_name=b"on_migrate")
        for event in self._wakeups:
            self.bpf.attach_tracepoint(tp=f"sched:{event}".encode(), fn_name=b"on_wakeup")
        self.bpf.attach_tracepoint(tp=b"sched:sched_switch", fn_name=b"on_switch")
        if self._exit_tracepoint:
            self.bpf.attach_tracepoint(tp=b"sched:sched_process_exit", fn_name=b"on_exit")

    def _on_event(self, _ctx, data, _size) -> None:
        e = ct.cast(data, ct.POINTER(NumaEvent)).contents
        # bpf_ktime_get_ns is CLOCK_MONOTONIC: place it on the wall clock now.
        wall = e.ts_ns / 1e9 + time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)
        self._events.append({
            "kind": CROSS_NUMA_MIGRATION, "time": wall, "ts_ns": e.ts_ns,
            "tgid": e.tgid, "tid": e.tid, "comm": e.comm.decode(errors="replace"),
            "orig_cpu": e.orig_cpu, "dest_cpu": e.dest_cpu,
            "orig_node": e.orig_node, "dest_node": e.dest_node})

    def drain_events(self) -> list[dict]:
        """The events polled since the last call (at most ``MAX_EVENTS``, oldest
        first), and forget them."""
        events = list(self._events)
        self._events.clear()
        return events

    def set_topology(self, topology: NodeMap) -> None:
        """Load a CPU -> node map into the kernel (one array update per CPU)."""
        self.topology = topology
        if self.bpf is None:
            return
        table = self.bpf[b"cpu_node"]
        for cpu, node in enumerate(topology.cpu_nodes(self.max_cpus)):
            table[ct.c_int(cpu)] = ct.c_int32(node)

    def update_selection(self, selection: Selection) -> None:
        """Rewrite the selection maps (comms resolved from /proc) and mark the
        threads of every selected process as watched at once; the kernel
        re-tests each thread when it is next switched out, which also drops
        threads no longer selected."""
        self.selection = selection
        if self.bpf is None:
            return
        self._pids = sync_selection(self.bpf, selection, self.procs)
        tasks = self.bpf[b"tasks"]
        for pid in self._pids:
            self.migrations.ensure((pid, "all"))
            self.migrations.ensure((pid, "cross"))
            for tid in self.procs.threads(pid):
                tasks[ct.c_uint32(tid)] = ct.c_uint32(pid)

    def collect(self, now: float) -> list[tuple[str, dict, float]]:
        if self.bpf is None:
            return []
        moved = drain(self.bpf[b"migrations"])
        for pid, m in moved:
            self.migrations.add((pid, "all"), m.all)
            self.migrations.add((pid, "cross"), m.cross)
        hists = drain_hists(self.bpf[b"runq_hist"])
        self.bpf.ring_buffer_poll(0)
        lost = self.bpf[b"events_lost"].sum(0).value

        out: list[tuple[str, dict, float]] = []
        for (pid, kind), total in self.migrations.items():
            name = "numa_migrations_total" if kind == "all" else "numa_cross_migrations_total"
            out.append((name, self.labels(pid=pid), total))
        for pid, hist in sorted(hists.items()):
            for q, value in quantiles(hist):
                out.append(("dataloader_runq_latency_us", self.labels(pid=pid, quantile=q), value))
        # One count for the node's probe, not a job's: no job label.
        out.append(("probe_events_lost_total", {"node": self.node, "probe": self.name}, float(lost)))
        active = {pid for pid, _ in moved} | self._pids
        gone = {key for key in self.migrations.keys() if key[0] not in active and not self.procs.alive(key[0])}
        self.migrations.forget(gone)
        self.trainers.prune(active | set(hists))
        return out
