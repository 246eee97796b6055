"""NUMA topology as sysfs describes it: CPUs per node, and the node of a PCI device.

Reads ``<sys_root>/devices/system/node/node*/cpulist``,
``<sys_root>/devices/system/cpu/online`` and
``<sys_root>/bus/pci/devices/<address>/numa_node``. The sys root is injectable so
tests can describe a two-node machine on a one-node host.

Example::

    topo = NumaTopology("/sys")
    topo.nodes()                          # {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}
    topo.device_node("0000:3b:00.0")      # 1, or None when the device reports -1

Overhead: a few small file reads per call; nothing is cached, so CPU hotplug is seen.
"""
from __future__ import annotations

import re
from pathlib import Path

from reflexarc.core.cpus import parse_cpulist

from .base import PermanentActuatorError

# domain:bus:device.function, the domain optional ("3b:00.0" means "0000:3b:00.0").
PCI_ADDRESS = re.compile(r"(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")


def normalise_pci_address(address: str) -> str:
    m = PCI_ADDRESS.fullmatch(address.strip())
    if not m:
        raise PermanentActuatorError(f"'{address}' is not a PCI address (domain:bus:device.function)")
    domain, bus, dev, fn = m.groups()
    return f"{(domain or '0000').lower()}:{bus.lower()}:{dev.lower()}.{fn}"


class NumaTopology:
    def __init__(self, sys_root: str = "/sys") -> None:
        self.sys_root = Path(sys_root)
        self.node_dir = self.sys_root / "devices" / "system" / "node"

    def nodes(self) -> dict[int, list[int]]:
        """Node number -> its CPUs, for every node sysfs lists."""
        out = {}
        for path in self.node_dir.glob("node[0-9]*"):
            suffix = path.name[4:]
            if suffix.isdigit() and (path / "cpulist").is_file():
                out[int(suffix)] = parse_cpulist((path / "cpulist").read_text())
        return dict(sorted(out.items()))

    def node_cpus(self, node: int) -> list[int]:
        path = self.node_dir / f"node{int(node)}" / "cpulist"
        try:
            return parse_cpulist(path.read_text())
        except FileNotFoundError:
            known = ", ".join(map(str, self.nodes())) or "none"
            raise PermanentActuatorError(f"no NUMA node {node} (nodes: {known})") from None

    def online_cpus(self) -> list[int] | None:
        """CPUs the kernel has online, or None when sysfs does not say."""
        try:
            return parse_cpulist((self.sys_root / "devices" / "system" / "cpu" / "online").read_text())
        except FileNotFoundError:
            return None

    def device_node(self, address: str) -> int | None:
        """NUMA node of a PCI device; None when it reports -1 (no affinity information)."""
        addr = normalise_pci_address(address)
        path = self.sys_root / "bus" / "pci" / "devices" / addr / "numa_node"
        try:
            node = int(path.read_text().strip())
        except FileNotFoundError:
            raise PermanentActuatorError(f"no PCI device {addr} under {path.parents[1]}") from None
        return None if node < 0 else node
