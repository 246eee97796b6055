"""The training jobs on this node, found from the node alone: each process's
launcher environment (``core.launchers``) and cgroup (``core.cgroup_jobs``),
with no flag, hook or code change in the job.

A process's identity is its job, rank, local rank and world size, its pod and
container or Slurm step, and the evidence they were read from. Children
inherit the environment and the cgroup, so DataLoader workers, pin-memory
threads and helper processes carry their training process's identity; a
worker is labelled through its training process (``core.trainers``) all the
same, so a worker that exits before it is read still has one.

The training processes of a job are those that hold a rank and are not
launchers (a process of the job whose descendants got their own rank, such as
torchrun's agent under ``srun``), plus the owners of DataLoader workers. An
owner of DataLoader workers whose environment and cgroup name no job (a job
started by hand: ``python train.py``) is a job of its own, named after the
process (``own_job``: ``train.py-4242``, evidence ``process``, no rank), for
its life; its workers and the processes below it follow it. ``fallback`` (the
``--job`` flag) comes first: it names the training processes discovery finds
no launcher, pod or Slurm job for (and so the processes below them), instead
of their own names, and never relabels a job that was found. Any other process
whose environment and cgroup name no job has none.

Bad input never raises: an environment that cannot be read (another user's,
without root), that vanishes mid-read, that is larger than ``max_environ`` or
whose recognised keys hold values no launcher sets is skipped and counted in
``skipped`` by reason; a read that fails because file descriptors ran out is
counted as ``fd-exhausted`` and tried again at the next refresh, never taken
for a process that went away. Nothing but the recognised keys is kept, so
nothing else can reach a log, the audit, a metric or a report.

Example::

    jobs = Discovery("/proc")
    jobs.refresh()
    jobs.identity(4250).labels()    # {"job": "llama-7b", "rank": "3", "pod": "1b2c..."}
    jobs.identity(5120).labels()    # {"job": "train.py-5100"}: a worker of a job started by hand
    for job in jobs.jobs():
        job.name, [(t.rank, t.pid) for t in job.trainers]

Overhead: a refresh lists /proc and reads one ``stat`` per process; a process
seen for the first time also costs its ``comm``, ``environ`` (up to
``max_environ``) and ``cgroup`` (~50 us in all); a training process with no
job found, its ``cmdline`` too, once. ``identity`` of a known pid is a dict
hit; of a process below a job of its own, one per process up to it.
"""
from __future__ import annotations

import errno
import os
import re
from collections import Counter
from dataclasses import dataclass, field

from .cgroup_jobs import Placement, from_cgroups
from .launchers import Launch, Malformed, from_environ, recognised
from .procfs import ProcFS
from .trainers import WORKER_COMMS, Trainers

SKIP_REASONS = ("unreadable", "vanished", "oversized", "malformed", "fd-exhausted")
MAX_ENVIRON = 1 << 20       # bytes: an environment larger than this is not a launcher's
OWN_EVIDENCE = "process"    # the evidence of a job of its own: a training process, no launcher, pod or Slurm job
NOT_LABEL_TEXT = re.compile(r"[^A-Za-z0-9._-]+")
MAX_OWN_NAME = 64           # characters of the script or command name kept


@dataclass(frozen=True)
class Identity:
    job: str
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    launcher: str = ""
    pod: str = ""
    container: str = ""
    slurm_step: str = ""
    cgroup: str = ""
    evidence: tuple[str, ...] = ()

    def labels(self) -> dict[str, str]:
        """The labels every signal of this process carries."""
        out = {"job": self.job}
        if self.rank is not None:
            out["rank"] = str(self.rank)
        if self.pod:
            out["pod"] = self.pod
        return out


def identify(launch: Launch | None, place: Placement | None) -> Identity | None:
    """One identity from what the environment and the cgroup say."""
    if launch is None and place is None:
        return None
    evidence = tuple(f"environ {key}" for key in launch.evidence) if launch else ()
    if place is not None:
        evidence += (place.evidence,)
    if launch is not None:
        job = launch.job
    elif place.slurm_job:
        job = f"slurm-{place.slurm_job}"
    else:
        job = place.pod
    return Identity(job, launch.rank if launch else None, launch.local_rank if launch else None,
                    launch.world_size if launch else None, launch.launcher if launch else place.evidence.split()[0],
                    pod=place.pod if place else "", container=place.container if place else "",
                    slurm_step=place.slurm_step if place else "", cgroup=place.cgroup if place else "",
                    evidence=evidence)


