"""Device locality: whether the devices a training process uses sit on the NUMA
node of the CPUs it may run on, polled from /proc and sysfs (no BPF program).

A GPU, NIC or NVMe disk on another socket than the CPUs feeding it sends every
transfer across the link between the sockets: a pinned-memory copy, a
received batch, a read of the dataset. For each training process (the pids job
discovery found) and each device it uses,
``device_numa_local_ratio{pid, trainer, dev, kind, numa_node, cpu_nodes}`` is
the share of the CPUs it may run on (its sched affinity, ``Cpus_allowed_list``
in ``/proc/PID/status``, less the CPUs no NUMA node lists) that lie on the
device's node: 1.0 all local, 0.0 all remote. ``numa_node`` is the device's
node and ``cpu_nodes`` the nodes of those CPUs (``"0,1"``). A device whose node
is unknown (``numa_node`` -1: the firmware gives no affinity, as on a
one-node machine or in a virtual machine) is local to every CPU: 1.0, with
``numa_node="unknown"``.

The devices a process uses, by ``kind``:

- ``gpu``: the NVIDIA GPUs it has open (``/proc/PID/fd`` links to
  ``/dev/nvidia<N>``). The driver names the PCI device of minor N in
  ``/proc/driver/nvidia/gpus/<addr>/information`` (``Device Minor: N``); its
  node is that PCI device's ``numa_node``. Where no such file names the minor
  (a driver that does not publish them, a container without
  ``/proc/driver/nvidia``) nothing says which PCI device it is: the GPU is
  counted as ``missing`` and has no sample; no other mapping is guessed.
- ``nic``: every interface under ``/sys/class/net`` with a ``device`` link
  (physical and virtio NICs, not ``lo``, bridges, veths or ifbs): any of them
  may carry the job's traffic.
- ``block``: every disk under ``/sys/block`` with a ``device`` link (NVMe,
  SCSI, virtio; not loop, zram or device-mapper devices).

A device's node is the ``numa_node`` of its ``device``, or of the nearest
device above it in ``/sys/devices`` that has one (a virtio NIC's is its PCI
function's, an NVMe namespace's its controller's).

Devices and affinities change rarely: the devices and the NUMA topology are
read every ``every`` seconds (30), a process when first seen and then every
``every`` seconds; every collect between hands out the values read last, so a
value is at most ``every`` seconds old. A process no longer in the list is
forgotten.

What cannot be used is counted by reason in ``skipped`` and reported as
``device_locality_skipped_total{reason}``; the first time for a file and
reason it is logged with the file (and line): ``vanished`` (a process that
exited between the list and the read, or mid-read), ``unreadable`` (any other
read error), ``malformed`` (a ``numa_node`` that is not a number, a CPU list
that is none or names no CPU of a node, an ``information`` file without its
minor), ``missing`` (a device with no ``numa_node`` on its path, a GPU minor no
``information`` file names, a status without ``Cpus_allowed_list``). The
other processes and devices go on. Both roots are injectable, so tests use
fixture trees.

Example::

    locality = DeviceLocality(node="n1", proc_root="/proc", sys_root="/sys")
    locality.collect([4242], now=100.0)
    # [("device_numa_local_ratio", {"node": "n1", "pid": "4242", "trainer": "4242", "dev": "nvidia1",
    #   "kind": "gpu", "numa_node": "1", "cpu_nodes": "0"}, 0.0), ...,
    #  ("device_locality_skipped_total", {"node": "n1", "reason": "malformed"}, 0.0), ...]

Overhead: every 30 s, a listing of ``/sys/class/net`` and ``/sys/block`` with a
``realpath`` and a ``numa_node`` read (~5 us) per device, the nodes' CPU
lists, and per training process its ``status`` and one ``readlink`` per open
file descriptor (~1 us each); in between, one small dict per sample.
"""
from __future__ import annotations

import errno
import logging
import os
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from reflexarc.core.cpus import parse_cpulist
from reflexarc.core.input_files import read_kernel_file
from reflexarc.core.signals import SignalSpec
from reflexarc.core.topology import Topology, TopologyError, normalise_pci_address

log = logging.getLogger("reflexarc.probes.device_locality")

LOCALITY = SignalSpec("device_numa_local_ratio", "ratio",
                      ("node", "job", "pid", "trainer", "rank", "pod", "dev", "kind", "numa_node", "cpu_nodes"),
                      "gauge", "Share of a training process's allowed CPUs on the NUMA node of a device it uses "
                      "(a GPU it has open, a NIC, a disk): 1 all local, 0 all remote; a device of unknown node "
                      "counts as local")
SKIPPED = SignalSpec("device_locality_skipped_total", "1", ("node", "reason"), "counter",
                     "Files the device-locality poller could not use, by reason")

