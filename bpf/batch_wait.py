"""Loader of ``batch_wait.bpf.c``: step time and batch wait of unmodified
PyTorch training processes, seen from their DataLoader's data queue.

A DataLoader with worker processes (``pt_data_worker``) hands every batch to
the training process through one ``multiprocessing.Queue``: a pipe whose write
end the workers hold and whose read end the training process polls and reads
(``Queue.get(timeout=5)``: ``poll(2)``, then ``read(2)`` of a 4-byte length
header and of the pickled batch). The kernel times, per training process, the
wait from its first poll of that pipe to the header read, and the interval
between consecutive header reads; nothing is imported into the job and no
kernel structure is read.

The data queue is found in /proc, in user space: the read ends (``flags`` of
``fdinfo`` with access mode ``O_RDONLY``) of the pipes (``pipe:[inode]``) the
training process holds both ends of and whose write end (``O_WRONLY``) one of
its workers holds. That keeps out the workers' exit sentinels (the training
process holds only their read end) and the training process's other pipes;
the per-worker index queues match too, but the training process only writes
them, so they never count. A worker's training process is
``core.trainers.Trainers``'s. New workers are noticed in the kernel when they
name themselves (``task:task_rename``) and looked at in the next ``collect``;
/proc is scanned for every worker at start, on ``update_selection`` and every
``RESCAN_S`` seconds. A process that vanishes, or whose fds cannot be read
(EACCES), mid-scan is skipped. A new epoch without ``persistent_workers``
(new worker pids, a new pipe) mostly gets fd numbers of its own (the old
queue's are not all closed when the new one is made): the kernel keeps the
messages a watched training process reads from fds not watched yet apart
(``pending``), and the next ``collect``, once it has found the new queue, counts
those from it, so an epoch's first batches, and the long wait for the new
workers' first one, are counted like the others. An fd's first batch
continues the training process's chain of batches from its previous data
queue.

Signals, per training process (``pid``, with ``trainer`` the same pid, so that
the job, rank and pod found for it are added like for the per-worker probes):

* ``dataloader_batch_wait_ms`` (gauge): mean wait per batch taken in the
  interval. It leaves out unpickling the batch, which the job's own timing of
  ``next(iterator)`` includes: for tensors that is fetching each tensor's
  shared-memory fd from the worker over a Unix socket, ~0.3-3 ms a batch on
  the 2-core test VM (``bench/step_signals.py``). At an epoch's turn without
  persistent workers it also leaves out shutting the old workers down and
  forking new ones (``iter(loader)``, ~50-100 ms on that VM, several times that
  under load): CPU work of the training process, not a wait on the workers,
  which re-pinning cannot shorten (``persistent_workers=True`` does); the step
  time has it;
* ``step_time_ms`` (gauge): mean time of the steps closed in the interval. A
  step ends where the loop asks for its next batch (its first poll of the data
  queue), as the job's own step time does. The DataLoader returns batches in
  order: when its workers finish out of order the training process reads
  several messages in one ``next()``, keeping the early ones, and takes them
  in the next steps without a syscall (two reads ~2-10 ms apart, then none for
  a step, with 2 workers on the testbed). So a batch whose wait began less
  than ``1/BURST_DIV`` of a step's own work (the low envelope of the time
  from a read to the next step's first poll) after the previous read, while
  the group holds fewer batches than the process has workers, joins that
  group; the next wait closes it, and the time from the group's first wait to
  this one, divided among its batches, is the time of each step that took
  one. A wait that cannot join closes the group when it begins, where the
  step ended, not when its batch arrives. Without bursts each group is one
  batch, and this is the time between consecutive asks for a batch. It is
  the step time when each step takes one batch, as a training loop over a
  DataLoader does; with gradient accumulation it is the micro-step's time,
  and two loaders read at once (training and validation) each give intervals
  of their own. A persistent-workers DataLoader also reads
  one acknowledgement per worker at each epoch's start, counted as batches.
  With ``pin_memory`` the pin-memory thread takes the batches (and waits for
  them) a little ahead of the loop: the same step time in the steady state;
* ``dataloader_batches_total`` (counter): batches taken since the probe saw
  the process.

An interval in which a watched process took no batch but is waiting for one
reports, instead of means, the wait so far and, unless a step closed in it,
the time since its last batch, so a stalled loader shows as a growing value,
not as silence. The kernel also
keeps a log-linear histogram of the waits; ``wait_quantiles`` holds the last
interval's median and p99 (ms) per process, and ``steps_served`` the steps
the last interval's ``step_time_ms`` is the mean of (the batches of the groups
closed in it), per process (neither is published as a signal:
``bench/step_signals.py`` weighs merged intervals by the latter).
``collect_arrived`` gives, between two intervals, the means of the batches
and steps since the last collect, without the wait-so-far estimates: the live
loop evaluates the rules that read them as they arrive (a step's worth of
delay instead of an interval's).

Both signals share their names, and their catalogue entries, with the ones a
training script reports through the framework hooks
(``actuators/hooks.py``); the probe's carry ``pid`` and ``trainer`` as well.

Fallback order: sys_enter_poll and sys_enter_ppoll (whichever exist; glibc on
x86_64 issues poll, on arm64 ppoll) with sys_enter_read and task_rename (ok);
without task_rename, /proc scanned every interval for new workers
(degraded); no poll nor ppoll, or no read tracepoint (unsupported).

Example::

    probe = BatchWait(Selection(comms=("pt_data_worker",)))
    probe.start()
    ...
    for name, labels, value in probe.collect(now=time.time()):
        print(name, labels["pid"], value)   # step_time_ms 4242 41.3 ...

Overhead: every ``read`` on the node runs one program that compares the byte
count with 4 and returns (two tracepoint hits' worth of work is avoided: there
is no exit program); a 4-byte read costs one hash lookup; every poll/ppoll
costs one hash lookup on the caller's tgid. A watched training process pays,
per batch, one ``bpf_probe_read_user`` of its pollfd, a few hash operations, a
clock read and a histogram increment, and the same for each other message
header it reads and each poll of one other fd (its other pipes and
sockets: rare in a training loop). Enabling a syscall tracepoint moves every
syscall on the node to the traced path (shared with the other syscall probes).
Collect: one batched read-and-delete of three small maps, a look at each new
worker's and its training process's fd tables (a readlink per fd, an fdinfo
read per pipe), a ``stat`` per known worker, a /proc scan of process names at
start and every ``RESCAN_S`` seconds.
"""
from __future__ import annotations

