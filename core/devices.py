"""Which accelerator and fabric devices this node has, for signals and policies
that only mean something where such a device exists.

A GPU is an NVIDIA device node (``/dev/nvidia0``, ``/dev/nvidia1``, ...; the
control nodes ``nvidiactl``/``nvidia-uvm`` do not count); an RDMA device is an
entry under ``/sys/class/infiniband`` (mlx5_0, rxe0, ...). Roots are injectable
so tests and ``--sys-root`` describe another machine.

Example::

    Devices().missing("gpu")     # "no GPU (no /dev/nvidia<N>)" on a CPU-only node, else None
    Devices(sys_root="/tmp/fake-sys").missing("rdma")

Overhead: one directory listing per call.
"""
from __future__ import annotations

import re
from pathlib import Path

KINDS = ("gpu", "rdma")
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
        raise ValueError(f"unknown device kind '{kind}' (known: {', '.join(KINDS)})")


def _listing(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except OSError:
        return []
