"""The catalogue of signal names: the only names a policy may use.

A signal is a named, labelled, timestamped value. Sources (simulations, bcc probes,
framework hooks, PromQL queries) publish samples of catalogued signals onto the bus.
The catalogue is assembled from what the sources declare: the ``signals`` of
every probe class ``bpf/catalog.py`` lists, the step signals of the framework
hooks (``actuators/hooks.py``), and ``EXTERNAL`` below for the signals whose
live source lies outside reflexarc. A new probe brings its signals with it.

Example::

    CATALOGUE["dataloader_read_latency_us"].unit     # "us"
    suggest("dataloader_read_latency", CATALOGUE)    # "dataloader_read_latency_us"

Overhead: at import, one import of each probe module (no bcc; ~25 ms in all);
then dictionary look-ups only.
"""
from __future__ import annotations

from collections.abc import Iterable

from reflexarc.actuators.hooks import SIGNALS as HOOK_SIGNALS
from reflexarc.bpf import catalog
from reflexarc.core.signals import SignalSpec, suggest

__all__ = ["CATALOGUE", "EXTERNAL", "SignalSpec", "UnknownSignal", "assemble", "suggest"]

# Signals no part of reflexarc emits yet: they come from external sources
# (DCGM or NVML exporters, NCCL's own telemetry, NIC port counters) through a
# replay file or a query source, and scenarios simulate them.
EXTERNAL: tuple[SignalSpec, ...] = (
    SignalSpec("gpu_utilization_pct", "%", ("node", "gpu", "job"), "gauge", "GPU utilisation"),
    SignalSpec("nccl_link_latency_us", "us", ("node", "link", "quantile"), "gauge", "Collective link latency"),
    SignalSpec("link_utilization_pct", "%", ("node", "iface"), "gauge", "Port utilisation"),
    SignalSpec("numa_remote_ratio", "ratio", ("node", "job", "pid", "trainer", "rank"), "gauge",
               "Share of a task's CPU time spent on a CPU outside its memory's NUMA node"),
)


def assemble(declarations: Iterable[tuple[str, Iterable[SignalSpec]]]) -> dict[str, SignalSpec]:
    """Name -> spec from ``(source, specs)`` pairs. A signal two sources declare
    must be declared the same by both; ValueError names the two otherwise."""
    out: dict[str, SignalSpec] = {}
    where: dict[str, str] = {}
    for source, specs in declarations:
        for spec in specs:
            have = out.get(spec.name)
            if have is not None and have != spec:
                raise ValueError(f"signal '{spec.name}' is declared differently by {where[spec.name]} "
                                 f"({have}) and {source} ({spec})")
            out.setdefault(spec.name, spec)
            where.setdefault(spec.name, source)
    return out


def _probe_declarations() -> list[tuple[str, tuple[SignalSpec, ...]]]:
    """The signals of each probe class ``catalog.ENTRIES`` lists; a probe whose
    module is not installed contributes none (``reflexarc probes`` says why)."""
    out = []
    for e in catalog.ENTRIES:
        try:
            out.append((f"probe {e.name}", catalog.probe_class(e.name).signals))
        except catalog.ProbeNotAvailable:
            continue
    return out


CATALOGUE: dict[str, SignalSpec] = assemble(
    [*_probe_declarations(), ("the framework hooks", HOOK_SIGNALS), ("EXTERNAL", EXTERNAL)])


class UnknownSignal(KeyError):
    def __init__(self, name: str) -> None:
        self.name = name
        self.suggestion = suggest(name, CATALOGUE)
        super().__init__(name)

    def __str__(self) -> str:
        hint = f"; did you mean '{self.suggestion}'?" if self.suggestion else ""
        return f"unknown signal '{self.name}'{hint}"
