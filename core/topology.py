"""The machine's NUMA topology as sysfs describes it: the CPUs of each node, the
online CPUs, the node of a CPU and the node of a PCI device.

``Topology`` reads ``<sys_root>/devices/system/node/node*/cpulist``,
``<sys_root>/devices/system/cpu/online`` and
``<sys_root>/bus/pci/devices/<address>/numa_node``; nothing is cached, so CPU
hotplug is seen. The sys root is injectable: a fixture tree describes a
two-node machine on a one-node host, and the affinity actuator and the
``sched_numa`` probe then see the same nodes. A machine without
``devices/system/node`` (a kernel without NUMA) is one node 0 holding every
online CPU. ``NodeMap`` is a fixed CPU -> node assignment: a snapshot of a
``Topology``, or given outright (``NodeMap({0: [0], 1: [1]})``) to make a
one-node box look like two.

Example::

    topo = Topology("/sys")
    topo.nodes()                          # {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}
    topo.node_of(5)                       # 1 (NO_NODE for a CPU no node lists)
    topo.online_cpus()                    # [0, 1, 2, 3, 4, 5, 6, 7], None when sysfs does not say
    topo.device_node("3b:00.0")           # 1, or None when the device reports -1
    topo.node_cpus(7)                     # TopologyError: no NUMA node 7 (nodes: 0, 1)
    topo.node_map().cpu_nodes(10)         # [0, 0, 0, 0, 1, 1, 1, 1, -1, -1]

Overhead: a few small file reads per call (one per node, plus ``cpu/online``).
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from .cpus import format_cpulist, parse_cpulist

NO_NODE = -1

# domain:bus:device.function, the domain optional ("3b:00.0" means "0000:3b:00.0").
PCI_ADDRESS = re.compile(r"(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")


class TopologyError(ValueError):
    """An unknown NUMA node or PCI device, or text that is not a PCI address."""


def normalise_pci_address(address: str) -> str:
    m = PCI_ADDRESS.fullmatch(address.strip())
    if not m:
        raise TopologyError(f"'{address}' is not a PCI address (domain:bus:device.function)")
    domain, bus, dev, fn = m.groups()
    return f"{(domain or '0000').lower()}:{bus.lower()}:{dev.lower()}.{fn}"


class NodeMap:
    """A fixed node -> CPUs assignment; a CPU in two nodes is a ValueError."""

    def __init__(self, nodes: Mapping[int, Sequence[int]]) -> None:
        self.nodes = {int(n): sorted(int(c) for c in cpus) for n, cpus in sorted(nodes.items())}
        self._node_of = {cpu: node for node, cpus in self.nodes.items() for cpu in cpus}
        if len(self._node_of) != sum(len(c) for c in self.nodes.values()):
            raise ValueError(f"a CPU appears in more than one node: {dict(self.nodes)}")

    def node_of(self, cpu: int) -> int:
        return self._node_of.get(cpu, NO_NODE)

    def cpus(self) -> list[int]:
        return sorted(self._node_of)

    def cpu_nodes(self, max_cpus: int) -> list[int]:
        """Node of each CPU 0..max_cpus-1 (``NO_NODE`` for CPUs no node lists)."""
        return [self.node_of(cpu) for cpu in range(max_cpus)]

    def __repr__(self) -> str:
        return f"NodeMap({self.nodes})"


class Topology:
    def __init__(self, sys_root: str | Path = "/sys") -> None:
        self.sys_root = Path(sys_root)
        self.node_dir = self.sys_root / "devices" / "system" / "node"

    def nodes(self) -> dict[int, list[int]]:
        """Node number -> its CPUs, for every node sysfs lists; without node
        directories, ``{0: online CPUs}`` (``[0]`` when sysfs does not say)."""
        out = {}
        for path in self.node_dir.glob("node[0-9]*"):
            suffix = path.name[4:]
            if suffix.isdigit() and (path / "cpulist").is_file():
                out[int(suffix)] = parse_cpulist((path / "cpulist").read_text())
        return dict(sorted(out.items())) or {0: self.online_cpus() or [0]}

    def node_map(self) -> NodeMap:
        return NodeMap(self.nodes())

    def node_of(self, cpu: int) -> int:
        """The node of ``cpu``, ``NO_NODE`` when no node lists it."""
        return self.node_map().node_of(cpu)

    def node_cpus(self, node: int) -> list[int]:
        nodes = self.nodes()
        if int(node) not in nodes:
            raise TopologyError(f"no NUMA node {node} (nodes: {', '.join(map(str, nodes))})")
        return nodes[int(node)]

    def online_cpus(self) -> list[int] | None:
        """CPUs the kernel has online, or None when sysfs does not say."""
        try:
            return parse_cpulist((self.sys_root / "devices" / "system" / "cpu" / "online").read_text())
        except FileNotFoundError:
            return None

    def require_online(self, cpus) -> None:
        """TopologyError naming the ``cpus`` the kernel has not online (none when sysfs does not say)."""
        online = self.online_cpus()
        offline = set(cpus) - set(online) if online is not None else set()
        if offline:
            raise TopologyError(f"CPUs {format_cpulist(offline)} are not online")

    def device_node(self, address: str) -> int | None:
        """NUMA node of a PCI device; None when it reports -1 (no affinity information)."""
        addr = normalise_pci_address(address)
        path = self.sys_root / "bus" / "pci" / "devices" / addr / "numa_node"
        try:
            node = int(path.read_text().strip())
        except FileNotFoundError:
            raise TopologyError(f"no PCI device {addr} under {path.parents[1]}") from None
        return None if node < 0 else node
