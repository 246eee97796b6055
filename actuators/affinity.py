"""The ``affinity`` actuator: re-pins every thread of a job's DataLoader workers to
the CPUs of one NUMA node (or an explicit CPU list), and puts each thread's own
original mask back on revert.

Targets are processes whose comm is ``pt_data_worker`` (or the selector's
``processes``) inside the job's scope: descendants of ``selector["pids"]``, the
``selector["cgroup"]`` subtree, the single worker ``labels["pid"]``, or the
workers below the training process ``labels["trainer"]`` (which must itself be
below ``selector["pids"]`` when those are given). Every thread of each
(``/proc/<pid>/task/*``) is re-pinned; torch names a worker's threads
``pt_data_worker`` as well. Each process and thread is recorded with its start time
(field 22 of ``stat``) so a reused pid is never touched; a training process is
recorded the same way, and its workers are followed only while it is the process
that was planned for.

Refused in every mode, with ``TargetRefused`` naming the pid and why
(``reflexarc.core.targets``): a target with no process scope (no selector pids
or cgroup, no ``pid`` or ``trainer`` label: a process name alone would match
anywhere on the node), the root cgroup, a scope rooted at init, a kernel thread
or the controller, a named process or training process outside the selector,
and any process to pin that is init (of any PID namespace), a kernel thread,
the controller or a child of it. ``refresh`` skips such processes.

The change (plain JSON)::

    before = {"cpus": [0, 1] | None,        # the mask all threads share now, None when they differ
              "processes": [{"pid": 812, "start": 91023, "comm": "pt_data_worker",
                             "threads": [{"tid": 812, "start": 91023, "cpus": [0, 1]}, ...]}],
              "trainer": {"pid": 800, "start": 90011, "comm": "python"}}   # only by trainer
    after  = the same with every "cpus" set to the new mask

``refresh(change)`` pins workers and threads that appeared since (new DataLoader
workers each epoch, new threads in a worker), records their originals in the
returned change and drops the ones that exited. A change by trainer may start
with no worker running (between epochs): it pins the next epoch's.

Gone or cannot tell: a process or thread counts as gone only when /proc says so
(ENOENT, ESRCH) or ``sched_setaffinity`` finds no such task. When /proc cannot be
read (the controller out of file descriptors, EACCES, EIO: ``ProcUnreadable``)
the answer is a ``TemporaryActuatorError``: ``exists`` does not report the
target gone, ``revert`` counts the thread as a failure rather than a skip, and
``refresh`` keeps what it recorded. ``revert`` re-reads each mask it writes
(``sched_getaffinity``) and fails naming the thread when it is not the
original: a change reverted is one whose masks were read back as restored.

Where to pin: exactly one of ``node``, ``cpus``, ``device`` (a PCI address) or
``locality: true`` (the spec's ``one_of``). Locality chooses the node at
plan time: the NUMA node of a device the job reads from or sends on, when one
is known and sysfs gives its node (the target's ``iface`` label, its ``dev``
label as an RDMA or block device, then the selector's ``interfaces``: each
``<sys_root>/class/<net|infiniband|block>/<name>/device`` and up to the first
``numa_node``); else the node holding most of the training process's memory
(the target's ``trainer``, else the selector's ``pids``), from
``<proc_root>/<pid>/numa_maps``: per mapping, ``N<node>=<pages>`` times its
``kernelpagesize_kB``, summed per node. The plan's summary (what dry-run
shows) names the node and why, e.g. ``(node 1, holding 75% of the memory of
training process 4242 (numa_maps: node 0 1.0 GiB, node 1 3.0 GiB))``.

Example::

    act = AffinityActuator(proc_root="/proc", sys_root="/sys")
    change = act.plan(Target(selector={"pids": [4242]}), {"device": "0000:3b:00.0"})
    act.apply(change)
    act.revert(change)
    by_trainer = act.plan(Target({"trainer": "4242"}), {"node": 0})
    act.refresh(by_trainer)     # after apply, every tick: pins new workers of 4242
    act.plan(Target({"trainer": "4242"}), {"locality": True}).summary
    # "... to CPUs 0-15 (node 0, holding 97% of the memory of training process 4242 (numa_maps: ...))..."

Overhead: per thread one ``stat`` read and one ``sched_setaffinity`` call (~2-3 µs);
a scan reads ``stat`` and ``comm`` of every process on the node once; a target by
trainer adds one ``stat`` read of the training process per refresh. Locality
reads a few sysfs files and, without a known device, the training process's
``numa_maps`` once per plan: the kernel walks the process's page tables for it
(milliseconds for a process of tens of GiB, under its mmap read lock).
"""
from __future__ import annotations

