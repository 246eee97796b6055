"""Loader of ``sched_numa.bpf.c``: CPU migrations, NUMA crossings, run-queue
latency and remote on-CPU time of selected processes (DataLoader workers).

A worker the scheduler bounces across NUMA nodes reads its memory remotely and
slows down (field reports: loader P99 up 4x); a worker that waits long on the
run queue starves the GPU even when its I/O is fast. The kernel counts each
migration of a watched thread on ``sched:sched_migrate_task`` and flags it as a
crossing through a CPU -> node array the loader fills from
``reflexarc.core.topology`` at start: the topology of the ``sys_root`` sysfs
tree (``/sys``, or a fixture tree declaring more nodes; ``reflexarc
--sys-root``), or a ``NodeMap`` given outright such as ``{0: [0], 1: [1]}``, so
a one-node machine is testable; ``set_topology`` reloads it. It also keeps a
log-linear histogram of wakeup (or preemption) to switch-in delay, and adds
each on-CPU stretch of a watched thread, when it is switched out, to its
process's time on the node of that CPU.

Signals: ``numa_migrations_total{pid,trainer}`` and
``numa_cross_migrations_total{pid,trainer}`` (running counters since the probe
started; selected processes are reported from zero),
``dataloader_runq_latency_us{pid,trainer,quantile}`` (per interval),
``numa_remote_ratio{pid,trainer}`` (per interval: the share of the process's
on-CPU time spent on CPUs outside its memory node), and
``probe_events_lost_total{probe="sched_numa"}`` (running count of events the
full ring buffer could not take). ``trainer`` is the worker's training process
(``core/trainers.py``), the same for the new workers of every epoch; it is left
out for a process that exited before its first collect, or an orphan. A
process whose exit the probe manager saw (``forget_exited``) is not reported
again, even while it waits to be reaped.

A process's memory node is the node with the most resident memory in
``/proc/<pid>/numa_maps`` (the ``N<node>=<pages>`` fields of every mapping,
each page weighed by its ``kernelpagesize_kB``), read once per interval and
only for the processes that ran in it. When that file is unreadable or shows
no pages, it is the node of the CPUs in the process's allowed set
(``Cpus_allowed_list``) if the topology puts them all on one; otherwise the
process gets no ratio. Memory nodes are the kernel's node ids, compared as they
are with the nodes of the topology in use: on a one-node machine every page is
on node 0, so under a declared two-node topology (a ``--sys-root`` fixture, or
``NodeMap({0: [0], 1: [1]})``) a worker running on CPU 1 is remote. A stretch
counts in the interval it ends in: a thread that runs through a whole interval
without leaving its CPU (a pure spinner alone on a CPU is switched out a few
times a second) shows in a later one, and a process that did not run, or whose
stretches all ran on CPUs of no node, gets no ratio.

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
                                     # ... ("numa_remote_ratio", {"pid": "4250", ...}, 0.97)
    probe.memory_node(4250)          # 0: the node holding most of its memory
    probe.drain_events()             # [{"kind": "cross_numa_migration", "tgid": 4242, ...}]

Overhead: sched_switch fires on every context switch on the node (~10 ns on
bare metal, plus the selection test for the outgoing task, an array and a hash
lookup, and one lookup for the incoming one); wakeups and migrations cost one
lookup unless the thread is watched (a new task's first wakeup one lookup
more); a thread's exit two deletes, and for a selected one an update (a
thread past its exit is not watched again, so nothing is counted for a
process after the exit ``proc_exit`` reports); a crossing adds one ring-buffer reserve
and submit (48 bytes; 8 pages hold ~580 events between polls). The on-CPU time
adds nothing for unselected tasks; for a watched incoming thread one clock
read (shared with the run-queue timing) and a store into the entry its lookup
returned; for a selected outgoing one a clock read, the CPU's node (an array
lookup) and an atomic add into a hash entry. Measured on the 2-core test VM
(nested virtualisation) with a C pipe ping-pong between two selected
processes on one CPU (every switch has a selected task on both sides;
``kernel.bpf_stats_enabled``): the sched_switch program went from 305 to
333 ns per switch (+28 ns), and stayed at 132 ns when neither side is
selected; the ping-pong's round trip (3.95 us without the probe) grew by
1.56 us with the program before the change and 1.34 us after it (medians of
seven interleaved rounds: no difference above noise). Collect: three batched map
reads, one non-blocking ring buffer poll and one per-CPU array read; per
process that ran, one read of its ``numa_maps`` every ``HOME_REFRESH_S`` (30 s),
where the kernel walks the process's page tables under its mmap lock: ~10 ms
per GiB resident (5.5 ms for a 0.5 GiB torch process, 22 ms for 2.3 GiB), plus one ``status`` read when it
falls back; /proc reads for a worker's ``trainer`` only when the worker is
first seen, and one ``stat`` per idle one; a selection change scans /proc for
the comms, lists /proc/<pid>/task of each selected process and looks each
thread up in ``tasks`` (writing the ones not yet watched).
"""
from __future__ import annotations

