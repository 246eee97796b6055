"""The ``irq_affinity`` actuator: moves every IRQ of a job's network interfaces to
the CPUs of one NUMA node (or an explicit CPU list), and writes each IRQ's own
original ``smp_affinity_list`` back on revert.

Why: a NIC's interrupts, and the softirq work they start, run where its IRQs
point. When that is a node other than the job's (the NIC sits on the far
socket, or irqbalance spread its vectors), every packet the job sends or
receives crosses the interconnect twice. Pointing the IRQs at the job's node
keeps that work next to the job's memory.

Which IRQs, for each interface (``interfaces``, else the selector's; as the
controller's network namespace sees it): the MSI/MSI-X vectors of the PCI
function behind it, ``<sys_root>/class/net/<if>/device`` and up to the first
PCI device (a virtio NIC's ``virtioN`` sits below its PCI function), its
``msi_irqs/*``. Without those, the lines of ``<proc_root>/interrupts`` whose
handler names the interface, a device on that path or its PCI address
(``eth0-TxRx-0``, ``virtio2-input.0``, ``mlx5_comp0@pci:0000:3b:00.0``). An
interface without a device of its own (veth, bridge, lo) has none: refused.

Left out, and named in the plan: an IRQ whose affinity the kernel manages
itself (drivers that spread their queues' vectors over the CPUs ask for that;
the kernel then makes ``/proc/irq/N/smp_affinity_list`` read-only and refuses
writes). Each IRQ is recorded with its handlers (the directories in
``/proc/irq/N``), so an IRQ number the kernel has since given to another
device (a driver reload) is never written: ``apply``, ``revert`` and
``drift`` pass it over, and once none of the recorded IRQs is left
``exists`` is False.

Where to: exactly one of ``node``, ``cpus`` or ``locality: true`` (the spec's
``one_of``). Locality is the node holding most of the memory of the job's
training processes (the target's ``trainer``, else the selector's ``pids``),
as ``reflexarc.actuators.affinity.memory_node`` reads it from ``numa_maps``;
not the NIC's own node, which is what the IRQs follow without reflexarc.

The change (plain JSON)::

    before = {"interfaces": ["eth0"],
              "irqs": [{"irq": 38, "actions": "virtio2-input.0", "cpus": [0, 1]}, ...],
              "managed": [{"irq": 36, "actions": "virtio1-req.0"}]}     # left alone
    after  = the same with every "cpus" set to the chosen CPUs

``apply`` writes the chosen CPUs to each IRQ; ``drift`` reads every IRQ back;
``revert`` writes each IRQ's own original list back and re-reads it, goes
through all of them, then raises the first failure. A daemon that moves IRQs
too (irqbalance) shows up as drift.

Example::

    act = IrqAffinityActuator(proc_root="/proc", sys_root="/sys")
    change = act.plan(Target(selector={"interfaces": ["eth0"]}), {"node": 0})
    change.summary   # "irq_affinity: move 3 IRQs of eth0 (37 virtio2-config, 38 ...) to CPUs 0-15 (node 0); ..."
    act.apply(change)
    act.revert(change)     # every /proc/irq/N/smp_affinity_list as it was

Overhead: plan reads a few sysfs entries per interface and two small files per
IRQ (``/proc/interrupts`` once, without MSI); apply and revert write one
small file per IRQ (the kernel reprograms the vector: microseconds).
"""
from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

from reflexarc.core.cpus import format_cpulist, parse_cpulist
from reflexarc.core.topology import Topology, TopologyError

from .affinity import memory_node, sysfs_name
from .base import Actuator, Change, ParamError, PermanentActuatorError, Target, TemporaryActuatorError
from .specs import SPECS

RETRYABLE = (errno.EAGAIN, errno.EBUSY, errno.EINTR)
IRQ_LINE = re.compile(r"^\s*([0-9]+):(.*)$")


def _names(words: list[str]) -> re.Pattern:
    """Any of ``words`` as a whole name within an /proc/interrupts line."""
    return re.compile(r"(?<![0-9A-Za-z_])(?:" + "|".join(map(re.escape, words)) + r")(?![0-9A-Za-z_])")


