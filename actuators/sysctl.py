"""The ``sysctl`` actuator: sets one kernel tunable from an allow-list, and puts
the old value back on revert (a tuned-style read/write pair).

The allow-list is the ``choices`` of the ``key`` parameter in ``specs.py``
(e.g. ``kernel.numa_balancing`` to stop the kernel migrating a job's pages and
tasks across nodes). The ``/proc`` root is injectable so tests use a fixture tree.

Example::

    act = SysctlActuator(proc_root="/proc")
    change = act.plan(Target(), {"key": "kernel.numa_balancing", "value": "0"})
    act.apply(change); act.revert(change)

Overhead: one small file read and write.
"""
from __future__ import annotations

import errno
from pathlib import Path

from .base import Actuator, Change, PermanentActuatorError, Target, TemporaryActuatorError
from .specs import SPECS


class SysctlActuator(Actuator):
    spec = SPECS["sysctl"]

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = Path(proc_root)

    def _path(self, key: str) -> Path:
        if key not in self.spec.param("key").choices:
            raise PermanentActuatorError(f"sysctl key '{key}' is not on the allow-list")
        return self.proc_root / "sys" / key.replace(".", "/")

    def read_current(self, target: Target, params: dict | None = None) -> str:
        key = str((params or {}).get("key", ""))
        path = self._path(key)
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            raise PermanentActuatorError(f"{path} does not exist on this kernel") from None

    def plan(self, target: Target, params: dict) -> Change:
        key, value = str(params["key"]), str(params["value"]).strip()
        before = self.read_current(target, {"key": key})
        return Change("sysctl", target, {"key": key, "value": value}, before, value,
                      f"sysctl {key}: {before} -> {value}")

    def _write(self, key: str, value: str) -> None:
        try:
            self._path(key).write_text(value + "\n")
        except OSError as exc:
            if exc.errno in (errno.EBUSY, errno.EAGAIN, errno.EINTR):
                raise TemporaryActuatorError(str(exc)) from exc
            raise PermanentActuatorError(f"cannot write sysctl {key}: {exc}") from exc

    def apply(self, change: Change) -> None:
        self._write(change.params["key"], str(change.after))

    def revert(self, change: Change) -> None:
        self._write(change.params["key"], str(change.before))

    def drift(self, change: Change) -> str | None:
        key = change.params["key"]
        now = self.read_current(change.target, change.params)
        if now.split() != str(change.after).split():
            return f"sysctl {key} is {now}, not {change.after}"
        return None