import ctypes as ct
import os
import time

from reflexarc.core.procfs import ProcFS, comm_bytes
from reflexarc.core.signals import SignalSpec
from reflexarc.core.trainers import WORKER_COMMS, Trainers

from .dataloader_io import tracepoint_fields
from .loghist import SLOTS, quantiles
from .maps import RunningTotals, drain, drain_hists
from .probe import DEGRADED, OK, UNSUPPORTED, KernelFeatures, Probe, ProbeStatus, Selection

POLL_SYSCALLS = ("poll", "ppoll")
MAX_POLLFDS = 4          # pollfd entries searched per poll: multiprocessing polls one fd
BURST_DIV = 4            # a wait begun within 1/BURST_DIV of a step's own work after the last read joins its burst
RESCAN_S = 30.0          # full /proc scan for workers this often (new ones are seen by task_rename)
NO_WORKER_GRACE_S = 10.0  # a training process without workers this long is no longer watched
O_ACCMODE, O_RDONLY, O_WRONLY = 0o3, 0o0, 0o1
LABELS = ("node", "job", "rank", "pod", "pid", "trainer")


def pipe_ends(proc_root: str, pid: int) -> dict[int, tuple[int, int]]:
    """``{fd: (pipe inode, access mode)}`` of each pipe end process ``pid`` holds;
    what cannot be read (the process or fd went away, EACCES) is left out."""
    fd_dir = os.path.join(proc_root, str(pid), "fd")
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return {}
    out = {}
    for name in names:
        try:
            target = os.readlink(os.path.join(fd_dir, name))
        except OSError:
            continue
        if not (target.startswith("pipe:[") and target.endswith("]")):
            continue
        mode = _access_mode(os.path.join(proc_root, str(pid), "fdinfo", name))
        if mode is not None:
            out[int(name)] = (int(target[6:-1]), mode)
    return out


def _access_mode(fdinfo: str) -> int | None:
    try:
        with open(fdinfo, "rb") as f:
            for line in f:
                if line.startswith(b"flags:"):
                    return int(line.split()[1], 8) & O_ACCMODE
    except (OSError, ValueError, IndexError):
        pass
    return None


def data_queue_fds(proc_root: str, trainer: int, workers) -> set[int]:
    """The fds of ``trainer`` that may be its DataLoader's data queue: read ends
    of pipes whose write end ``trainer`` also holds and some of ``workers`` holds."""
    ends = pipe_ends(proc_root, trainer)
    own_write = {inode for inode, mode in ends.values() if mode == O_WRONLY}
    worker_write = set()
    for w in workers:
        worker_write |= {inode for inode, mode in pipe_ends(proc_root, w).values() if mode == O_WRONLY}
    return {fd for fd, (inode, mode) in ends.items()
            if mode == O_RDONLY and inode in own_write and inode in worker_write}