def own_job(pid: int, comm: str, cmdline: list[str]) -> str:
    """The job of a training process started by no launcher: ``<name>-<pid>``,
    the name being the file name of its first ``.py`` argument, else the
    module after ``-m``, else (``-c`` code, a program that is not Python) its
    command name; other arguments (which may hold secrets) are never kept.
    Only ``[A-Za-z0-9._-]`` is kept, so the name is a label value as it is."""
    name = comm
    for before, arg in zip(["", *cmdline], cmdline):
        if before == "-c":
            break
        if not arg.startswith("-") and "=" not in arg and (arg.endswith(".py") or before == "-m"):
            name = os.path.basename(arg)
            break
    name = NOT_LABEL_TEXT.sub("_", name).strip("._-")[:MAX_OWN_NAME]
    return f"{name or 'process'}-{pid}"


UNATTRIBUTED = Identity("")


@dataclass
class Trainer:
    pid: int
    identity: Identity
    processes: list[int] = field(default_factory=list)    # itself and every process that follows it

    @property
    def rank(self) -> int | None:
        return self.identity.rank


@dataclass
class Job:
    name: str
    trainers: list[Trainer]

    @property
    def pods(self) -> list[str]:
        return sorted({t.identity.pod for t in self.trainers if t.identity.pod})

    @property
    def cgroups(self) -> list[str]:
        return sorted({t.identity.cgroup for t in self.trainers if t.identity.cgroup})

    @property
    def evidence(self) -> list[str]:
        return sorted({e for t in self.trainers for e in t.identity.evidence})

    def as_dict(self) -> dict:
        return {"job": self.name, "pods": self.pods, "cgroups": self.cgroups, "evidence": self.evidence,
                "ranks": [{"rank": t.identity.rank, "local_rank": t.identity.local_rank,
                           "world_size": t.identity.world_size, "launcher": t.identity.launcher,
                           "pid": t.pid, "processes": sorted(t.processes), "pod": t.identity.pod,
                           "cgroup": t.identity.cgroup,
                           **({"container": t.identity.container} if t.identity.container else {}),
                           **({"slurm_step": t.identity.slurm_step} if t.identity.slurm_step else {})}
                          for t in sorted(self.trainers, key=lambda t: (t.rank is None, t.rank or 0, t.pid))]}


@dataclass
class _Known:
    start: int
    ppid: int
    comm: str
    key: tuple | None            # what the identity was read from (recognised env, placement)
    identity: Identity | None
    own: Identity | None = None  # a training process with no identity: its job of its own


