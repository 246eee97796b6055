"""NUMA topology as sysfs describes it: CPUs per node, and the node of a PCI device.

Reads ``<sys_root>/devices/system/node/node*/cpulist``,
``<sys_root>/devices/system/cpu/online`` and
``<sys_root>/bus/pci/devices/<address>/numa_node``. The sys root is injectable so
tests can describe a two-node machine on a one-node host.

Example::

    topo = NumaTopology("/sys")
    topo.nodes()                          # {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}
    topo.device_node("0000:3b:00.0")      # 1, or None when the device reports -1
    format_cpulist([0, 1, 2, 5])          # "0-2,5"

Overhead: a few small file reads per call; nothing is cached, so CPU hotplug is seen.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from .base import PermanentActuatorError

# domain:bus:device.function, the domain optional ("3b:00.0" means "0000:3b:00.0").
PCI_ADDRESS = re.compile(r"(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")


def parse_cpulist(text: str) -> list[int]:
    """``"0-3,8,10-11"`` -> ``[0, 1, 2, 3, 8, 10, 11]``; an empty list for ``""``."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise ValueError(f"bad cpulist element {part!r}") from None
        if first < 0 or last < first:
            raise ValueError(f"bad cpulist range {part!r}")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` (the kernel's own notation)."""
    out, run = [], []
    for cpu in sorted(set(cpus)):
        if run and cpu == run[-1] + 1:
            run.append(cpu)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [cpu]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


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
