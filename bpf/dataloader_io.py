"""Loader of ``dataloader_io.bpf.c``: read latency of DataLoader workers.

A starving input pipeline shows first as slow reads in its worker processes
(``pt_data_worker``). The probe times reads two ways, both attributed to the
process that issued them: io_uring requests from submit to completion (keyed
by request pointer, since completion runs in io-wq or interrupt context) and
the read family of syscalls from entry to exit, socket receives included (a
worker that streams its items from an object store reads them with
``recvfrom``, so a slower store shows as slower reads; a client whose socket
has a timeout waits in ``poll()`` first, and only the copy is timed). The
kernel keeps a log-linear histogram per process (<= 25 % wide slots) and the
loader interpolates the quantiles, so an injected 2 ms stall reads as ~2 ms,
not as "1-2 ms".

Signals: ``dataloader_read_latency_us{pid,trainer,quantile}`` (per interval,
"0.5" and "0.99") and ``dataloader_reads_total{pid,trainer}`` (running
counter). ``trainer`` is the worker's training process (``core/trainers.py``),
the same for the new workers of every epoch; it is left out for a process
that exited before its first collect, or an orphan.

Read amplification, with ``block:block_bio_queue``: how many bytes the disks
read for each byte a worker's file reads returned.
``dataloader_read_bytes_total{pid,trainer}`` counts the bytes its read,
pread64, readv, preadv and preadv2 calls returned (file data; receives are
not counted). ``dataloader_device_read_bytes_total{pid,trainer}`` counts the
bytes of the read bios queued on a block device while the worker ran: those
of its own page-cache misses and of the readahead they started, which the
reading task submits itself. Only devices at the top of their stack count (no
``holders`` in ``/sys/dev/block/MAJ:MIN``), so a device-mapper or md bio is
not counted again on the disks below it. Readahead that a kernel thread
submits, a loop device's reads of its backing file, and writeback are not
counted. ``dataloader_read_amplification_ratio{pid,trainer}`` (per interval)
is device bytes over read bytes, for an interval in which the worker read at
least ``MIN_AMPLIFICATION_BYTES``. Above 1, the disks read more than the
loader used: readahead larger than random reads need, or records padded in
their files (the first seed's 40 % useful data is 2.5). Below 1, the page
cache served part of it.

Fallback order: io_uring_submit_req + io_uring_complete with the read syscalls
(ok); io_uring_submit_sqe of older kernels, when it carries the request pointer
(ok); read syscalls alone (degraded "syscalls only"); io_uring alone (degraded
"io_uring only"); neither (unsupported).

Example::

    probe = DataloaderIo(Selection(comms=("pt_data_worker",)))
    probe.start()
    ...
    for name, labels, value in probe.collect(now=time.time()):
        print(name, labels["pid"], labels.get("trainer"), labels.get("quantile"), value)

Overhead: every read or receive syscall on the node costs two tracepoint hits (~10 ns
each on bare metal) and, on entry, the selection test (an array and a hash
lookup); selected reads and io_uring requests add two clock reads, a hash
insert and delete and a histogram increment. Measured on the 2-core test VM
(nested virtualisation, where tracepoints cost ~20x bare metal;
bench/probe_overhead.py): the pread64 tracepoint pair with empty programs adds
0.27 us to a 0.96 us cached read, the probe timing a selected read 0.56 us, the
whole tier with the reader unselected 0.37 us; on the loaded training loader the tier
costs at most +0.1 % of an item's CPU. Enabling any syscall tracepoint also
moves every syscall on the node to the kernel's traced path (a small fixed
cost per syscall, shared with the other syscall probes). Every bio queued on
the node runs one more program (the selection test); a selected worker's
file reads and read bios add one hash update each (the byte counters), not
re-measured in ``bench/probe_overhead.py``. Collect: one batched map read; /proc reads for a worker's ``trainer``
only when the worker is first seen, and one ``stat`` per idle one. A worker
whose exit the probe manager saw (``forget_exited``) is not reported again.
"""
from __future__ import annotations

