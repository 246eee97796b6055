"""Which accelerator and fabric devices this node has, for signals and policies
that only mean something where such a device exists.

A GPU is an NVIDIA device node (``/dev/nvidia0``, ``/dev/nvidia1``, ...; the
control nodes ``nvidiactl``/``nvidia-uvm`` do not count); an RDMA device is an
entry under ``/sys/class/infiniband`` (mlx5_0, rxe0, ...); ``pcie_aer`` is a
PCI device that reports its Advanced Error Reporting counters
(``/sys/bus/pci/devices/<addr>/aer_dev_*``: the kernel's AER driver on a PCIe
port that has the capability; virtual machines' virtio devices have none).
Roots are injectable so tests and ``--sys-root`` describe another machine.

Example::

    Devices().missing("gpu")     # "no GPU (no /dev/nvidia<N>)" on a CPU-only node, else None
    Devices(sys_root="/tmp/fake-sys").missing("rdma")
    Devices().missing("pcie_aer")  # "no AER counters on this node (no aer_dev_* file in /sys/bus/pci/devices/*)"

Overhead: one directory listing per call (``pcie_aer``: and up to three
``stat``s per PCI device).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

KINDS = ("gpu", "rdma", "pcie_aer")
AER_FILES = ("aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal")
_GPU_NODE = re.compile(r"nvidia\d+")


class Devices:
    def __init__(self, dev_root: str = "/dev", sys_root: str = "/sys") -> None:
        self.dev_root, self.sys_root = Path(dev_root), Path(sys_root)

    def missing(self, kind: str) -> str | None:
        """None when the node has a device of ``kind``, else why not."""
        if kind == "gpu":
            if any(_GPU_NODE.fullmatch(p.name) for p in _listing(self.dev_root)):
                return None
            return f"no GPU (no {self.dev_root}/nvidia<N>)"
        if kind == "rdma":
            if _listing(self.sys_root / "class" / "infiniband"):
                return None
            return f"no RDMA device (nothing in {self.sys_root}/class/infiniband)"
        if kind == "pcie_aer":
            if self.aer_devices():
                return None
            return f"no AER counters on this node (no aer_dev_* file in {self.pci_root}/*)"
        raise ValueError(f"unknown device kind '{kind}' (known: {', '.join(KINDS)})")

    @property
    def pci_root(self) -> Path:
        return self.sys_root / "bus" / "pci" / "devices"

    def aer_devices(self) -> list[Path]:
        """The PCI devices with at least one AER counter file, by address."""
        return sorted((d for d in _listing(self.pci_root) if any(os.path.exists(d / name) for name in AER_FILES)),
                      key=lambda d: d.name)


def _listing(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except OSError:
        return []
