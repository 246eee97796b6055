"""Targets: the one text form of a target's labels (journal, audit log,
metrics, reports), a pid named by a label, and the processes no actuator may
ever act on.

An actuator that changes processes asks ``ProcessGuard`` before it plans, in
every mode (a dry-run plan for the wrong process misleads as much as a change):

- ``touch(pid)``: the process itself must not change. Refused: init (pid 1
  of the PID namespace this proc root shows, the host's on a node, and the
  init of any PID namespace: ``NSpid`` ending in 1), kernel threads, the
  controller (its pid or one of its threads) and its children.
- ``root(pid)``: a scope must not be rooted there (everything below it would
  be selected): init of this proc root's namespace, kernel threads, the
  controller.

A guard built on a strict ``ProcFS`` (``ProcFS(root, strict=True)``, as the
affinity actuator's) never takes "cannot read /proc" (EMFILE, EACCES, EIO)
for "nothing to refuse": it raises ``ProcUnreadable``, and the actuator
retries later instead of touching a process it could not look at.

Each refusal is a typed ``Refused(reason, pid, message)``; ``Refusal`` also
covers targets outside their selector and targets with no process scope at
all, which the actuators decide.

Example::

    target_key({"trainer": "4242", "rank": "0"})   # "rank=0,trainer=4242"
    target_key({})                                 # "*": the policy as a whole
    pid_label({"pid": "812"}, "pid")               # 812; ValueError for "abc"
    ProcessGuard(ProcFS()).touch(1)
    # Refused(Refusal.INIT, 1, "pid 1 (systemd) is init: never a target")

Overhead: ``target_key`` a sort and a join; a guard check reads ``status`` and
``stat`` of the process (and of pid 2 for a child of it), ~30-50 us.
"""
from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

from .procfs import ProcFS


def target_key(labels: dict) -> str:
    """``k=v`` pairs sorted by label name and joined by commas; ``*`` for no labels."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "*"


def pid_label(labels: dict, key: str) -> int | None:
    """The process id a label names (``pid``, ``trainer``), None without one;
    ValueError when it is not a whole number > 0."""
    value = labels.get(key)
    if value in (None, ""):
        return None
    text = str(value).strip()
    if not text.isdigit() or int(text) == 0:
        raise ValueError(f"label {key}={value!r} is not a process id (a whole number > 0)")
    return int(text)


class Refusal(StrEnum):
    INIT = "init"                        # pid 1 of a PID namespace (the host's init included)
    KERNEL_THREAD = "kernel-thread"
    CONTROLLER = "controller"            # the controller, one of its threads, or a child of it
    OUTSIDE_SELECTOR = "outside-selector"
    UNSCOPED = "unscoped"                # nothing narrows the target to a job's processes


class Refused(NamedTuple):
    reason: Refusal
    pid: int | None
    message: str


class ProcessGuard:
    def __init__(self, procfs: ProcFS) -> None:
        self.procfs = procfs

    def _who(self, pid: int) -> tuple[int, str]:
        """The process a pid or thread id belongs to, and its words for a message."""
        owner = self.procfs.tgid(pid) or pid
        comm = self.procfs.comm(owner)
        name = f"pid {owner}" + (f" ({comm})" if comm else "")
        return owner, name if owner == pid else f"thread {pid} of {name}"

    def _always(self, pid: int, what: str) -> Refused | None:
        owner, name = self._who(pid)
        if owner == 1:
            return Refused(Refusal.INIT, pid, f"{name} is init: never {what}")
        if self.procfs.kernel_thread(owner):
            return Refused(Refusal.KERNEL_THREAD, pid, f"{name} is a kernel thread: never {what}")
        if owner == self.procfs.self_pid():
            return Refused(Refusal.CONTROLLER, pid, f"{name} is the controller itself: never {what}")
        return None

    def touch(self, pid: int) -> Refused | None:
        """Why the process (or thread) ``pid`` must not be changed, or None."""
        refused = self._always(pid, "a target")
        if refused is not None:
            return refused
        owner, name = self._who(pid)
        ns = self.procfs.nspid(owner)
        if ns and ns[-1] == 1:
            return Refused(Refusal.INIT, pid, f"{name} is the init of a PID namespace (pid 1 there): never a target")
        st = self.procfs.stat(owner)
        if st is not None and st.ppid == self.procfs.self_pid():
            return Refused(Refusal.CONTROLLER, pid, f"{name} is a child of the controller: never a target")
        return None

    def root(self, pid: int) -> Refused | None:
        """Why a scope of the processes below ``pid`` must not be used, or None."""
        return self._always(pid, "the root of a target's scope (it would select every process below it)")