class Discovery:
    def __init__(self, proc_root: str = "/proc", fallback: str = "", *, max_environ: int = MAX_ENVIRON,
                 worker_comms: tuple[str, ...] = WORKER_COMMS) -> None:
        self.procfs = ProcFS(proc_root)
        self.fallback = fallback
        self.max_environ = max_environ
        self.trainers = Trainers(proc_root, worker_comms)
        self.worker_comms = self.trainers.worker_comms
        self.skipped: Counter[str] = Counter()
        self._known: dict[int, _Known] = {}

    # --- reading one process --------------------------------------------------
    def _environ(self, pid: int) -> bytes | str:
        """The environ bytes, or the skip reason."""
        path = os.path.join(self.procfs.root, str(pid), "environ")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            # ESRCH: a task with no address space (a kernel thread, a zombie) has no environment
            return b"" if exc.errno == errno.ESRCH else _reason(exc)
        try:
            chunks, size = [], 0
            while chunk := os.read(fd, 65536):
                size += len(chunk)
                if size > self.max_environ:
                    return "oversized"
                chunks.append(chunk)
            return b"".join(chunks)
        except OSError as exc:
            return _reason(exc)
        finally:
            os.close(fd)

    def _read(self, pid: int, start: int, ppid: int) -> _Known | None:
        comm = self.procfs.comm(pid)
        if comm is None:
            self.skipped["vanished"] += 1
            return None
        raw = self._environ(pid)
        if isinstance(raw, str):
            self.skipped[raw] += 1
            return None
        try:
            env = recognised(raw)
        except Malformed:
            self.skipped["malformed"] += 1
            return None
        finally:
            del raw                                  # the rest of the environment goes no further
        try:
            launch = from_environ(env)
        except ValueError:
            self.skipped["malformed"] += 1
            return None
        place = from_cgroups(self.procfs.cgroups(pid))
        if self.procfs.start_time(pid) != start:     # the pid was reused while it was read
            self.skipped["vanished"] += 1
            return None
        key = (tuple(sorted(env.items())), place)
        return _Known(start, ppid, comm, key if (launch or place) else None, identify(launch, place))

    def _lookup(self, pid: int) -> _Known | None:
        known = self._known.get(pid)
        st = self.procfs.stat(pid)
        if st is None:
            if os.path.isdir(os.path.join(self.procfs.root, str(pid))):   # stat(2) needs no descriptor
                self.skipped["fd-exhausted"] += 1                          # still there: the read failed
                return known
            self._known.pop(pid, None)
            return None
        if known is not None and known.start == st.start:
            known.ppid = st.ppid
            return known
        known = self._read(pid, st.start, st.ppid)
        if known is not None:
            self._known[pid] = known
        return known

    # --- the node ---------------------------------------------------------------
    def refresh(self) -> None:
        """Read every process not seen before; forget the ones that exited."""
        try:
            pids = {int(n) for n in os.listdir(self.procfs.root) if n.isdigit()}
        except OSError as exc:
            self.skipped[_reason(exc)] += 1      # out of descriptors: keep what is known, try again later
            return
        for pid in self._known.keys() - pids:
            del self._known[pid]
        for pid in sorted(pids):
            self._lookup(pid)
        for pid, known in self._known.items():
            if known.comm in self.worker_comms:
                self._trains(self.trainers.of(pid))
        self.trainers.prune(active=())

    def _trains(self, pid: int | None) -> None:
        """``pid`` owns DataLoader workers: with no identity, it is a job of its own."""
        known = self._known.get(pid) if pid is not None else None
        if known is None or known.identity is not None or known.own is not None:
            return
        cmdline = self.procfs.cmdline(pid)
        if self.procfs.start_time(pid) == known.start:     # not the pid's next process
            known.own = Identity(own_job(pid, known.comm, cmdline), evidence=(OWN_EVIDENCE,))

    def _own(self, pid: int) -> Identity | None:
        """The job of its own of ``pid``, or of the nearest process above it that
        has one, up to the first process with an identity."""
        seen = set()
        while pid > 1 and pid not in seen:
            seen.add(pid)
            known = self._known.get(pid)
            if known is None or known.identity is not None:
                return None
            if known.own is not None:
                return known.own
            pid = known.ppid
        return None

    def identity(self, pid: int) -> Identity | None:
        """The identity of ``pid``'s training process (``pid`` itself unless it
        is a DataLoader worker), else its own; for one that has none, the
        fallback, else the job of its own of that training process or of the
        one above it."""
        known = self._known.get(pid) or self._lookup(pid)      # a dict hit once read: no /proc read
        comm = known.comm if known is not None else self.procfs.comm(pid)
        owner = self.trainers.of(pid) if comm in self.worker_comms else pid
        for candidate in ((owner, pid) if owner not in (None, pid) else (pid,)):
            known = self._known.get(candidate) or self._lookup(candidate)
            if known is not None and known.identity is not None:
                return known.identity
        if self.fallback and owner is not None:
            return Identity(self.fallback, launcher="", evidence=("--job",))
        if owner is None:
            return None
        if owner != pid:
            self._trains(owner)
        return self._own(owner)

    def _launchers(self) -> set[int]:
        """Processes of a job with a rank below them that got its own environment."""
        out = set()
        for pid, known in self._known.items():
            if known.identity is None or known.identity.rank is None:
                continue
            parent = self._known.get(known.ppid)
            if parent is not None and parent.key == known.key:
                continue                              # it inherited: a follower, not a new rank
            seen = {pid}
            ppid = known.ppid
            while ppid > 1 and ppid not in seen:
                seen.add(ppid)
                up = self._known.get(ppid)
                if up is None:
                    break
                if up.identity is not None and up.identity.job == known.identity.job and up.key != known.key:
                    out.add(ppid)
                ppid = up.ppid
        return out

    def jobs(self) -> list[Job]:
        """Every job with a training process on the node (after ``refresh``), a
        job of its own for each started by no launcher; the training processes
        whose environment could not be read (another user's, without root)
        under the job ``""``."""
        launchers = self._launchers()
        heads: dict[int, Identity] = {}
        for pid, known in self._known.items():
            if known.comm in self.worker_comms or pid in launchers:
                continue
            ident = known.identity
            if ident is None or ident.rank is None:
                continue
            parent = self._known.get(known.ppid)
            if parent is None or parent.key != known.key or parent.comm in self.worker_comms:
                heads[pid] = ident
        for pid, known in self._known.items():       # the owners of DataLoader workers
            if known.comm in self.worker_comms:
                owner = self.trainers.of(pid)
                if owner is not None and owner not in heads and owner not in launchers:
                    heads[owner] = self.identity(owner) or UNATTRIBUTED
            elif known.own is not None:               # a job of its own, between two sets of workers too
                heads[pid] = self.identity(pid)
        trainers = {pid: Trainer(pid, ident) for pid, ident in heads.items()}
        for pid in self._known:
            head = self._head(pid, trainers)
            if head is not None:
                trainers[head].processes.append(pid)
        by_job: dict[str, list[Trainer]] = {}
        for t in trainers.values():
            by_job.setdefault(t.identity.job, []).append(t)
        return [Job(name, ts) for name, ts in sorted(by_job.items())]

    def _head(self, pid: int, trainers: dict[int, Trainer]) -> int | None:
        seen = set()
        while pid > 1 and pid not in seen:
            if pid in trainers:
                return pid
            seen.add(pid)
            known = self._known.get(pid)
            if known is None:
                return None
            pid = known.ppid
        return None


def _reason(exc: OSError) -> str:
    if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
        return "fd-exhausted"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "unreadable"
    return "vanished"