class _Itself(Trainers):
    """The ``trainers`` of a probe whose pids are training processes already: a
    pid's training process is itself."""

    def of(self, pid: int) -> int | None:
        return pid

    def prune(self, active) -> None:
        pass


class _Trainer:
    __slots__ = ("workers", "fds", "dirty", "alone_since")

    def __init__(self) -> None:
        self.workers: set[int] = set()
        self.fds: set[int] = set()
        self.dirty = True
        self.alone_since: float | None = None   # monotonic time its last worker was seen gone


class _Counts:
    """One training process's batches in an interval: ``struct batch_stats``,
    to which the pending batches of a data queue found late are added."""
    __slots__ = ("batches", "wait_ns", "intervals", "interval_ns")

    def __init__(self, batches: int = 0, wait_ns: int = 0, intervals: int = 0, interval_ns: int = 0) -> None:
        self.batches, self.wait_ns, self.intervals, self.interval_ns = batches, wait_ns, intervals, interval_ns

    @classmethod
    def of(cls, s) -> _Counts:
        return cls(s.batches, s.wait_ns, s.intervals, s.interval_ns)

    def add(self, other: _Counts) -> None:
        self.batches += other.batches
        self.wait_ns += other.wait_ns
        self.intervals += other.intervals
        self.interval_ns += other.interval_ns


