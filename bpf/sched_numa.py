"""Loader of ``sched_numa.bpf.c``: CPU migrations, NUMA crossings and run-queue
latency of selected processes (DataLoader workers).

A worker the scheduler bounces across NUMA nodes reads its memory remotely and
slows down (field reports: loader P99 up 4x); a worker that waits long on the
run queue starves the GPU even when its I/O is fast. The kernel counts each
migration of a watched thread on ``sched:sched_migrate_task`` and flags it as a
crossing through a CPU -> node array loaded from ``bpf/topology.py`` (an
override such as ``{0: [0], 1: [1]}`` makes a one-node machine testable), and
keeps a log-linear histogram of wakeup (or preemption) to switch-in delay.

Signals: ``numa_migrations_total{pid}`` and ``numa_cross_migrations_total{pid}``
(running counters since the probe started; selected processes are reported
from zero), ``dataloader_runq_latency_us{pid,quantile}`` (per interval).

Fallback order: sched_migrate_task + sched_wakeup(_new) + sched_switch (ok);
without sched_wakeup_new (degraded: first run of new threads unseen); without
sched_migrate_task or sched_switch (unsupported).

Example::

    probe = SchedNuma(Selection(comms=("pt_data_worker",)), topology=Topology({0: [0], 1: [1]}))
    probe.start()
    ...
    probe.collect(now=time.time())   # [("numa_migrations_total", {"pid": "4242", ...}, 3), ...]

Overhead: sched_switch fires on every context switch on the node (~10 ns on
bare metal, plus the selection test for the outgoing task, an array and a hash
lookup, and one lookup for the incoming one); wakeups and migrations cost one
lookup unless the thread is watched. On the 2-core test VM a pipe ping-pong
between two processes (~10 us a round trip) showed no difference above noise.
Collect: two batched map reads; a selection change scans /proc for the comms
and lists /proc/<pid>/task of each selected process.
"""
from __future__ import annotations

import ctypes as ct
import os

from .loghist import SLOTS, quantiles
from .maps import RunningTotals, drain, drain_hists, sync_selection
from .probe import DEGRADED, OK, UNSUPPORTED, KernelFeatures, Probe, ProbeStatus, Selection
from .tasks import ProcTasks
from .topology import Topology, parse_cpulist

MAX_SELECTED = 1024
REQUIRED = ("sched_migrate_task", "sched_switch", "sched_wakeup")


def _possible_cpus(sysfs: str = "/sys") -> int:
    try:
        with open(os.path.join(sysfs, "devices/system/cpu/possible")) as f:
            return max(parse_cpulist(f.read())) + 1
    except OSError:
        return os.cpu_count() or 1


class SchedNuma(Probe):
    name = "sched_numa"
    tier = "light"
    signals = ("numa_migrations_total", "numa_cross_migrations_total", "dataloader_runq_latency_us")
    fallback_order = (
        "sched:sched_migrate_task + sched:sched_wakeup + sched:sched_wakeup_new + sched:sched_switch",
        "without sched:sched_wakeup_new (degraded: a new thread's first wait unseen)",
    )

    def __init__(self, selection: Selection | None = None, features: KernelFeatures | None = None,
                 node: str = "", topology: Topology | None = None, max_pids: int = 1024,
                 max_threads: int = 16384, proc_root: str = "/proc") -> None:
        super().__init__(selection, features, node)
        self.topology = topology or Topology.from_sysfs(str(self.features.sysfs))
        self.max_cpus = max(_possible_cpus(str(self.features.sysfs)), max(self.topology.cpus(), default=0) + 1)
        self.max_pids = max_pids
        self.max_threads = max_threads
        self.procs = ProcTasks(proc_root)
        self.migrations = RunningTotals()   # key (pid, "all" | "cross")
        self._wakeups: list[str] = []
        self._exit_tracepoint = False
        self._rename = False
        self._pids: set[int] = set()

    def cflags(self) -> list[str]:
        return [f"-DMAX_SELECTED={MAX_SELECTED}", f"-DMAX_PIDS={self.max_pids}",
                f"-DMAX_THREADS={self.max_threads}", f"-DMAX_CPUS={self.max_cpus}",
                f"-DHIST_SLOTS={SLOTS}"]

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
        self.bpf.attach_tracepoint(tp=b"sched:sched_migrate_task", fn_name=b"on_migrate")
        for event in self._wakeups:
            self.bpf.attach_tracepoint(tp=f"sched:{event}".encode(), fn_name=b"on_wakeup")
        self.bpf.attach_tracepoint(tp=b"sched:sched_switch", fn_name=b"on_switch")
        if self._exit_tracepoint:
            self.bpf.attach_tracepoint(tp=b"sched:sched_process_exit", fn_name=b"on_exit")

    def set_topology(self, topology: Topology) -> None:
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

        out: list[tuple[str, dict, float]] = []
        for (pid, kind), total in self.migrations.items():
            name = "numa_migrations_total" if kind == "all" else "numa_cross_migrations_total"
            out.append((name, self.labels(pid=pid), total))
        for pid, hist in sorted(hists.items()):
            for q, value in quantiles(hist):
                out.append(("dataloader_runq_latency_us", self.labels(pid=pid, quantile=q), value))
        active = {pid for pid, _ in moved} | self._pids
        gone = {key for key in self.migrations.keys() if key[0] not in active and not self.procs.alive(key[0])}
        self.migrations.forget(gone)
        return out
