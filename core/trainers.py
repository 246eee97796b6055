"""The training process that owns each DataLoader worker, for the ``trainer``
label of per-worker signals.

A DataLoader without ``persistent_workers`` starts new worker processes (new
pids) every epoch; their training process stays. With the fork and spawn start
methods it is the worker's parent; with forkserver the parent is Python's fork
server, whose parent it is; a worker started by a worker sits one level lower.
So the owner is the first ancestor that is neither a worker (``WORKER_COMMS``)
nor a fork server. A worker whose chain reaches pid 1 first (an orphan) has
none. Everything is read from /proc in user space (``stat``, ``comm``,
``cmdline``), never from kernel structures.

Each process is resolved once, while it runs, and kept with its start time;
``prune`` drops the processes that exited or whose pid now names a process
started at another time, so a reused pid is resolved afresh. A pid reused within
one interval without ever being idle keeps the first owner (that needs the pid
space to wrap around within the interval). A worker that exits before it is
first looked up has no owner.

Example::

    trainers = Trainers("/proc")
    trainers.of(4250)                # 4242, the training process of worker 4250
    trainers.prune(active={4250})    # once per interval: forget exited idle workers

Overhead: a first look-up reads 4-8 small /proc files (the worker's ``stat``,
then ``comm``, ``cmdline`` and, for each level walked up, ``stat``); later
look-ups are a dict hit. ``prune`` reads one ``stat`` per known process that
was not active in the interval.
"""
from __future__ import annotations

from collections.abc import Iterable

from .procfs import ProcFS, comm_bytes

WORKER_COMMS = ("pt_data_worker",)
FORKSERVER = "from multiprocessing.forkserver import main"   # the -c argument of Python's fork server


class Trainers:
    def __init__(self, proc_root: str = "/proc", worker_comms: Iterable[str] = WORKER_COMMS) -> None:
        self.procfs = ProcFS(proc_root)
        self.worker_comms = {comm_bytes(c).decode(errors="ignore") for c in worker_comms}   # as the kernel keeps them
        self._known: dict[int, tuple[int, int | None]] = {}   # pid -> (start, trainer)

    def of(self, pid: int) -> int | None:
        """The training process of ``pid``, or None (gone, or an orphan)."""
        known = self._known.get(pid)
        if known is None:
            st = self.procfs.stat(pid)
            if st is None:
                return None
            known = self._known[pid] = (st.start, self._owner(st.ppid))
        return known[1]

    def _owner(self, pid: int) -> int | None:
        """``pid`` or its first ancestor that is neither a worker nor a fork server."""
        seen = set()
        while pid > 1 and pid not in seen:
            seen.add(pid)
            comm = self.procfs.comm(pid)
            if comm is None:
                return None
            if comm not in self.worker_comms and not self._forkserver(pid):
                return pid
            st = self.procfs.stat(pid)
            if st is None:
                return None
            pid = st.ppid
        return None

    def _forkserver(self, pid: int) -> bool:
        return any(arg.startswith(FORKSERVER) for arg in self.procfs.cmdline(pid))

    def prune(self, active: Iterable[int]) -> None:
        """Forget the processes not in ``active`` that exited or whose pid now
        names a process started at another time."""
        for pid in self._known.keys() - set(active):
            st = self.procfs.stat(pid)
            if st is None or st.start != self._known[pid][0]:
                del self._known[pid]
