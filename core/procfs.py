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

What a target guard needs is here too: a kernel thread's ``PF_KTHREAD`` flag
(field 9 of ``stat``), a process's pid in each PID namespace (``NSpid`` of
``status``), the controller's own pid as this proc root numbers it (``self``),
and a cgroup named by its path under the cgroup2 mount (``/sys/fs/cgroup/job``)
or inside the hierarchy (``/job``) alike.

Gone or unknown: a read that fails with ENOENT or ESRCH (at open, listing or
read) means the process or thread is gone. Any other failure (EMFILE or ENFILE
when this process or the node is out of file descriptors, EACCES, EIO, ENOMEM)
says nothing about the task. By default the methods answer as for a gone task
(None, empty), which is what probes and job discovery want; with
``strict=True`` (per call, or for every call of a ``ProcFS(root, strict=True)``,
which is what the process guard of actuators uses) they raise ``ProcUnreadable``, an OSError carrying the errno
and the path (``/proc/812/stat: Too many open files``). ``alive(pid, start)``
is always strict: False only when the task is gone or its pid now names
another task. Opening a file takes a descriptor before the path is looked up,
so a strict read whose open fails looks the path up once more with ``stat``
(which needs none): a task whose entry is missing reads as gone even under
EMFILE, one whose entry is there but unreadable as unknown.

Example::

    procfs = ProcFS("/proc")
    workers = procfs.find(("pt_data_worker",), pids=[4242])   # tgids below pid 4242
    for pid in workers:
        start = procfs.start_time(pid)
        tids = procfs.threads(pid)
        procfs.alive(pid, start)          # False once the pid is gone or reused;
                                          # ProcUnreadable when it cannot tell (EMFILE...)
    procfs.kernel_thread(2), procfs.nspid(4242)   # True, [4242] (or [4242, 1] for a container's init)