class IrqAffinityActuator(Actuator):
    spec = SPECS["irq_affinity"]

    def __init__(self, proc_root: str = "/proc", sys_root: str = "/sys") -> None:
        self.proc_root = Path(proc_root)
        self.sys_root = Path(sys_root)
        self.topology = Topology(sys_root)

    # -- finding the IRQs ----------------------------------------------------------

    def _interfaces(self, target: Target, params: dict) -> list[str]:
        try:
            resolved = self.spec.resolve(params, target.selector)
        except ParamError as exc:
            raise PermanentActuatorError(str(exc)) from None
        interfaces = self.checked(resolved, partial=True).get("interfaces")
        if not interfaces:
            raise PermanentActuatorError("irq_affinity needs interfaces (params.interfaces or the selector's)")
        return [str(i) for i in interfaces]

    def interface_irqs(self, name: str) -> list[int]:
        """The IRQ numbers of interface ``name`` (see the module's docstring)."""
        link = self.sys_root / "class" / "net" / name
        if not (sysfs_name(name) and link.exists()):
            raise PermanentActuatorError(f"no network interface {name!r} in {self.sys_root}/class/net")
        if not (link / "device").exists():
            raise PermanentActuatorError(f"interface {name} has no device of its own (a virtual interface): "
                                         "no IRQ to move")
        device = (link / "device").resolve()
        words = [name]
        for directory in (device, *device.parents):
            if directory.parent.name == "devices" or directory == directory.parent:
                break                        # the root of a bus (pci0000:00): not the device's
            msi = directory / "msi_irqs"
            if msi.is_dir():
                return sorted(int(entry) for entry in os.listdir(msi) if entry.isdigit())
            words.append(directory.name)
            if (directory / "subsystem").resolve().name == "pci":
                break                        # the PCI function, without MSI
        return self._named_irqs(words)

    def _named_irqs(self, words: list[str]) -> list[int]:
        """IRQs whose /proc/interrupts line names one of ``words``."""
        path = self.proc_root / "interrupts"
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise PermanentActuatorError(f"cannot read {path}: {exc.strerror}") from None
        pattern = _names(words)
        out = []
        for line in lines:
            match = IRQ_LINE.match(line)
            if match and pattern.search(match.group(2)):
                out.append(int(match.group(1)))
        return out

    def _path(self, irq: int) -> Path:
        return self.proc_root / "irq" / str(irq) / "smp_affinity_list"

    def _actions(self, irq: int) -> str | None:
        """The handlers of ``irq`` (the directories in /proc/irq/N, comma-separated);
        None once the IRQ number is gone."""
        try:
            with os.scandir(self.proc_root / "irq" / str(irq)) as entries:
                return ",".join(sorted(e.name for e in entries if e.is_dir()))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise TemporaryActuatorError(f"cannot read {self.proc_root}/irq/{irq}: {exc.strerror}") from exc

    def _read(self, irq: int) -> list[int] | None:
        """The CPUs ``irq`` may run on now; None once it is gone."""
        try:
            return parse_cpulist(self._path(irq).read_text().strip())
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise TemporaryActuatorError(f"cannot read {self._path(irq)}: {exc.strerror}") from exc

    def _ours(self, entry: dict) -> bool:
        """Whether the IRQ of ``entry`` still serves the handlers recorded with it."""
        return self._actions(entry["irq"]) == entry["actions"]

    def read_current(self, target: Target, params: dict | None = None) -> dict:
        """Every IRQ of the interfaces with its CPUs now, and those the kernel manages."""
        interfaces = self._interfaces(target, params or {})
        irqs, managed = [], []
        for irq in sorted({irq for name in interfaces for irq in self.interface_irqs(name)}):
            actions, cpus = self._actions(irq), self._read(irq)
            try:
                writable = bool(self._path(irq).stat().st_mode & stat.S_IWUSR)
            except FileNotFoundError:
                continue                     # freed while we looked
            if actions is None or cpus is None:
                continue
            if writable:
                irqs.append({"irq": irq, "actions": actions, "cpus": cpus})
            else:
                managed.append({"irq": irq, "actions": actions})
        return {"interfaces": interfaces, "irqs": irqs, "managed": managed}

    # -- the desired CPUs ----------------------------------------------------------

    def target_cpus(self, params: dict, target: Target) -> tuple[list[int], str]:
        """The CPUs ``params`` ask for and where they come from, e.g. ``([0, 1], "node 0")``."""
        try:
            (given,) = self.spec.chosen(params)
        except ParamError as exc:
            raise PermanentActuatorError(str(exc)) from None
        try:
            if given == "cpus":
                cpus, where = list(params["cpus"]), "explicit list"
            elif given == "node":
                cpus, where = self.topology.node_cpus(params["node"]), f"node {params['node']}"
            else:
                node, where = memory_node(self.proc_root, target)
                cpus = self.topology.node_cpus(node)
            self.topology.require_online(cpus)
        except TopologyError as exc:
            raise PermanentActuatorError(str(exc)) from None
        if not cpus:
            raise PermanentActuatorError(f"no CPU in {where}")
        return cpus, where

    def plan(self, target: Target, params: dict) -> Change:
        params = self.checked({**params, "interfaces": self._interfaces(target, params)})
        cpus, where = self.target_cpus(params, target)
        before = self.read_current(target, params)
        names = ", ".join(before["interfaces"])
        left = "".join(f"; left {m['irq']} ({m['actions'] or 'no handler'}) alone: the kernel manages its affinity"
                       for m in before["managed"])
        if not before["irqs"]:
            raise PermanentActuatorError(f"no IRQ of {names} can be moved" + (left or ": none found"))
        after = {**before, "irqs": [{**entry, "cpus": cpus} for entry in before["irqs"]]}
        listed = ", ".join(f"{e['irq']} {e['actions'] or 'no handler'}" for e in before["irqs"])
        was = sorted({format_cpulist(e["cpus"]) for e in before["irqs"]})
        count = len(before["irqs"])
        summary = (f"irq_affinity: move {count} IRQ{'s' if count > 1 else ''} of {names} ({listed}) to CPUs "
                   f"{format_cpulist(cpus)} ({where}); were on CPUs {' / '.join(was)}{left}")
        return Change(self.name, target, params, before, after, summary)

    # -- writing -------------------------------------------------------------------

    def _write(self, entry: dict, check: bool) -> None:
        """Point the IRQ of ``entry`` at its CPUs, unless the IRQ is gone or now
        serves other handlers; with ``check``, read it back."""
        if not self._ours(entry):
            return
        irq, text = entry["irq"], format_cpulist(entry["cpus"])
        try:
            self._path(irq).write_text(text)
        except FileNotFoundError:
            return
        except OSError as exc:
            message = f"IRQ {irq} ({entry['actions']}): writing CPUs {text}: {exc.strerror}"
            if exc.errno in RETRYABLE:
                raise TemporaryActuatorError(message) from exc
            raise PermanentActuatorError(message) from exc
        now = self._read(irq) if check else None
        if now is not None and now != sorted(entry["cpus"]):
            raise PermanentActuatorError(f"IRQ {irq} ({entry['actions']}): set to CPUs {text} but read back as "
                                         f"{format_cpulist(now)}")

    def apply(self, change: Change) -> None:
        for entry in change.after["irqs"]:
            self._write(entry, check=False)

    def revert(self, change: Change) -> None:
        """Every IRQ gets its own original CPUs back, re-read to check it; goes
        through all of them, then raises the first failure."""
        failure = None
        for entry in change.before["irqs"]:
            try:
                self._write(entry, check=True)
            except (TemporaryActuatorError, PermanentActuatorError) as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

    def drift(self, change: Change) -> str | None:
        """An IRQ of the change that runs elsewhere than it was pointed (IRQs
        gone or given to another device are passed over)."""
        for entry in change.after["irqs"]:
            now = self._read(entry["irq"]) if self._ours(entry) else None
            if now is not None and now != sorted(entry["cpus"]):
                return (f"IRQ {entry['irq']} ({entry['actions']}) may run on CPUs {format_cpulist(now)}, not "
                        f"{format_cpulist(entry['cpus'])}")
        return None

    def exists(self, change: Change) -> bool:
        """Whether any IRQ of the change still serves the handlers recorded with it."""
        return any(self._ours(entry) for entry in change.before["irqs"])
