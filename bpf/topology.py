"""The machine's CPU -> NUMA node map, read from ``/sys/devices/system/node``.

Probes load it into a BPF array so the kernel can flag a migration that crosses
a node boundary. The sysfs root is injectable, and an explicit node -> cpus map
overrides the machine's (a one-node test box can pretend CPU 0 and CPU 1 sit on
different nodes).

Example::

    topo = Topology.from_sysfs()              # {0: [0, 1]} on a one-node box
    topo = Topology({0: [0], 1: [1]})         # override for tests
    topo.node_of(1)                           # 1
    topo.cpu_nodes(max_cpus=4)                # [0, 1, -1, -1]

Overhead: a few small sysfs reads, once.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from reflexarc.core.cpus import parse_cpulist

NO_NODE = -1


class Topology:
    def __init__(self, nodes: Mapping[int, Sequence[int]]) -> None:
        self.nodes = {int(n): sorted(int(c) for c in cpus) for n, cpus in nodes.items()}
        self._node_of = {cpu: node for node, cpus in self.nodes.items() for cpu in cpus}
        if len(self._node_of) != sum(len(c) for c in self.nodes.values()):
            raise ValueError(f"a CPU appears in more than one node: {dict(self.nodes)}")

    @classmethod
    def from_sysfs(cls, root: str = "/sys") -> "Topology":
        """Nodes from ``<root>/devices/system/node/node*/cpulist``; a kernel without
        NUMA support has no node directories and gets one node 0 holding every
        possible CPU."""
        base = Path(root) / "devices" / "system"
        nodes = {}
        for d in sorted((base / "node").glob("node[0-9]*")):
            cpulist = d / "cpulist"
            if cpulist.exists():
                nodes[int(d.name[4:])] = parse_cpulist(cpulist.read_text())
        if not nodes:
            possible = base / "cpu" / "possible"
            nodes = {0: parse_cpulist(possible.read_text()) if possible.exists() else [0]}
        return cls(nodes)

    @classmethod
    def load(cls, override: Mapping[int, Sequence[int]] | None = None, root: str = "/sys") -> "Topology":
        return cls(override) if override is not None else cls.from_sysfs(root)

    def node_of(self, cpu: int) -> int:
        return self._node_of.get(cpu, NO_NODE)

    def cpus(self) -> list[int]:
        return sorted(self._node_of)

    def cpu_nodes(self, max_cpus: int) -> list[int]:
        """Node of each CPU 0..max_cpus-1 (``NO_NODE`` for CPUs not listed)."""
        return [self.node_of(cpu) for cpu in range(max_cpus)]

    def __repr__(self) -> str:
        return f"Topology({self.nodes})"