class BatchWait(Probe):
    name = "batch_wait"
    tier = "light"
    signals = (
        SignalSpec("dataloader_batch_wait_ms", "ms", LABELS, "gauge",
                   "Time the training loop waited for the next batch"),
        SignalSpec("step_time_ms", "ms", LABELS, "gauge", "Training step time"),
        SignalSpec("dataloader_batches_total", "1", LABELS, "counter",
                   "Batches a training process took from its DataLoader workers"),
    )
    fallback_order = (
        "syscalls:sys_enter_poll and/or sys_enter_ppoll (x86_64 glibc issues poll, arm64 ppoll), "
        "syscalls:sys_enter_read, task:task_rename",
        "without task:task_rename: /proc scanned every interval for new workers (degraded)",
        "no poll nor ppoll tracepoint, or no read tracepoint: unsupported",
    )

    def __init__(self, selection: Selection | None = None, features: KernelFeatures | None = None,
                 node: str = "", max_trainers: int = 256, max_watched: int = 4096,
                 max_threads: int = 16384, proc_root: str = "/proc") -> None:
        super().__init__(selection, features, node)
        self.max_trainers = max_trainers
        self.max_watched = max_watched
        self.max_threads = max_threads
        self.proc_root = proc_root
        self.procs = ProcFS(proc_root)
        self.owners = Trainers(proc_root)
        self.trainers = _Itself(proc_root)
        self.totals = RunningTotals()
        self.wait_quantiles: dict[int, list[tuple[str, float]]] = {}
        self.steps_served: dict[int, int] = {}
        self._taken: set[int] = set()       # processes that took a batch since the last collect
        self._watched: dict[int, _Trainer] = {}
        self._polls: list[str] = []
        self._rename = False
        self._rename_pid = False
        self._next_scan = 0.0

    # --- attach ---------------------------------------------------------
    def cflags(self) -> list[str]:
        flags = [f"-DMAX_TRAINERS={self.max_trainers}", f"-DMAX_WATCHED={self.max_watched}",
                 f"-DMAX_THREADS={self.max_threads}", f"-DMAX_POLLFDS={MAX_POLLFDS}", f"-DHIST_SLOTS={SLOTS}",
                 f"-DBURST_DIV={BURST_DIV}"]
        flags += [f"-D{p.upper()}_SYSCALL" for p in self._polls]
        if self._rename:
            flags.append("-DRENAME_TRACEPOINT")
            if self._rename_pid:
                flags.append("-DRENAME_HAS_PID")
        return flags

    def choose_attach_points(self) -> ProbeStatus:
        f = self.features
        self._polls = [p for p in POLL_SYSCALLS if f.has_tracepoint("syscalls", f"sys_enter_{p}")]
        has_read = f.has_tracepoint("syscalls", "sys_enter_read")
        self._rename = f.has_tracepoint("task", "task_rename")
        self._rename_pid = self._rename and "pid" in tracepoint_fields(f, "task", "task_rename")
        if not has_read:
            return ProbeStatus(UNSUPPORTED, "no syscalls:sys_enter_read tracepoint "
                                            "(kernel built without CONFIG_FTRACE_SYSCALLS)")
        if not self._polls:
            return ProbeStatus(UNSUPPORTED, "neither syscalls:sys_enter_poll nor sys_enter_ppoll: "
                                            "the wait for a batch cannot be seen")
        points = [f"tracepoint:syscalls:sys_enter_{p}" for p in self._polls]
        points.append("tracepoint:syscalls:sys_enter_read")
        if self._rename:
            points.append("tracepoint:task:task_rename")
            return ProbeStatus(OK, "", points)
        return ProbeStatus(DEGRADED, "no task:task_rename: /proc is scanned every interval for new workers",
                           points)

    def attach(self) -> None:
        if self._rename:        # before the first scan, so no worker is named in between unseen
            table = self.bpf[b"worker_comms"]
            for comm in self._worker_comms():
                key = table.Key()
                key.comm = comm_bytes(comm)
                table[key] = table.Leaf(1)
            self.bpf.attach_tracepoint(tp=b"task:task_rename", fn_name=b"on_rename")
        self._next_scan = 0.0
        self._refresh(time.monotonic())
        for p in self._polls:
            self.bpf.attach_tracepoint(tp=f"syscalls:sys_enter_{p}".encode(), fn_name=f"on_{p}_enter".encode())
        self.bpf.attach_tracepoint(tp=b"syscalls:sys_enter_read", fn_name=b"on_read_enter")

    def update_selection(self, selection: Selection) -> None:
        """Take the new selection (its comms name the workers) and look for
        workers at the next collect."""
        self.selection = selection
        self._next_scan = 0.0

    def _worker_comms(self) -> tuple[str, ...]:
        return tuple(self.selection.comms) or WORKER_COMMS

    # --- following the training processes -------------------------------
    def _add_worker(self, worker: int) -> None:
        trainer = self.owners.of(worker)
        if trainer is None or trainer == worker:
            return
        state = self._watched.get(trainer)
        if state is None:
            state = self._watched[trainer] = _Trainer()
        if worker not in state.workers:
            state.workers.add(worker)
            state.dirty = True

    def _refresh(self, mono: float) -> None:
        """Find new workers (renamed in the kernel, or all of them on a scan),
        look at the fd tables where the workers changed, and drop the training
        processes that exited or have had no worker for a while."""
        if self._rename:
            for tid, _ in drain(self.bpf[b"renamed"]):
                tgid = self.procs.tgid(tid)
                if tgid is not None:
                    self._add_worker(tgid)
        if not self._rename or mono >= self._next_scan:
            for worker in self.procs.find(self._worker_comms()):
                self._add_worker(worker)
            self._next_scan = mono + RESCAN_S
        for trainer, state in list(self._watched.items()):
            if not self.procs.alive(trainer):
                self._unwatch(trainer)
                del self._watched[trainer]
                self.totals.forget([trainer])
                continue
            gone = {w for w in state.workers if not self.procs.alive(w)}
            state.workers -= gone
            if state.workers:
                state.alone_since = None
            elif state.alone_since is None:
                state.alone_since = mono
            elif mono - state.alone_since >= NO_WORKER_GRACE_S and state.fds:
                self._unwatch(trainer)
            if state.dirty and state.workers:
                fds = data_queue_fds(self.proc_root, trainer, state.workers)
                if fds:                   # else: mid-start or mid-exit; look again next time
                    self._watch(trainer, state, fds)
                    state.dirty = False

    def _watch(self, trainer: int, state: _Trainer, fds: set[int]) -> None:
        watch, last = self.bpf[b"watch_fd"], self.bpf[b"fd_chain"]
        for fd in fds - state.fds:
            watch[self._key(watch, trainer, fd)] = watch.Leaf(1)
        for fd in state.fds - fds:        # unwatched first, so no batch restarts the old chain
            for table in (watch, last):
                try:
                    del table[self._key(table, trainer, fd)]
                except KeyError:
                    pass
        self.bpf[b"trainers"][ct.c_uint32(trainer)] = ct.c_uint8(min(255, max(1, len(state.workers))))
        state.fds = set(fds)
        self.totals.ensure(trainer)

    def _unwatch(self, trainer: int) -> None:
        state = self._watched.get(trainer)
        for name in (b"trainers", b"trainer_chain"):
            try:
                del self.bpf[name][ct.c_uint32(trainer)]
            except KeyError:
                pass
        for fd in (state.fds if state else ()):
            for name in (b"watch_fd", b"fd_chain"):
                table = self.bpf[name]
                try:
                    del table[self._key(table, trainer, fd)]
                except KeyError:
                    pass
        if state:
            state.fds = set()
            state.dirty = True

    @staticmethod
    def _key(table, tgid: int, fd: int):
        key = table.Key()
        key.tgid, key.fd = tgid, fd
        return key

    # --- signals --------------------------------------------------------
    def watched(self) -> dict[int, set[int]]:
        """``{training process: its watched fds}``."""
        return {t: set(s.fds) for t, s in self._watched.items() if s.fds}

    def _waiting(self, watched: dict[int, set[int]], now_ns: int) -> dict[int, float]:
        """Wait so far (ms) of the processes in ``watched`` ({training process:
        its data queue's fds}) that are waiting on their data queue."""
        out: dict[int, float] = {}
        for key, mark in self.bpf[b"wait_start"].items():
            tgid = key.value >> 32
            if mark.fd in watched.get(tgid, ()) and now_ns > mark.ts:
                out[tgid] = max(out.get(tgid, 0.0), (now_ns - mark.ts) / 1e6)
        return out

    def _since_last(self, tgid: int, now_ns: int) -> float | None:
        try:
            last = self.bpf[b"trainer_chain"][ct.c_uint32(tgid)].last
        except KeyError:
            return None
        return (now_ns - last) / 1e6 if now_ns > last else None

    def _drain(self, watched: dict[int, set[int]]) -> dict[int, _Counts]:
        """The batches and closed steps since the last drain, per training
        process (``pending`` added for the fds since found to be its data
        queue); the batch totals move on."""
        stats = {key: _Counts.of(value) for key, value in drain(self.bpf[b"stats"])}
        for key, value in drain(self.bpf[b"pending"]):
            if key.fd in watched.get(key.tgid, ()):      # a data queue found since: its first batches
                stats.setdefault(key.tgid, _Counts()).add(_Counts.of(value))
        for trainer, s in stats.items():
            if s.batches:
                self.totals.add(trainer, s.batches)
                self._taken.add(trainer)
        return stats

    def collect_arrived(self, now: float) -> list[tuple[str, dict, float]]:
        """Between two intervals: the means of the batches taken and the steps
        closed since the last collect, for the processes that took or closed
        any (the live loop's arrivals, ``controller/runtime/live.py``). Nothing
        for a process waiting: its wait so far, and the wait histogram, are the
        interval's (``collect``), so a long step is one point, not several."""
        if self.bpf is None:
            return []
        out: list[tuple[str, dict, float]] = []
        for trainer, s in sorted(self._drain(self.watched()).items()):
            out.extend(self._means(trainer, s))
        return out

    def _means(self, trainer: int, s: _Counts) -> list[tuple[str, dict, float]]:
        labels = self.labels(pid=trainer)
        out = []
        if s.batches:
            out.append(("dataloader_batch_wait_ms", labels, s.wait_ns / s.batches / 1e6))
        if s.intervals:                   # steps closed: at a batch, or where a wait began
            out.append(("step_time_ms", dict(labels), s.interval_ns / s.intervals / 1e6))
        return out

    def collect(self, now: float) -> list[tuple[str, dict, float]]:
        if self.bpf is None:
            return []
        self._refresh(time.monotonic())
        watched = self.watched()
        stats = self._drain(watched)
        taken, self._taken = self._taken, set()       # took a batch in the interval, here or in an arrival
        hists = drain_hists(self.bpf[b"wait_hist"])
        self.wait_quantiles = {t: [(q, v / 1000.0) for q, v in quantiles(h)] for t, h in hists.items()}
        now_ns = time.monotonic_ns()
        self.steps_served = {t: s.intervals for t, s in stats.items() if s.intervals}
        idle = {t for t in watched if t not in taken}
        waiting = self._waiting({t: watched[t] for t in idle}, now_ns) if idle else {}

        out: list[tuple[str, dict, float]] = []
        for trainer in sorted(set(watched) | set(stats)):
            s = stats.get(trainer) or _Counts()
            out.extend(self._means(trainer, s))
            if trainer not in waiting:
                continue
            if not s.batches:
                out.append(("dataloader_batch_wait_ms", self.labels(pid=trainer), waiting[trainer]))
            if not s.intervals:
                since = self._since_last(trainer, now_ns)
                if since is not None:
                    out.append(("step_time_ms", self.labels(pid=trainer), since))
        for trainer, total in self.totals.items():
            out.append(("dataloader_batches_total", self.labels(pid=trainer), total))
        return out