from reflexarc.core.procfs import ProcFS
from reflexarc.core.signals import SignalSpec
from reflexarc.core.trainers import Trainers

from .loghist import SLOTS, quantiles
from .maps import RunningTotals, drain_hists, sync_selection
from .probe import DEGRADED, OK, UNSUPPORTED, KernelFeatures, Probe, ProbeStatus, Selection

# Reads of files, and receives on sockets: a worker that fetches its items from
# an object store (S3, GCS, an HTTP dataset server) reads them with recvfrom.
READ_SYSCALLS = ("read", "pread64", "readv", "preadv", "preadv2", "recvfrom", "recvmsg")
RECEIVES = ("recvfrom", "recvmsg")            # timed, not file data
MIN_AMPLIFICATION_BYTES = 64 * 1024           # read in an interval, for a ratio to mean something
MINOR_BITS = 20                               # the kernel's dev_t: major << 20 | minor
AMPLIFICATION_SIGNALS = ("dataloader_read_bytes_total", "dataloader_device_read_bytes_total",
                         "dataloader_read_amplification_ratio")
URING_SUBMIT_EVENTS = ("io_uring_submit_req", "io_uring_submit_sqe")
MAX_SELECTED = 1024


def tracepoint_fields(features: KernelFeatures, category: str, event: str) -> set[str]:
    """Field names of a tracepoint, from its tracefs ``format`` file."""
    path = features.tracefs / "events" / category / event / "format"
    try:
        text = path.read_text()
    except OSError:
        return set()
    fields = set()
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("field:"):
            decl = line[len("field:"):].split(";", 1)[0]
            fields.add(decl.split()[-1].split("[")[0])
    return fields