import ctypes as ct
import os
import time
from collections import defaultdict, deque

from reflexarc.core.cpus import parse_cpulist
from reflexarc.core.procfs import ProcFS
from reflexarc.core.signals import SignalSpec
from reflexarc.core.topology import NO_NODE, NodeMap, Topology
from reflexarc.core.trainers import Trainers

from .loghist import SLOTS, quantiles
from .maps import RunningTotals, drain, drain_hists, sync_selection
from .probe import DEGRADED, EVENTS_LOST, OK, UNSUPPORTED, KernelFeatures, Probe, ProbeStatus, Selection

MAX_SELECTED = 1024
MAX_EVENTS = 256        # events kept between drains; older ones are dropped
RING_PAGES = 8
REQUIRED = ("sched_migrate_task", "sched_switch", "sched_wakeup")
CROSS_NUMA_MIGRATION = "cross_numa_migration"
SMALL_PAGE_KB = 4       # a numa_maps line without kernelpagesize_kB
HOME_REFRESH_S = 30.0   # a process's memory node is re-read this often (numa_maps walks its page tables)
MAX_EXITING = 4096      # threads past sched_process_exit kept unwatched on their way out (LRU)


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


def numa_maps_kb(path: str) -> dict[int, int]:
    """Resident memory (KiB) per NUMA node in a ``numa_maps`` file: each
    mapping's ``N<node>=<pages>`` fields times its ``kernelpagesize_kB``, so a
    2 MiB huge page weighs 512 small ones; ``{}`` when the file cannot be read
    (the process is gone, or no NUMA support)."""
    sizes: dict[int, int] = defaultdict(int)
    try:
        with open(path, "rb") as f:
            for line in f:
                pages, page_kb = {}, SMALL_PAGE_KB
                for field in line.split():
                    name, _, value = field.partition(b"=")
                    if name == b"kernelpagesize_kB":
                        page_kb = int(value)
                    elif name[:1] == b"N" and name[1:].isdigit():
                        pages[int(name[1:])] = int(value)
                for node, count in pages.items():
                    sizes[node] += count * page_kb
    except OSError:
        return {}
    return dict(sizes)


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
        SignalSpec("numa_migrations_total", "1", ("node", "job", "pid", "trainer", "rank", "pod"), "counter",
                   "Task migrations between CPUs of a selected task"),
        SignalSpec("numa_cross_migrations_total", "1", ("node", "job", "pid", "trainer", "rank", "pod"), "counter",
                   "Task migrations that crossed a NUMA node boundary"),
        SignalSpec("dataloader_runq_latency_us", "us", ("node", "job", "pid", "quantile", "trainer", "rank", "pod"), "gauge",
                   "Run-queue latency (wakeup to switch-in) of DataLoader worker threads, per interval quantile"),
        SignalSpec("numa_remote_ratio", "ratio", ("node", "job", "pid", "trainer", "rank", "pod"), "gauge",
                   "Share of a task's CPU time spent on a CPU outside its memory's NUMA node"),
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
        self._homes: dict[int, tuple[float, int | None]] = {}   # pid -> (read at, memory node)
        self._events: deque[dict] = deque(maxlen=MAX_EVENTS)
        self._comm_data_loc = False

    def cflags(self) -> list[str]:
        flags = [f"-DMAX_SELECTED={MAX_SELECTED}", f"-DMAX_PIDS={self.max_pids}",
                 f"-DMAX_THREADS={self.max_threads}", f"-DMAX_EXITING={MAX_EXITING}",
                 f"-DMAX_CPUS={self.max_cpus}", f"-DHIST_SLOTS={SLOTS}", f"-DRING_PAGES={self.ring_pages}"]
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
            name = f"on_{event.removeprefix('sched_')}"        # on_wakeup, on_wakeup_new
            self.bpf.attach_tracepoint(tp=f"sched:{event}".encode(), fn_name=name.encode())
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
        threads no longer selected. A thread already watched for its process
        keeps its entry, so the stretch it is running is still counted."""
        self.selection = selection
        if self.bpf is None:
            return
        found = sync_selection(self.bpf, selection, self.procs)
        self._pids = {pid for pid in found if pid in self._pids or not self._zombie(pid)}
        tasks = self.bpf[b"tasks"]
        for pid in self._pids:
            self.migrations.ensure((pid, "all"))
            self.migrations.ensure((pid, "cross"))
            for tid in self.procs.threads(pid):
                key = ct.c_uint32(tid)
                known = tasks.get(key)
                if known is None or known.tgid != pid:
                    tasks[key] = tasks.Leaf(tgid=pid)

    def _zombie(self, pid: int) -> bool:
        """``pid`` exited and waits to be reaped: /proc lists it, named as it
        was, but it runs no more."""
        try:
            with open(os.path.join(self.procs.root, str(pid), "stat"), "rb") as f:
                return f.read().rpartition(b")")[2].split()[:1] == [b"Z"]
        except OSError:
            return False

    def memory_node(self, pid: int) -> int | None:
        """The NUMA node holding most of ``pid``'s resident memory (its
        ``numa_maps``; the lowest node on a tie). When that file is unreadable
        or shows no pages, the node of the CPUs ``pid`` may run on
        (``Cpus_allowed_list``) if ``self.topology`` puts them all on one;
        else None."""
        sizes = numa_maps_kb(os.path.join(self.procs.root, str(pid), "numa_maps"))
        if any(sizes.values()):
            return max(sorted(sizes), key=sizes.__getitem__)
        nodes = {self.topology.node_of(cpu) for cpu in self._allowed_cpus(pid)}
        return nodes.pop() if len(nodes) == 1 and NO_NODE not in nodes else None

    def _home(self, pid: int, now: float) -> int | None:
        """``memory_node`` read at most once per ``HOME_REFRESH_S`` per process."""
        hit = self._homes.get(pid)
        if hit is None or now - hit[0] >= HOME_REFRESH_S:
            hit = self._homes[pid] = (now, self.memory_node(pid))
        return hit[1]

    def _allowed_cpus(self, pid: int) -> list[int]:
        try:
            with open(os.path.join(self.procs.root, str(pid), "status")) as f:
                for line in f:
                    if line.startswith("Cpus_allowed_list:"):
                        return parse_cpulist(line.partition(":")[2].strip())
        except OSError:
            pass
        return []

    def collect(self, now: float) -> list[tuple[str, dict, float]]:
        if self.bpf is None:
            return []
        moved = drain(self.bpf[b"migrations"])
        for pid, m in moved:
            self.migrations.add((pid, "all"), m.all)
            self.migrations.add((pid, "cross"), m.cross)
        hists = drain_hists(self.bpf[b"runq_hist"])
        oncpu: dict[int, dict[int, int]] = defaultdict(dict)    # pid -> {node: ns}
        for key, ns in drain(self.bpf[b"oncpu"]):
            oncpu[key.tgid][key.node] = ns
        self.bpf.ring_buffer_poll(0)
        lost = self.bpf[b"events_lost"].sum(0).value

        out: list[tuple[str, dict, float]] = []
        for (pid, kind), total in self.migrations.items():
            name = "numa_migrations_total" if kind == "all" else "numa_cross_migrations_total"
            out.append((name, self.labels(pid=pid), total))
        for pid, hist in sorted(hists.items()):
            for q, value in quantiles(hist):
                out.append(("dataloader_runq_latency_us", self.labels(pid=pid, quantile=q), value))
        for pid, by_node in sorted(oncpu.items()):
            home, ran = self._home(pid, now), sum(by_node.values())
            if home is not None and ran:
                out.append(("numa_remote_ratio", self.labels(pid=pid), (ran - by_node.get(home, 0)) / ran))
        # One count for the node's probe, not a job's: no job label.
        out.append(("probe_events_lost_total", {"node": self.node, "probe": self.name}, float(lost)))
        active = {pid for pid, _ in moved} | self._pids
        gone = {key for key in self.migrations.keys() if key[0] not in active and not self.procs.alive(key[0])}
        self.migrations.forget(gone)
        for pid in [pid for pid in self._homes if pid not in oncpu and not self.procs.alive(pid)]:
            del self._homes[pid]
        self.trainers.prune(active | set(hists) | set(oncpu))
        return out

    def forget_exited(self, pids: frozenset[int]) -> None:
        """Stop reporting processes that exited (the probe manager passes the
        exits the kernel saw, after the collect that read their last counts;
        the kernel counts nothing for their threads after the exit). A
        selection update that finds one unreaped does not start its counters
        again: a newly selected process is not counted from zero when it is
        a zombie."""
        self.migrations.forget(key for key in self.migrations.keys() if key[0] in pids)
        self._pids -= pids
        for pid in pids:
            self._homes.pop(pid, None)
