"""Processes and threads under a proc root: finding them by name inside a
scope, their threads, parents and cgroups, with a start-time guard.

Probes follow DataLoader workers (processes named ``pt_data_worker``) by tgid
and need the tids of their threads; actuators that touch other processes (CPU
affinity, framework hooks) select them by name inside a scope (the job's main
pids and their descendants, a cgroup path, one pid) and remember each one's
start time (field 22 of ``/proc/<pid>/stat``, clock ticks since boot). A pid
whose start time changed was reused by another process and must never be
touched. Names are compared as the kernel stores them: their first 15 bytes.
The proc root is injectable so tests can use a fixture tree.

Example::

    procfs = ProcFS("/proc")
    workers = procfs.find(("pt_data_worker",), pids=[4242])   # tgids below pid 4242
    for pid in workers:
        start = procfs.start_time(pid)
        tids = procfs.threads(pid)
        procfs.alive(pid, start)          # False once the pid is gone or reused

Overhead: one small file read per process looked at (plain open/read/close,
~10-20 us each on the test VM): a scan reads the ``comm`` of every process on
the node, then ``stat`` up the parent chain of each match when scoped by pids;
``threads`` lists one directory; ``cmdline`` reads at most 4 KiB.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from typing import NamedTuple

TASK_COMM_LEN = 16                # the kernel's buffer for a task name, NUL included
COMM_BYTES = TASK_COMM_LEN - 1    # so it keeps 15 bytes of a name


class ProcStat(NamedTuple):
    ppid: int
    start: int   # field 22: start time in clock ticks after boot


def comm_bytes(name: str) -> bytes:
    """``name`` as the kernel keeps it: its first ``COMM_BYTES`` bytes."""
    return name.encode()[:COMM_BYTES]


class ProcFS:
    def __init__(self, proc_root: str = "/proc") -> None:
        self.root = str(proc_root)

    def _path(self, parts) -> str:
        return os.path.join(self.root, *map(str, parts))

    def _read(self, *parts: str | int, limit: int = 1 << 20) -> bytes | None:
        """The file's bytes (at most ``limit``), or None when it (or its process) is gone."""
        try:
            fd = os.open(self._path(parts), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            chunks, size = [], 0
            while size < limit and (chunk := os.read(fd, min(65536, limit - size))):
                chunks.append(chunk)
                size += len(chunk)
            return b"".join(chunks)
        except OSError:          # the process exited between open and read
            return None
        finally:
            os.close(fd)

    def _listdir(self, *parts: str | int) -> list[int]:
        try:
            return sorted(int(n) for n in os.listdir(self._path(parts)) if n.isdigit())
        except OSError:
            return []

    def pids(self) -> list[int]:
        """Every process (tgid) visible under the root."""
        return self._listdir()

    def threads(self, pid: int) -> list[int]:
        """Thread ids of process ``pid`` (empty once it has exited)."""
        return self._listdir(pid, "task")

    def _comm(self, pid: int) -> bytes | None:
        raw = self._read(pid, "comm")
        return None if raw is None else raw.rstrip(b"\n")

    def comm(self, pid: int) -> str | None:
        raw = self._comm(pid)
        return None if raw is None else raw.decode(errors="replace")

    def cmdline(self, pid: int) -> list[str]:
        """A process's arguments, as far as the first 4 KiB hold them (empty for
        kernel threads and gone processes)."""
        raw = self._read(pid, "cmdline", limit=4096) or b""
        return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]

    def stat(self, pid: int, tid: int | None = None) -> ProcStat | None:
        """Parent pid and start time of a process, or of one of its threads."""
        raw = self._read(pid, "stat") if tid is None else self._read(pid, "task", tid, "stat")
        if not raw:
            return None
        # The comm (field 2) may hold spaces and parentheses: split after the last ')'.
        fields = raw.rpartition(b")")[2].split()
        try:
            return ProcStat(int(fields[1]), int(fields[19]))
        except (IndexError, ValueError):
            return None

    def start_time(self, pid: int, tid: int | None = None) -> int | None:
        st = self.stat(pid, tid)
        return None if st is None else st.start

    def alive(self, pid: int, start: int | None = None, tid: int | None = None) -> bool:
        """Without ``start``: process ``pid`` exists. With it: ``pid`` (or its
        thread ``tid``) still is the task that started at ``start``."""
        if start is None:
            return os.path.isdir(self._path((pid, "task")))
        return self.start_time(pid, tid) == start

    def tgid(self, tid: int) -> int | None:
        """The process a thread id belongs to (the id itself for a main thread)."""
        for line in (self._read(tid, "status") or b"").splitlines():
            if line.startswith(b"Tgid:"):
                return int(line.split()[1])
        return None

    def cgroups(self, pid: int) -> list[str]:
        """The cgroup path of ``pid`` in each hierarchy (v1 controllers and the v2 one)."""
        text = (self._read(pid, "cgroup") or b"").decode(errors="replace")
        return [line.split(":", 2)[2] for line in text.splitlines() if line.count(":") >= 2]

    def in_cgroup(self, pid: int, cgroup: str) -> bool:
        """``pid`` sits in ``cgroup`` or below it, in any hierarchy."""
        want = "/" + cgroup.strip("/")
        return any(path == want or path.startswith(want.rstrip("/") + "/") for path in self.cgroups(pid))

    def ancestors(self, pid: int) -> list[int]:
        """``pid`` then its parent, grandparent ... up to (not including) pid 0."""
        chain = []
        while pid > 0 and pid not in chain:
            chain.append(pid)
            st = self.stat(pid)
            if st is None:
                break
            pid = st.ppid
        return chain

    def descends_from(self, pid: int, roots: Iterable[int]) -> bool:
        """``pid`` is one of ``roots`` or below one of them."""
        return not set(self.ancestors(pid)).isdisjoint(int(r) for r in roots)

    def find(self, comms: Iterable[str], pids: Iterable[int] = (), cgroup: str = "",
             pid: int | None = None) -> list[int]:
        """Processes whose name is one of ``comms`` (compared on the kernel's
        15 bytes), inside the scope given: the descendants of ``pids``, the
        ``cgroup`` subtree, and/or the one process ``pid`` (a thread id is
        resolved to its process). With no scope at all, every matching process
        on the node."""
        wanted = {comm_bytes(c) for c in comms}
        if not wanted:
            return []
        roots = [int(p) for p in pids]
        if pid is not None:
            owner = self.tgid(int(pid))
            candidates = [owner] if owner is not None else []
        else:
            candidates = self.pids()
        found = [p for p in candidates if self._comm(p) in wanted]
        if roots:
            found = [p for p in found if self.descends_from(p, roots)]
        if cgroup:
            found = [p for p in found if self.in_cgroup(p, cgroup)]
        return found