class DataloaderIo(Probe):
    name = "dataloader_io"
    tier = "light"
    # trainer: the training process that owns the worker; rank: that process's rank.
    signals = (
        SignalSpec("dataloader_read_latency_us", "us", ("node", "job", "pid", "quantile", "trainer", "rank", "pod"), "gauge",
                   "I/O latency of DataLoader worker reads (io_uring, read and receive syscalls), per interval quantile"),
        SignalSpec("dataloader_reads_total", "1", ("node", "job", "pid", "trainer", "rank", "pod"), "counter",
                   "Reads completed by a DataLoader worker"),
        SignalSpec("dataloader_read_bytes_total", "bytes", ("node", "job", "pid", "trainer", "rank", "pod"),
                   "counter", "Bytes a DataLoader worker's file reads returned"),
        SignalSpec("dataloader_device_read_bytes_total", "bytes", ("node", "job", "pid", "trainer", "rank", "pod"),
                   "counter", "Bytes the block devices read for a DataLoader worker's reads and their readahead"),
        SignalSpec("dataloader_read_amplification_ratio", "ratio", ("node", "job", "pid", "trainer", "rank", "pod"),
                   "gauge", "Bytes the block devices read per byte a DataLoader worker's file reads returned, "
                            "per interval"),
    )
    fallback_order = (
        "io_uring:io_uring_submit_req + io_uring:io_uring_complete, and "
        "syscalls:sys_{enter,exit}_{read,pread64,readv,preadv,preadv2,recvfrom,recvmsg}",
        "io_uring:io_uring_submit_sqe (older kernels) in place of io_uring_submit_req",
        "read syscalls only (degraded: io_uring reads unseen)",
        "io_uring only (degraded: plain reads unseen)",
        "without block:block_bio_queue: no device bytes, no read amplification (degraded)",
    )

    def __init__(self, selection: Selection | None = None, features: KernelFeatures | None = None,
                 node: str = "", max_pids: int = 1024, max_threads: int = 16384,
                 max_inflight: int = 65536, proc_root: str = "/proc") -> None:
        super().__init__(selection, features, node)
        self.max_pids = max_pids
        self.max_threads = max_threads
        self.max_inflight = max_inflight
        self.procs = ProcFS(proc_root)
        self.trainers = Trainers(proc_root)
        self.totals = RunningTotals()
        self._syscalls: list[str] = []
        self._uring_submit: str | None = None
        self._rename = False
        self._bio_queue = False
        self._bytes: dict[int, tuple[int, int]] = {}     # pid -> (read bytes, device bytes) at the last collect
        self._top_of_stack: dict[int, bool] = {}

    def cflags(self) -> list[str]:
        flags = [f"-DMAX_SELECTED={MAX_SELECTED}", f"-DMAX_PIDS={self.max_pids}",
                 f"-DMAX_THREADS={self.max_threads}", f"-DMAX_INFLIGHT={self.max_inflight}",
                 f"-DHIST_SLOTS={SLOTS}"]
        if self._syscalls:
            flags.append("-DREAD_SYSCALLS")
        if self._uring_submit == "io_uring_submit_req":
            flags.append("-DURING_SUBMIT_REQ")
        elif self._uring_submit == "io_uring_submit_sqe":
            flags.append("-DURING_SUBMIT_SQE")
        if self._bio_queue:
            flags.append("-DBLOCK_BIO_QUEUE")
        return flags

    def choose_attach_points(self) -> ProbeStatus:
        f = self.features
        self._syscalls = [s for s in READ_SYSCALLS
                          if f.has_tracepoint("syscalls", f"sys_enter_{s}")
                          and f.has_tracepoint("syscalls", f"sys_exit_{s}")]
        self._uring_submit = None
        if f.has_tracepoint("io_uring", "io_uring_complete"):
            complete_fields = tracepoint_fields(f, "io_uring", "io_uring_complete")
            for event in URING_SUBMIT_EVENTS:
                # Matching needs the request pointer on both sides (5.15 and later).
                if (f.has_tracepoint("io_uring", event) and "req" in complete_fields
                        and "req" in tracepoint_fields(f, "io_uring", event)):
                    self._uring_submit = event
                    break
        points = [f"tracepoint:syscalls:sys_{side}_{s}" for s in self._syscalls for side in ("enter", "exit")]
        if self._uring_submit:
            points += [f"tracepoint:io_uring:{self._uring_submit}", "tracepoint:io_uring:io_uring_complete"]
        self._rename = f.has_tracepoint("task", "task_rename")
        if self._rename:
            points.append("tracepoint:task:task_rename")
        self._bio_queue = bool(self._syscalls) and f.has_tracepoint("block", "block_bio_queue")
        if self._bio_queue:
            points.append("tracepoint:block:block_bio_queue")
        if self._syscalls and self._uring_submit and not self._bio_queue:
            return ProbeStatus(DEGRADED, "no block:block_bio_queue: no device bytes, no read amplification", points)
        if self._syscalls and self._uring_submit:
            return ProbeStatus(OK, "", points)
        if self._syscalls:
            return ProbeStatus(DEGRADED, "syscalls only: no io_uring submit/complete tracepoints "
                                         "carrying the request pointer", points)
        if self._uring_submit:
            return ProbeStatus(DEGRADED, "io_uring only: no read syscall tracepoints "
                                         "(kernel built without CONFIG_FTRACE_SYSCALLS)", points)
        return ProbeStatus(UNSUPPORTED, "neither read syscall nor io_uring tracepoints")

    def unproduced(self) -> dict[str, str]:
        if self._bio_queue:
            return {}
        why = ("no block:block_bio_queue tracepoint" if self._syscalls
               else "no read syscall tracepoints: the bytes read are not seen")
        return {name: why for name in AMPLIFICATION_SIGNALS}

    def attach(self) -> None:
        if self._rename:    # before the scan, so no worker is named in between unseen
            self.bpf.attach_tracepoint(tp=b"task:task_rename", fn_name=b"on_rename")
        self.update_selection(self.selection)
        for s in self._syscalls:
            self.bpf.attach_tracepoint(tp=f"syscalls:sys_enter_{s}".encode(), fn_name=b"on_read_enter")
            exit_fn = b"on_recv_exit" if s in RECEIVES else b"on_read_exit"
            self.bpf.attach_tracepoint(tp=f"syscalls:sys_exit_{s}".encode(), fn_name=exit_fn)
        if self._bio_queue:
            self.bpf.attach_tracepoint(tp=b"block:block_bio_queue", fn_name=b"on_bio_queue")
        if self._uring_submit:
            self.bpf.attach_tracepoint(tp=f"io_uring:{self._uring_submit}".encode(), fn_name=b"on_uring_submit")
            self.bpf.attach_tracepoint(tp=b"io_uring:io_uring_complete", fn_name=b"on_uring_complete")

    def update_selection(self, selection: Selection) -> None:
        """Rewrite the selection maps; comms are resolved to processes from /proc
        (later renames are caught in the kernel)."""
        self.selection = selection
        if self.bpf is not None:
            sync_selection(self.bpf, selection, self.procs)

    def collect(self, now: float) -> list[tuple[str, dict, float]]:
        if self.bpf is None:
            return []
        hists = drain_hists(self.bpf[b"lat_hist"])
        for pid, hist in hists.items():
            self.totals.add(pid, sum(hist.values()))

        out: list[tuple[str, dict, float]] = []
        for pid, hist in sorted(hists.items()):
            for q, value in quantiles(hist):
                out.append(("dataloader_read_latency_us", self.labels(pid=pid, quantile=q), value))
        for pid, total in self.totals.items():
            out.append(("dataloader_reads_total", self.labels(pid=pid), total))
        if self._bio_queue:
            out += self._amplification()
        active = set(hists)
        gone = {pid for pid in self.totals.keys() - active if not self.procs.alive(pid)}
        gone |= {pid for pid in self._bytes.keys() - active - self.totals.keys() if not self.procs.alive(pid)}
        self.totals.forget(gone)
        self._forget_bytes(gone)
        self.trainers.prune(active)
        return out

    def _top(self, dev: int) -> bool:
        """The device is at the top of its stack: nothing (dm, md) holds it."""
        top = self._top_of_stack.get(dev)
        if top is None:
            majmin = f"{dev >> MINOR_BITS}:{dev & ((1 << MINOR_BITS) - 1)}"
            try:
                top = not any((self.features.sysfs / "dev" / "block" / majmin / "holders").iterdir())
            except OSError:
                top = True                    # gone or no holders directory: nothing stacks on it
            self._top_of_stack[dev] = top
        return top

    def _amplification(self) -> list[tuple[str, dict, float]]:
        """The byte counters of every worker seen, and the ratio of the
        interval's device bytes to its read bytes where it read enough."""
        now: dict[int, list[int]] = {}
        for key, value in self.bpf[b"io_bytes"].items():
            pair = now.setdefault(key.tgid, [0, 0])
            if key.dev == 0:
                pair[0] += value.value
            elif self._top(key.dev):
                pair[1] += value.value
        out = []
        for pid, (read, device) in sorted(now.items()):
            labels = self.labels(pid=pid)
            out.append(("dataloader_read_bytes_total", labels, float(read)))
            out.append(("dataloader_device_read_bytes_total", dict(labels), float(device)))
            before_read, before_device = self._bytes.get(pid, (0, 0))
            if read - before_read >= MIN_AMPLIFICATION_BYTES:
                out.append(("dataloader_read_amplification_ratio", dict(labels),
                            (device - before_device) / (read - before_read)))
            self._bytes[pid] = (read, device)
        return out

    def _forget_bytes(self, pids) -> None:
        pids = set(pids)
        if not pids or self.bpf is None or not self._bio_queue:
            return
        table = self.bpf[b"io_bytes"]
        for key in [k for k in table.keys() if k.tgid in pids]:
            try:
                del table[key]
            except KeyError:
                pass
        for pid in pids:
            self._bytes.pop(pid, None)

    def forget_exited(self, pids: frozenset[int]) -> None:
        """Stop reporting the counters of processes that exited (the probe
        manager passes the exits the kernel saw, after the collect that read
        their last reads)."""
        self.totals.forget(pids)
        self._forget_bytes(pids)