import errno
import logging
import os
import re
from pathlib import Path

from reflexarc.core.cpus import format_cpulist
from reflexarc.core.procfs import ProcFS, ProcUnreadable
from reflexarc.core.targets import ProcessGuard, Refusal, Refused, pid_label
from reflexarc.core.topology import Topology, TopologyError

from .base import Actuator, Change, ParamError, PermanentActuatorError, Target, TargetRefused, TemporaryActuatorError
from .specs import SPECS

log = logging.getLogger("reflexarc.actuators.affinity")

DEFAULT_COMMS = ("pt_data_worker",)
RETRYABLE = (errno.EAGAIN, errno.EBUSY, errno.EINTR)
COMMAND_CHARS = 60   # of a training process's command line in a summary
NUMA_PAGES = re.compile(r"\bN(\d+)=(\d+)\b")
PAGE_KB = re.compile(r"\bkernelpagesize_kB=(\d+)\b")
GIB = 1 << 30


def numa_memory(path: Path) -> dict[int, int]:
    """Bytes of a process's memory on each NUMA node, from its ``numa_maps``:
    each mapping's ``N<node>=<pages>`` times its ``kernelpagesize_kB`` (4 when
    absent). OSError when it cannot be read."""
    out: dict[int, int] = {}
    with open(path) as maps:
        for line in maps:
            size = PAGE_KB.search(line)
            page = int(size.group(1)) * 1024 if size else 4096
            for node, pages in NUMA_PAGES.findall(line):
                out[int(node)] = out.get(int(node), 0) + int(pages) * page
    return out


def _gib(size: int) -> str:
    return f"{size / GIB:.1f} GiB"


def memory_node(proc_root: str | Path, target: Target, lacking: str = "") -> tuple[int, str]:
    """The NUMA node holding most of the memory of the target's training
    processes (its ``trainer`` label, else the selector's ``pids``), from
    their ``numa_maps``, and why, e.g. ``(1, "node 1, holding 75% of the memory
    of training process 4242 (numa_maps: ...)")``. PermanentActuatorError when
    there is none (``lacking`` says what was tried before) or nothing to read."""
    try:
        trainer = pid_label(target.labels, "trainer")
    except ValueError as exc:
        raise PermanentActuatorError(str(exc)) from None
    pids = [trainer] if trainer is not None else [int(p) for p in target.selector.get("pids") or ()]
    if not pids:
        raise PermanentActuatorError(f"locality: {lacking}no training process (a trainer label or the "
                                     "selector's pids) to read numa_maps of")
    memory: dict[int, int] = {}
    for pid in pids:
        path = Path(proc_root) / str(pid) / "numa_maps"
        try:
            for node, size in numa_memory(path).items():
                memory[node] = memory.get(node, 0) + size
        except OSError as exc:
            raise PermanentActuatorError(f"locality: cannot read {path}: {exc.strerror}") from None
    if not memory:
        raise PermanentActuatorError(f"locality: numa_maps of {', '.join(map(str, pids))} shows no memory "
                                     "on any node")
    node = max(sorted(memory), key=memory.__getitem__)
    whose = "training process" if trainer is not None else "process" + ("es" if len(pids) > 1 else "")
    share = round(100 * memory[node] / sum(memory.values()))
    split = ", ".join(f"node {n} {_gib(size)}" for n, size in sorted(memory.items()))
    return node, (f"node {node}, holding {share}% of the memory of {whose} {', '.join(map(str, pids))} "
                  f"(numa_maps: {split})")