Sample = tuple[str, dict, float]
SKIP_REASONS = ("vanished", "unreadable", "malformed", "missing")
KINDS = ("gpu", "nic", "block")
UNKNOWN_NODE = "unknown"
EVERY = 30.0                  # seconds between reads of the devices and of each process
GPU_NODE = re.compile(r"/dev/nvidia(\d+)")
MINOR_LINE = re.compile(r"^Device Minor:\s*(\d+)\s*$", re.MULTILINE)
MAX_CPU = 1 << 16             # no kernel runs more CPUs (NR_CPUS is at most 8192)
MAX_READ = 1 << 16            # a sysfs attribute is at most a page, a status a few kB
GONE = (errno.ENOENT, errno.ESRCH, errno.ENODEV, errno.ENXIO)


class Device(NamedTuple):
    name: str        # nvidia0, eth0, nvme0n1
    kind: str        # one of KINDS
    numa: str        # its node as a label: "1", or UNKNOWN_NODE


@dataclass(frozen=True)
class Reading:
    """One read of a training process: its CPUs (empty when it could not be
    read: no sample until the next read) and the GPU minors it has open."""
    at: float
    cpus: frozenset[int] = frozenset()
    gpus: tuple[int, ...] = ()


class DeviceLocality:
    def __init__(self, node: str = "", proc_root: str = "/proc", sys_root: str = "/sys",
                 every: float = EVERY) -> None:
        self.node = node or os.uname().nodename
        self.proc, self.sys = Path(proc_root), Path(sys_root)
        self.every = every
        self.topology = Topology(sys_root)
        self.skipped: Counter[str] = Counter()
        self._told: set[tuple[str, str]] = set()           # (file, reason) already logged
        self._read_at = float("-inf")                      # the last read of the devices
        self._nodes: dict[int, frozenset[int]] = {}        # NUMA node -> its CPUs
        self._devices: list[Device] = []                   # NICs and disks
        self._gpus: dict[int, Device] = {}                 # minor -> GPU
        self._procs: dict[int, Reading] = {}

    def collect(self, pids: Iterable[int], now: float) -> list[Sample]:
        """The locality of each device every process of ``pids`` uses, then the skip counts."""
        if now - self._read_at >= self.every:
            self._read_machine()
            self._read_at = now
        wanted = set(pids)
        for gone in self._procs.keys() - wanted:
            del self._procs[gone]
        out = []
        for pid in sorted(wanted):
            reading = self._procs.get(pid)
            if reading is None or now - reading.at >= self.every:
                reading = self._procs[pid] = self._read_process(pid, now)
            out += self._samples(pid, reading)
        out += [(SKIPPED.name, {"node": self.node, "reason": reason}, float(self.skipped[reason]))
                for reason in SKIP_REASONS]
        return out

    def _samples(self, pid: int, reading: Reading) -> list[Sample]:
        cpus = reading.cpus & self._online()
        if not cpus:
            return []
        cpu_nodes = ",".join(str(n) for n, on in self._nodes.items() if on & cpus)
        devices = [self._gpus[minor] for minor in reading.gpus if minor in self._gpus] + self._devices
        return [(LOCALITY.name, {"node": self.node, "pid": str(pid), "trainer": str(pid), "dev": dev.name,
                                 "kind": dev.kind, "numa_node": dev.numa, "cpu_nodes": cpu_nodes},
                 self._ratio(dev, cpus)) for dev in devices]

    def _online(self) -> frozenset[int]:
        """The CPUs some NUMA node lists."""
        return frozenset().union(*self._nodes.values())

    def _ratio(self, dev: Device, cpus: frozenset[int]) -> float:
        if dev.numa == UNKNOWN_NODE:
            return 1.0
        return len(cpus & self._nodes.get(int(dev.numa), frozenset())) / len(cpus)

    # --- the machine: NUMA nodes, NICs, disks, GPUs -------------------------------
    def _read_machine(self) -> None:
        self._nodes = self._read_nodes()
        self._devices = (self._class_devices(self.sys / "class" / "net", "nic")
                         + self._class_devices(self.sys / "block", "block"))
        self._gpus = self._read_gpus()

    def _read_nodes(self) -> dict[int, frozenset[int]]:
        where = self.topology.node_dir
        try:
            return {node: frozenset(cpus) for node, cpus in self.topology.nodes().items()}
        except ValueError as exc:
            self._skip("malformed", where, detail=str(exc))
        except OSError as exc:
            self._skip("unreadable", where, detail=exc.strerror or str(exc))
        return {}

    def _class_devices(self, folder: Path, kind: str) -> list[Device]:
        """The entries of ``folder`` with a ``device`` link whose node is known or -1."""
        out = []
        for entry in sorted(_listing(folder)):
            link = entry / "device"
            if not os.path.exists(link):       # a virtual one: lo, a bridge, a loop device
                continue
            numa = self._numa_of(link)
            if numa is not None:
                out.append(Device(entry.name, kind, numa))
        return out

    def _read_gpus(self) -> dict[int, Device]:
        """Minor -> GPU, from the NVIDIA driver's ``information`` file of each PCI device."""
        out = {}
        for entry in sorted(_listing(self.proc / "driver" / "nvidia" / "gpus")):
            path = entry / "information"
            text = self._read(path, "missing")
            if text is None:
                continue
            minor = MINOR_LINE.search(text)
            try:
                addr = normalise_pci_address(entry.name)
            except TopologyError as exc:
                self._skip("malformed", entry, detail=str(exc))
                continue
            if minor is None:
                self._skip("malformed", path, detail="no 'Device Minor: N' line")
                continue
            numa = self._numa_of(self.sys / "bus" / "pci" / "devices" / addr)
            if numa is not None:
                out[int(minor.group(1))] = Device(f"nvidia{minor.group(1)}", "gpu", numa)
        return out

    def _numa_of(self, device: Path) -> str | None:
        """The node of ``device`` or of the nearest device above it with a
        ``numa_node`` file, inside the sys root; None when none has one or it is
        not a number (counted)."""
        top = Path(os.path.realpath(self.sys))
        path = Path(os.path.realpath(device))
        while top in path.parents:
            if os.path.lexists(path / "numa_node"):
                return self._parse_node(path / "numa_node")
            path = path.parent
        self._skip("missing", device, detail="no numa_node on it or on a device above it")
        return None

    def _parse_node(self, path: Path) -> str | None:
        text = self._read(path, "vanished")
        if text is None:
            return None
        value = text.strip()
        try:
            node = int(value)
        except ValueError:
            self._skip("malformed", path, 1, f"{value[:60]!r} is not a NUMA node")
            return None
        return str(node) if node >= 0 else UNKNOWN_NODE

    # --- a training process -----------------------------------------------------
    def _read_process(self, pid: int, now: float) -> Reading:
        path = self.proc / str(pid) / "status"
        text = self._read(path, "vanished")
        if text is None:
            return Reading(now)
        for number, line in enumerate(text.splitlines(), 1):
            name, _, value = line.partition(":")
            if name == "Cpus_allowed_list":
                break
        else:
            self._skip("missing", path, detail="no Cpus_allowed_list line")
            return Reading(now)
        try:
            cpus = _cpus(value)
        except ValueError as exc:
            self._skip("malformed", path, number, str(exc))
            return Reading(now)
        if self._nodes and not cpus & self._online():
            self._skip("malformed", path, number, f"{value.strip()[:60]!r} names no CPU of a NUMA node")
            return Reading(now)
        gpus = self._open_gpus(pid)
        return Reading(now) if gpus is None else Reading(now, cpus, gpus)

    def _open_gpus(self, pid: int) -> tuple[int, ...] | None:
        """The minors of the GPUs ``pid`` has open; None when it exited meanwhile.
        A GPU the driver's files do not name is counted as missing."""
        fd_dir = self.proc / str(pid) / "fd"
        try:
            names = os.listdir(fd_dir)
        except OSError as exc:
            if exc.errno in GONE:
                self._skip("vanished", fd_dir)
                return None
            self._skip("unreadable", fd_dir, detail=exc.strerror or str(exc))
            return ()                          # its NICs and disks are still known
        minors = set()
        for name in names:
            try:
                match = GPU_NODE.fullmatch(os.readlink(fd_dir / name))
            except OSError:                    # closed since the listing
                continue
            if match:
                minors.add(int(match.group(1)))
        for minor in sorted(minors - self._gpus.keys()):
            self._skip("missing", fd_dir, detail=f"/dev/nvidia{minor}: no {self.proc}/driver/nvidia/gpus/*/"
                                                 f"information names Device Minor {minor}")
        return tuple(sorted(minors))

    # --- reading and counting ---------------------------------------------------
    def _skip(self, reason: str, path: Path, line: int | None = None, detail: str = "") -> None:
        self.skipped[reason] += 1
        if (str(path), reason) not in self._told:
            self._told.add((str(path), reason))
            where = f"{path}:{line}" if line else str(path)
            log.warning("%s: %s%s (counted in device_locality_skipped_total; told once)", where, reason,
                        f": {detail}" if detail else "")

    def _read(self, path: Path, absent: str) -> str | None:
        """The file's text, or None when it cannot be read: counted as ``absent``
        when it (or its process) is gone, else as unreadable or malformed."""
        try:
            data = read_kernel_file(path, MAX_READ)
        except OSError as exc:
            if exc.errno in GONE:
                self._skip(absent, path)
            else:
                self._skip("unreadable", path, detail=exc.strerror or str(exc))
            return None
        if len(data) > MAX_READ:
            self._skip("malformed", path, detail=f"over {MAX_READ} bytes")
            return None
        return data.decode("ascii", errors="replace")


def _cpus(text: str) -> frozenset[int]:
    """The CPUs of a kernel CPU list; ValueError for one that is not, or names a
    CPU no kernel has."""
    if any(int(n) >= MAX_CPU for n in re.findall(r"\d+", text)):
        raise ValueError(f"{text.strip()[:60]!r} names a CPU beyond {MAX_CPU - 1}")
    cpus = frozenset(parse_cpulist(text))
    if not cpus:
        raise ValueError("an empty CPU list")
    return cpus


def _listing(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except OSError:
        return []