Overhead: one small file read per process looked at (plain open/read/close,
~10-20 us each on the test VM): a scan reads the ``comm`` of every process on
the node, then ``stat`` up the parent chain of each match when scoped by pids;
``threads`` lists one directory; ``cmdline`` reads at most 4 KiB; the cgroup2
mounts are read once per ProcFS.
"""
from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from typing import NamedTuple

from .cgroups import cgroup2_mounts

TASK_COMM_LEN = 16                # the kernel's buffer for a task name, NUL included
COMM_BYTES = TASK_COMM_LEN - 1    # so it keeps 15 bytes of a name
PF_KTHREAD = 0x00200000           # task flag (field 9 of stat) of a kernel thread
KTHREADD = 2                      # the parent of every kernel thread, on the host
GONE = frozenset({errno.ENOENT, errno.ESRCH})   # the errnos that mean the task is gone


class ProcUnreadable(OSError):
    """A file or directory under the proc root could not be read for a reason that
    says nothing about its task (EMFILE, ENFILE, EACCES, EIO, ENOMEM...):
    ``errno``, ``strerror`` and ``filename`` are those of the failed call."""

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


class ProcStat(NamedTuple):
    ppid: int
    start: int   # field 22: start time in clock ticks after boot


def comm_bytes(name: str) -> bytes:
    """``name`` as the kernel keeps it: its first ``COMM_BYTES`` bytes."""
    return name.encode()[:COMM_BYTES]


class ProcFS:
    def __init__(self, proc_root: str = "/proc", strict: bool = False) -> None:
        self.root = str(proc_root)
        self.strict = strict          # every read strict, whatever its call says
        self._cgroup2: list[str] | None = None    # mount points, read on first use

    def _path(self, parts) -> str:
        return os.path.join(self.root, *map(str, parts))

    def _failed(self, path: str, exc: OSError, strict: bool) -> None:
        """After ``exc`` from opening, listing or reading ``path``: return when the
        task is gone (or, unless strict, whatever the cause), else raise
        ProcUnreadable."""
        if exc.errno in GONE or not (strict or self.strict):
            return None
        try:
            os.stat(path)             # a path lookup without a descriptor
        except OSError as again:
            if again.errno in GONE:
                return None
        raise ProcUnreadable(exc.errno, exc.strerror or str(exc), path) from exc

    def _read(self, *parts: str | int, limit: int = 1 << 20, strict: bool = False) -> bytes | None:
        """The file's bytes (at most ``limit``), or None when it (or its task) is
        gone; when it cannot be read, None too, or ProcUnreadable when ``strict``."""
        path = self._path(parts)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            return self._failed(path, exc, strict)
        try:
            chunks, size = [], 0
            while size < limit and (chunk := os.read(fd, min(65536, limit - size))):
                chunks.append(chunk)
                size += len(chunk)
            return b"".join(chunks)
        except OSError as exc:   # ESRCH: the task exited between open and read
            return self._failed(path, exc, strict)
        finally:
            os.close(fd)

    def _listdir(self, *parts: str | int, strict: bool = False) -> list[int]:
        path = self._path(parts)
        try:
            return sorted(int(n) for n in os.listdir(path) if n.isdigit())
        except OSError as exc:
            self._failed(path, exc, strict)
            return []

    def pids(self, strict: bool = False) -> list[int]:
        """Every process (tgid) visible under the root."""
        return self._listdir(strict=strict)

    def threads(self, pid: int, strict: bool = False) -> list[int]:
        """Thread ids of process ``pid`` (empty once it has exited; when the list
        cannot be read, empty too, or ProcUnreadable when ``strict``)."""
        return self._listdir(pid, "task", strict=strict)

    def _comm(self, pid: int, strict: bool = False) -> bytes | None:
        raw = self._read(pid, "comm", strict=strict)
        return None if raw is None else raw.rstrip(b"\n")

    def comm(self, pid: int) -> str | None:
        raw = self._comm(pid)
        return None if raw is None else raw.decode(errors="replace")

    def cmdline(self, pid: int) -> list[str]:
        """A process's arguments, as far as the first 4 KiB hold them (empty for
        kernel threads and gone processes)."""
        raw = self._read(pid, "cmdline", limit=4096) or b""
        return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]

    def _stat_fields(self, pid: int, tid: int | None = None, strict: bool = False) -> list[bytes]:
        """Fields 3.. of ``stat`` (state, ppid, ...); empty when the task is gone."""
        parts = (pid, "stat") if tid is None else (pid, "task", tid, "stat")
        raw = self._read(*parts, strict=strict)
        # The comm (field 2) may hold spaces and parentheses: split after the last ')'.
        return raw.rpartition(b")")[2].split() if raw else []

    def stat(self, pid: int, tid: int | None = None, strict: bool = False) -> ProcStat | None:
        """Parent pid and start time of a process, or of one of its threads; None
        when it is gone (ProcUnreadable when ``strict`` and it cannot be read)."""
        fields = self._stat_fields(pid, tid, strict)
        try:
            return ProcStat(int(fields[1]), int(fields[19]))
        except (IndexError, ValueError):
            return None

    def _flags(self, pid: int) -> int | None:
        try:
            return int(self._stat_fields(pid)[6])      # field 9
        except (IndexError, ValueError):
            return None

    def kernel_thread(self, pid: int) -> bool:
        """``pid`` is a kernel thread: ``PF_KTHREAD`` in its flags, or a child of
        kthreadd (ppid 2, when pid 2 is the kernel's kthreadd: in a container
        pid 2 may be an ordinary process)."""
        flags = self._flags(pid)
        if flags is not None and flags & PF_KTHREAD:
            return True
        st = self.stat(pid)
        return st is not None and st.ppid == KTHREADD and bool((self._flags(KTHREADD) or 0) & PF_KTHREAD)

    def nspid(self, pid: int) -> list[int]:
        """The pid of ``pid`` in each PID namespace it is in, from the one this proc
        root shows to its own (``NSpid`` of ``status``): ``[4242, 1]`` for a
        container's init; empty when unknown."""
        for line in (self._read(pid, "status") or b"").splitlines():
            if line.startswith(b"NSpid:"):
                try:
                    return [int(n) for n in line.split()[1:]]
                except ValueError:
                    return []
        return []

    def self_pid(self) -> int:
        """The calling process's pid as this proc root numbers it (``self``): from
        inside a PID namespace looking at the host's /proc it is not ``getpid()``."""
        try:
            return int(os.readlink(os.path.join(self.root, "self")))
        except (OSError, ValueError):
            return os.getpid()

    def start_time(self, pid: int, tid: int | None = None, strict: bool = False) -> int | None:
        """Field 22 of ``stat``; None when the task is gone (ProcUnreadable when
        ``strict`` and it cannot be read)."""
        st = self.stat(pid, tid, strict)
        return None if st is None else st.start

    def alive(self, pid: int, start: int | None = None, tid: int | None = None) -> bool:
        """Without ``start``: process ``pid`` exists. With it: ``pid`` (or its
        thread ``tid``) still is the task that started at ``start``: False only
        when it is gone or the id names another task now, ProcUnreadable when its
        ``stat`` cannot be read."""
        if start is None:
            return os.path.isdir(self._path((pid, "task")))
        return self.start_time(pid, tid, strict=True) == start

    def tgid(self, tid: int, strict: bool = False) -> int | None:
        """The process a thread id belongs to (the id itself for a main thread)."""
        for line in (self._read(tid, "status", strict=strict) or b"").splitlines():
            if line.startswith(b"Tgid:"):
                return int(line.split()[1])
        return None

    def cgroups(self, pid: int, strict: bool = False) -> list[str]:
        """The cgroup path of ``pid`` in each hierarchy (v1 controllers and the v2 one)."""
        text = (self._read(pid, "cgroup", strict=strict) or b"").decode(errors="replace")
        return [line.split(":", 2)[2] for line in text.splitlines() if line.count(":") >= 2]

    def cgroup2(self, pid: int) -> str | None:
        """The cgroup v2 path of ``pid`` (the ``0::`` line), or None."""
        for line in (self._read(pid, "cgroup") or b"").decode(errors="replace").splitlines():
            if line.startswith("0::"):
                return line[3:]
        return None

    def cgroup_path(self, cgroup: str) -> str:
        """``cgroup`` as ``/proc/<pid>/cgroup`` writes it: a path under a cgroup2
        mount loses the mount point (``/sys/fs/cgroup/job`` -> ``/job``)."""
        if self._cgroup2 is None:
            try:
                self._cgroup2 = [str(m) for m in cgroup2_mounts(self.root)]
            except OSError:           # a fixture tree without mountinfo
                self._cgroup2 = []
        path = "/" + cgroup.strip("/")
        for mount in self._cgroup2:
            if path == mount or path.startswith(mount.rstrip("/") + "/"):
                return "/" + path[len(mount):].strip("/")
        return path

    def in_cgroup(self, pid: int, cgroup: str, strict: bool = False) -> bool:
        """``pid`` sits in ``cgroup`` or below it, in any hierarchy."""
        want = self.cgroup_path(cgroup)
        return any(path == want or path.startswith(want.rstrip("/") + "/")
                   for path in self.cgroups(pid, strict))

    def ancestors(self, pid: int, strict: bool = False) -> list[int]:
        """``pid`` then its parent, grandparent ... up to (not including) pid 0."""
        chain = []
        while pid > 0 and pid not in chain:
            chain.append(pid)
            st = self.stat(pid, strict=strict)
            if st is None:
                break
            pid = st.ppid
        return chain

    def descends_from(self, pid: int, roots: Iterable[int], strict: bool = False) -> bool:
        """``pid`` is one of ``roots`` or below one of them."""
        return not set(self.ancestors(pid, strict)).isdisjoint(int(r) for r in roots)

    def find(self, comms: Iterable[str], pids: Iterable[int] = (), cgroup: str = "",
             pid: int | None = None, strict: bool = False) -> list[int]:
        """Processes whose name is one of ``comms`` (compared on the kernel's
        15 bytes), inside the scope given: the descendants of ``pids``, the
        ``cgroup`` subtree, and/or the one process ``pid`` (a thread id is
        resolved to its process). With no scope at all, every matching process
        on the node. ``strict``: ProcUnreadable rather than leaving out a
        process whose files cannot be read."""
        wanted = {comm_bytes(c) for c in comms}
        if not wanted:
            return []
        roots = [int(p) for p in pids]
        if pid is not None:
            owner = self.tgid(int(pid), strict)
            candidates = [owner] if owner is not None else []
        else:
            candidates = self.pids(strict)
        found = [p for p in candidates if self._comm(p, strict) in wanted]
        if roots:
            found = [p for p in found if self.descends_from(p, roots, strict)]
        if cgroup:
            found = [p for p in found if self.in_cgroup(p, cgroup, strict)]
        return found