def sysfs_name(name: str) -> bool:
    """A device name that names one entry of a sysfs class directory."""
    return bool(name) and "/" not in name and name not in (".", "..") and "\0" not in name


def _common_mask(processes: list[dict]) -> list[int] | None:
    masks = {tuple(t["cpus"]) for p in processes for t in p["threads"]}
    return list(masks.pop()) if len(masks) == 1 else None


def _with_mask(processes: list[dict], cpus: list[int]) -> list[dict]:
    return [{**p, "threads": [{**t, "cpus": list(cpus)} for t in p["threads"]]} for p in processes]


def _unknown(what: str, exc: ProcUnreadable) -> TemporaryActuatorError:
    """The error for a question /proc could not answer: retried, never read as gone."""
    return TemporaryActuatorError(f"cannot tell {what}: {exc}")


class AffinityActuator(Actuator):
    spec = SPECS["affinity"]

    def __init__(self, proc_root: str = "/proc", sys_root: str = "/sys") -> None:
        self.procfs = ProcFS(proc_root)
        self.guard = ProcessGuard(ProcFS(proc_root, strict=True))   # "cannot tell" is never "allowed"
        self.topology = Topology(sys_root)

    # -- selection -----------------------------------------------------------------

    @staticmethod
    def _scope(target: Target) -> dict:
        """Where the workers are: ``pids`` are the roots they descend from (the
        training process for a target by trainer), ``within`` the selector's pids
        that such a training process must descend from."""
        sel, labels = target.selector, target.labels
        try:
            pid, trainer = pid_label(labels, "pid"), pid_label(labels, "trainer")
        except ValueError as exc:
            raise PermanentActuatorError(str(exc)) from None
        pids = [int(p) for p in sel.get("pids") or ()]
        return {"comms": tuple(sel.get("processes") or DEFAULT_COMMS),
                "pids": pids if trainer is None else [trainer],
                "within": [] if trainer is None else pids,
                "cgroup": str(sel.get("cgroup") or ""),
                "pid": pid,
                "trainer": trainer}

    @staticmethod
    def _describe_scope(scope: dict) -> str:
        words = [f"comm {'/'.join(scope['comms'])}"]
        if scope["pid"] is not None:
            words.append(f"pid {scope['pid']}")
        if scope["trainer"] is not None:
            words.append(f"below training process {scope['trainer']}")
        elif scope["pids"]:
            words.append(f"below pids {','.join(map(str, scope['pids']))}")
        if scope["cgroup"]:
            words.append(f"in cgroup {scope['cgroup']}")
        return " ".join(words)

    @staticmethod
    def _guarded(check, pid: int) -> Refused | None:
        """The guard's answer for ``pid``; TemporaryActuatorError when /proc cannot tell."""
        try:
            return check(pid)
        except ProcUnreadable as exc:
            raise _unknown(f"whether pid {pid} may be changed", exc) from exc

    def _outside(self, pid: int, roots: list[int], cgroup: str) -> str | None:
        """How process ``pid`` lies outside the scope, or None when it is inside."""
        try:
            if roots and not self.procfs.descends_from(pid, roots, strict=True):
                return f"not below pids {','.join(map(str, roots))}"
            if cgroup and not self.procfs.in_cgroup(pid, cgroup, strict=True):
                return f"not in cgroup {cgroup}"
        except ProcUnreadable as exc:
            raise _unknown(f"whether pid {pid} is inside the selector", exc) from exc
        return None

    def _refuse(self, scope: dict) -> None:
        """Raise TargetRefused for a scope no plan may use (see the module's docstring)."""
        if not (scope["pids"] or scope["cgroup"] or scope["pid"] is not None):
            raise TargetRefused(Refused(
                Refusal.UNSCOPED, None,
                f"no process scope: {self._describe_scope(scope)} would match processes anywhere on the node; "
                "name them by the selector's pids or cgroup, or a target label trainer=PID or pid=PID"))
        if scope["cgroup"] and self.procfs.cgroup_path(scope["cgroup"]) == "/":
            raise TargetRefused(Refused(Refusal.UNSCOPED, None, f"cgroup {scope['cgroup']} is the root cgroup: "
                                                                "every process on the node"))
        for root in (*scope["pids"], *scope["within"]):
            refused = self._guarded(self.guard.root, root)
            if refused is not None:
                raise TargetRefused(refused)
        pid = scope["pid"]
        if pid is None:
            return
        refused = self._guarded(self.guard.touch, pid)
        if refused is not None:
            raise TargetRefused(refused)
        try:
            owner = self.procfs.tgid(pid, strict=True)
        except ProcUnreadable as exc:
            raise _unknown(f"which process pid {pid} belongs to", exc) from exc
        outside = None if owner is None else self._outside(owner, scope["pids"], scope["cgroup"])
        if outside:
            raise TargetRefused(Refused(Refusal.OUTSIDE_SELECTOR, pid, f"pid {pid} is outside the selector: {outside}"))

    def _workers(self, target: Target) -> list[int]:
        scope = self._scope(target)
        try:
            return self.procfs.find(scope["comms"], pids=scope["pids"], cgroup=scope["cgroup"], pid=scope["pid"],
                                    strict=True)
        except ProcUnreadable as exc:
            raise _unknown(f"which processes match {self._describe_scope(scope)}", exc) from exc

    def _threads(self, pid: int) -> list[int]:
        """Thread ids of process ``pid``; empty once it exited."""
        try:
            return self.procfs.threads(pid, strict=True)
        except ProcUnreadable as exc:
            raise _unknown(f"the threads of pid {pid}", exc) from exc

    def _alive(self, pid: int, start: int, tid: int | None = None) -> bool:
        """Whether ``pid`` (its thread ``tid``) is still the task recorded at ``start``."""
        try:
            return self.procfs.alive(pid, start, tid)
        except ProcUnreadable as exc:
            who = f"pid {pid}" if tid is None else f"thread {tid} of pid {pid}"
            raise _unknown(f"whether {who} still runs", exc) from exc

    def _thread(self, pid: int, tid: int) -> dict | None:
        try:
            start = self.procfs.start_time(pid, tid, strict=True)
        except ProcUnreadable as exc:
            raise _unknown(f"the start time of thread {tid} of pid {pid}", exc) from exc
        if start is None:
            return None
        try:
            return {"tid": tid, "start": start, "cpus": sorted(os.sched_getaffinity(tid))}
        except ProcessLookupError:
            return None

    def _snapshot(self, pid: int) -> dict | None:
        """A process and the current mask of each of its threads; None once it exited."""
        try:
            start = self.procfs.start_time(pid, strict=True)
        except ProcUnreadable as exc:
            raise _unknown(f"the start time of pid {pid}", exc) from exc
        if start is None:
            return None
        threads = [t for t in (self._thread(pid, tid) for tid in self._threads(pid)) if t]
        if not threads or not self._alive(pid, start):
            return None
        return {"pid": pid, "start": start, "comm": self.procfs.comm(pid) or "", "threads": threads}

    def read_current(self, target: Target, params: dict | None = None) -> dict:
        processes = [s for s in map(self._snapshot, self._workers(target)) if s]
        return {"cpus": _common_mask(processes), "processes": processes}

    def _trainer(self, scope: dict) -> dict:
        """The training process of a target by trainer as ``{pid, start, comm}``;
        refuses one that is gone or outside the selector's pids or cgroup."""
        pid = scope["trainer"]
        try:
            start = self.procfs.start_time(pid, strict=True)
        except ProcUnreadable as exc:
            raise _unknown(f"whether training process {pid} runs", exc) from exc
        if start is None:
            raise PermanentActuatorError(f"training process {pid} is not running")
        outside = self._outside(pid, scope["within"], scope["cgroup"])
        if outside:
            raise TargetRefused(Refused(Refusal.OUTSIDE_SELECTOR, pid,
                                        f"training process {pid} is outside the selector: {outside}"))
        return {"pid": pid, "start": start, "comm": self.procfs.comm(pid) or ""}

    def _command(self, trainer: dict) -> str:
        """``python train.py --lr 3e-4``: the command line (program without its
        directory, cut to ``COMMAND_CHARS``), or the comm when it has none."""
        args = self.procfs.cmdline(trainer["pid"])
        if not args:
            return trainer["comm"]
        text = " ".join([os.path.basename(args[0]), *args[1:]])
        text = " ".join(text.split())
        return text if len(text) <= COMMAND_CHARS else text[:COMMAND_CHARS - 3] + "..."

    def _following(self, change: Change) -> bool:
        """Whether the change's training process (if it has one) still runs as the
        process it was planned for; a reused pid is never followed.
        TemporaryActuatorError when /proc cannot tell."""
        trainer = change.after.get("trainer")
        return trainer is None or self._alive(trainer["pid"], trainer["start"])

    def exists(self, change: Change) -> bool:
        """A change by trainer exists while its training process runs (workers come
        and go with epochs); any other while one of the processes it pinned runs.
        False only when /proc says they are gone (or their pids reused);
        TemporaryActuatorError when it cannot tell."""
        if change.after.get("trainer") is not None:
            return self._following(change)
        unknown = None
        for proc in change.before["processes"]:
            try:
                if self._alive(proc["pid"], proc["start"]):
                    return True
            except TemporaryActuatorError as exc:
                unknown = unknown or exc
        if unknown is not None:
            raise unknown
        return False

    # -- the desired mask ----------------------------------------------------------

    def _device_node(self, cls: str, name: str) -> int | None:
        """The NUMA node sysfs gives device ``name`` of class ``cls`` (the first
        ``numa_node`` from its ``device`` up), None when it gives none."""
        link = self.topology.sys_root / "class" / cls / name / "device"
        if not (sysfs_name(name) and link.exists()):
            return None
        root, device = self.topology.sys_root.resolve(), link.resolve()
        for directory in (device, *device.parents):
            if directory == root or root not in directory.parents:
                break
            try:
                node = int((directory / "numa_node").read_text().strip())
            except FileNotFoundError:
                continue
            except (OSError, ValueError):
                break
            return node if node >= 0 else None
        return None

    @staticmethod
    def _job_devices(target: Target) -> list[tuple[str, str, str]]:
        """``(sysfs class, name, words)`` of the devices the job is known to use, in order."""
        labels, sel = target.labels, target.selector
        out = []
        iface, dev = str(labels.get("iface") or ""), str(labels.get("dev") or "")
        if iface:
            out.append(("net", iface, f"network interface {iface}, which the job sends on"))
        if dev:
            out.append(("infiniband", dev, f"RDMA device {dev}, which the job sends on"))
            out.append(("block", dev, f"block device {dev}, which the job reads from"))
        out += [("net", str(i), f"network interface {i}, which the job sends on") for i in sel.get("interfaces") or ()]
        return out

    def local_node(self, target: Target) -> tuple[int, str]:
        """The node ``locality`` chooses for ``target`` and why (see the module's docstring)."""
        for cls, name, words in self._job_devices(target):
            node = self._device_node(cls, name)
            if node is not None:
                return node, f"node {node}, that of {words}"
        return memory_node(self.procfs.root, target, "no device of the job has a NUMA node in sysfs, and ")

    def target_cpus(self, params: dict, target: Target | None = None) -> tuple[list[int], str]:
        """The CPUs ``params`` ask for and where they come from, e.g. ``([1], "node 1")``;
        ``locality`` needs the ``target`` it is chosen for."""
        params = self.checked(params, partial=True)
        try:
            given = self.spec.chosen(params)
        except ParamError as exc:
            raise PermanentActuatorError(str(exc)) from None
        try:
            if given == ("cpus",):
                cpus, where = list(params["cpus"]), "explicit list"
            elif given == ("node",):
                node = params["node"]
                cpus, where = self.topology.node_cpus(node), f"node {node}"
            elif given == ("device",):
                node = self.topology.device_node(str(params["device"]))
                if node is None:
                    raise PermanentActuatorError(f"PCI device {params['device']} reports numa_node -1: "
                                                 "the platform gives no NUMA affinity for it")
                cpus, where = self.topology.node_cpus(node), f"node {node} of {params['device']}"
            else:
                if target is None:
                    raise PermanentActuatorError("locality is chosen for a target: plan the change")
                node, where = self.local_node(target)
                cpus = self.topology.node_cpus(node)
            self.topology.require_online(cpus)
        except TopologyError as exc:
            raise PermanentActuatorError(str(exc)) from None
        reserved = set(params.get("reserved_cpus") or ())
        cpus = [c for c in cpus if c not in reserved]
        if not cpus:
            raise PermanentActuatorError(f"no CPU left in {where} after reserving {format_cpulist(reserved)}")
        return cpus, where

    def plan(self, target: Target, params: dict) -> Change:
        """A target by trainer is planned even while none of its workers runs
        (between epochs): ``refresh`` pins them as they start."""
        scope = self._scope(target)
        self._refuse(scope)
        cpus, where = self.target_cpus(params, target)
        trainer = self._trainer(scope) if scope["trainer"] is not None else None
        before = self.read_current(target)
        if not before["processes"] and trainer is None:
            named = [p for p in (scope["pid"], *scope["pids"]) if p is not None]
            gone = [p for p in named if not self.procfs.alive(p)]
            unmatched = f"no process matches {self._describe_scope(scope)}"
            if gone:
                raise PermanentActuatorError(f"no such process {', '.join(map(str, gone))}"
                                             + ("" if len(gone) == len(named) else f"; {unmatched}"))
            raise PermanentActuatorError(unmatched)
        for proc in before["processes"]:
            refused = self._guarded(self.guard.touch, proc["pid"])
            if refused is not None:
                raise TargetRefused(refused)
        after = {"cpus": cpus, "processes": _with_mask(before["processes"], cpus)}
        nthreads = sum(len(p["threads"]) for p in before["processes"])
        was = format_cpulist(before["cpus"]) if before["cpus"] is not None else "mixed"
        pinned = (f"{len(before['processes'])} processes ({nthreads} threads, "
                  f"pids {','.join(str(p['pid']) for p in before['processes'])})")
        if trainer is None:
            summary = f"affinity: pin {pinned} to CPUs {format_cpulist(cpus)} ({where}); was {was}"
        else:
            before["trainer"] = after["trainer"] = trainer
            now = pinned if before["processes"] else "no worker running now"
            summary = (f"affinity: pin DataLoader workers of training process {trainer['pid']} "
                       f"({self._command(trainer)}) to CPUs {format_cpulist(cpus)} ({where}): {now}, "
                       f"and its new workers as they start"
                       + (f"; was {was}" if before["processes"] else ""))
        return Change("affinity", target, dict(params), before, after, summary)

    # -- writing -------------------------------------------------------------------

    def _set(self, proc: dict, thread: dict, cpus: list[int], check: bool = False) -> bool:
        """Set one thread's mask unless it exited or its id now names another task
        (TemporaryActuatorError when /proc cannot tell). With ``check``, re-read
        the mask and fail when it is not ``cpus``. Returns whether the mask was written."""
        tid = thread["tid"]
        if not (self._alive(proc["pid"], proc["start"]) and self._alive(proc["pid"], thread["start"], tid)):
            return False
        call = f"sched_setaffinity(tid {tid}, {format_cpulist(cpus)})"
        try:
            os.sched_setaffinity(tid, cpus)
            if not check:
                return True
            call = f"sched_getaffinity(tid {tid})"
            read = sorted(os.sched_getaffinity(tid))
        except ProcessLookupError:
            return False
        except OSError as exc:
            message = f"{call}: {exc.strerror}"
            if exc.errno in RETRYABLE:
                raise TemporaryActuatorError(message) from exc
            raise PermanentActuatorError(message) from exc
        if read != sorted(set(cpus)):
            raise PermanentActuatorError(f"thread {tid} of pid {proc['pid']}: mask set to CPUs {format_cpulist(cpus)} "
                                         f"but read back as {format_cpulist(read)}")
        return True

    def apply(self, change: Change) -> None:
        """Pin the recorded threads and any its processes started since the plan;
        refuses a change whose training process is gone or whose pid now names
        another process."""
        if not self._following(change):
            trainer = change.after["trainer"]
            raise PermanentActuatorError(f"training process {trainer['pid']} ({trainer['comm']}) is no longer "
                                         "the process this change was planned for")
        for proc in change.after["processes"]:
            for thread in proc["threads"]:
                self._set(proc, thread, thread["cpus"])
            # Threads the worker started since the plan get the mask too; revert
            # gives them the process's original (they carry the pinned mask).
            known = {t["tid"] for t in proc["threads"]}
            for tid in self._threads(proc["pid"]):
                thread = None if tid in known else self._thread(proc["pid"], tid)
                if thread is not None:
                    self._set(proc, thread, change.after["cpus"])

    def revert(self, change: Change) -> None:
        """Every thread gets its own original mask back, re-read to check it;
        exited and reused ids are skipped, a thread /proc cannot tell about is a
        failure. Goes through all threads, then raises the first failure."""
        failure = None
        pinned = list(change.after["cpus"])
        for proc in change.before["processes"]:
            restore = list(proc["threads"])
            try:
                if restore and self._alive(proc["pid"], proc["start"]):
                    # Threads born since the last refresh inherited the pinned mask:
                    # they go back to the process's original too.
                    known = {t["tid"] for t in proc["threads"]}
                    for tid in self._threads(proc["pid"]):
                        thread = None if tid in known else self._thread(proc["pid"], tid)
                        if thread is not None and thread["cpus"] == pinned:
                            restore.append({**thread, "cpus": list(self._origin(proc))})
            except TemporaryActuatorError as exc:
                failure = failure or exc
            for thread in restore:
                try:
                    self._set(proc, thread, thread["cpus"], check=True)
                except (TemporaryActuatorError, PermanentActuatorError) as exc:
                    failure = failure or exc
        if failure is not None:
            raise failure

    def drift(self, change: Change) -> str | None:
        """A live thread of the change whose mask is not the one it was given
        (threads that exited, and ids now naming other tasks, are passed over)."""
        for proc in change.after["processes"]:
            for thread in proc["threads"]:
                tid = thread["tid"]
                try:
                    if not (self._alive(proc["pid"], proc["start"])
                            and self._alive(proc["pid"], thread["start"], tid)):
                        continue
                    now = sorted(os.sched_getaffinity(tid))
                except (ProcessLookupError, TemporaryActuatorError):
                    continue                  # gone, or /proc cannot tell now: not drift
                if now != sorted(thread["cpus"]):
                    return (f"thread {tid} of pid {proc['pid']} runs on CPUs {format_cpulist(now)}, not "
                            f"{format_cpulist(thread['cpus'])}")
        return None

    @staticmethod
    def _origin(proc: dict) -> list[int]:
        """The process's original mask: its main thread's, else its first recorded thread's."""
        return next((t["cpus"] for t in proc["threads"] if t["tid"] == proc["pid"]), proc["threads"][0]["cpus"])

    def refresh(self, change: Change) -> Change | None:
        """Pin workers and threads that appeared since ``change`` was applied and drop
        the ones that exited. Returns the grown change (already applied) or None.
        New workers of a training process are looked for only while it is the
        process the change was planned for. What /proc cannot tell about is kept
        as recorded (its original mask stays in the change) and looked at again
        on the next refresh."""
        cpus = list(change.after["cpus"])
        altered = False
        before = []
        recorded = {(p["pid"], p["start"]) for p in change.before["processes"]}
        for proc in change.before["processes"]:
            try:
                if not self._alive(proc["pid"], proc["start"]):
                    altered = True
                    continue
            except TemporaryActuatorError as exc:
                log.warning("refresh: %s: kept as recorded", exc)
                before.append(proc)
                continue
            kept = [t for t in proc["threads"] if self._maybe_alive(proc, t)]
            altered |= len(kept) != len(proc["threads"])
            # A thread created by an already pinned thread inherited the new mask:
            # its original is the process's original.
            origin = self._origin(proc)
            known = {t["tid"] for t in kept}
            try:
                tids = self._threads(proc["pid"])
            except TemporaryActuatorError as exc:
                log.warning("refresh: %s: no new thread looked for", exc)
                tids = []
            for tid in tids:
                if tid in known:
                    continue
                try:
                    thread = self._thread(proc["pid"], tid)
                except TemporaryActuatorError as exc:
                    log.warning("refresh: %s: left for the next refresh", exc)
                    continue
                if thread is None:
                    continue
                if thread["cpus"] == cpus:
                    thread["cpus"] = list(origin)
                if self._pin_new(proc, thread, cpus):
                    kept.append(thread)
                    altered = True
            before.append({**proc, "threads": kept})
        try:
            workers = self._workers(change.target) if self._following(change) else []
        except TemporaryActuatorError as exc:
            log.warning("refresh: %s: no new worker looked for", exc)
            workers = []
        for pid in workers:
            try:
                refused = self._guarded(self.guard.touch, pid)
            except TemporaryActuatorError as exc:
                log.warning("refresh: %s: left for the next refresh", exc)
                continue
            if refused is not None:
                log.warning("refresh: %s", refused.message)
                continue
            try:
                snap = self._snapshot(pid)
            except TemporaryActuatorError as exc:
                log.warning("refresh: %s: left for the next refresh", exc)
                continue
            if snap is None or (snap["pid"], snap["start"]) in recorded:
                continue
            snap["threads"] = [t for t in snap["threads"] if self._pin_new(snap, t, cpus)]
            if snap["threads"]:
                before.append(snap)
                altered = True
        if not altered:
            return None
        grown = Change.from_dict(change.to_dict())
        grown.before = {**change.before, "cpus": _common_mask(before), "processes": before}
        grown.after = {**change.after, "cpus": cpus, "processes": _with_mask(before, cpus)}
        return grown

    def _maybe_alive(self, proc: dict, thread: dict) -> bool:
        """A recorded thread is dropped only when /proc says it is gone."""
        try:
            return self._alive(proc["pid"], thread["start"], thread["tid"])
        except TemporaryActuatorError as exc:
            log.warning("refresh: %s: kept as recorded", exc)
            return True

    def _pin_new(self, proc: dict, thread: dict, cpus: list[int]) -> bool:
        """Pin a thread found by refresh; a failure leaves it unpinned and unrecorded,
        so the next refresh tries again."""
        try:
            return self._set(proc, thread, cpus)
        except (TemporaryActuatorError, PermanentActuatorError) as exc:
            log.warning("refresh: cannot pin thread %s of pid %s: %s", thread["tid"], proc["pid"], exc)
            return False
