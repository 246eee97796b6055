"""Every probe reflexarc ships, by name, with its tier; classes are imported only
when asked for, so listing probes needs neither bcc nor every probe module.

Light probes are always on; deep probes (RDMA queue-pair matching costs ~5-8 %
of a core) run only while a policy asks for them, through
``ProbeManager.enable_deep``.

Example::

    names("light")                     # ["dataloader_io", "sched_numa", ...]
    cls = probe_class("sched_numa")    # reflexarc.bpf.sched_numa.SchedNuma
    probe_class("nope")                # raises ProbeNotAvailable

Overhead: an ``importlib`` import the first time a class is asked for.
"""
from __future__ import annotations

import importlib
from typing import NamedTuple

from .probe import Probe

LIGHT, DEEP = "light", "deep"


class ProbeEntry(NamedTuple):
    name: str
    module: str      # inside reflexarc.bpf
    class_name: str
    tier: str


ENTRIES: tuple[ProbeEntry, ...] = (
    ProbeEntry("dataloader_io", "dataloader_io", "DataloaderIo", LIGHT),
    ProbeEntry("sched_numa", "sched_numa", "SchedNuma", LIGHT),
    ProbeEntry("block_io", "block_io", "BlockIo", LIGHT),
    ProbeEntry("gpu_submit", "gpu_submit", "GpuSubmit", LIGHT),
    ProbeEntry("net_tcp", "net_tcp", "NetTcp", LIGHT),
    ProbeEntry("link_traffic", "link_traffic", "LinkTraffic", LIGHT),
    ProbeEntry("batch_wait", "batch_wait", "BatchWait", LIGHT),
    ProbeEntry("rdma_counters", "rdma_counters", "RdmaCounters", LIGHT),
    ProbeEntry("pcie_aer", "pcie_aer", "PcieAer", LIGHT),
    ProbeEntry("proc_exit", "proc_exit", "ProcExit", LIGHT),
    ProbeEntry("rdma_qp", "rdma_qp", "RdmaQp", DEEP),
)
_BY_NAME = {e.name: e for e in ENTRIES}


class ProbeNotAvailable(LookupError):
    """The probe is unknown, or its module cannot be imported."""


def names(tier: str | None = None) -> list[str]:
    return [e.name for e in ENTRIES if tier is None or e.tier == tier]


def entry(name: str) -> ProbeEntry:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ProbeNotAvailable(f"unknown probe '{name}' (known: {', '.join(_BY_NAME)})") from None


def probe_class(name: str) -> type[Probe]:
    e = entry(name)
    try:
        module = importlib.import_module(f".{e.module}", __package__)
        cls = getattr(module, e.class_name)
    except (ImportError, AttributeError) as exc:
        raise ProbeNotAvailable(f"probe '{name}' is not installed: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Probe)):
        raise ProbeNotAvailable(f"{e.module}.{e.class_name} is not a Probe")
    return cls
