"""The catalogue of signal names: the only names a policy may use.

A signal is a named, labelled, timestamped value. Sources (simulations, bcc probes,
framework hooks, PromQL queries) publish samples of catalogued signals onto the bus.
The catalogue is assembled from what the sources declare: the ``signals`` of
every probe class ``bpf/catalog.py`` lists, the step signals of the framework
hooks (``actuators/hooks.py``), and ``EXTERNAL`` below for the signals whose
live source lies outside reflexarc. A new probe brings its signals with it.
``PRODUCERS`` says, for each name, what can emit it (``producers.py`` checks
which of those can run on this node).

Example::

    CATALOGUE["dataloader_read_latency_us"].unit     # "us"
    PRODUCERS["gpu_utilization_pct"]                 # (Producer("nvml", device="gpu"), Producer("promql"))
    suggest("dataloader_read_latency", CATALOGUE)    # "dataloader_read_latency_us"

Overhead: at import, one import of each probe module (no bcc; ~25 ms in all);
then dictionary look-ups only.
"""
from __future__ import annotations

from collections.abc import Iterable

from reflexarc.actuators.hooks import SIGNALS as HOOK_SIGNALS
from reflexarc.bpf import catalog
from reflexarc.bpf.device_locality import LOCALITY
from reflexarc.bpf.device_locality import SKIPPED as LOCALITY_SKIPPED
from reflexarc.core.signals import SignalSpec, suggest

from .producers import HOOKS, NVML, POLLER, PROBE, PROMQL, NodeFacts, Producer

__all__ = ["CATALOGUE", "EXTERNAL", "PRODUCERS", "SignalSpec", "UnknownSignal", "assemble", "producers_of",
           "suggest", "why_unproduced"]

# Signals whose live source lies outside the probes and the hooks: NVML where a
# GPU exists, or the cluster's Prometheus (DCGM exporter, NCCL telemetry)
# through a PromQL source; scenarios simulate them.
EXTERNAL: tuple[tuple[SignalSpec, tuple[Producer, ...]], ...] = (
    (SignalSpec("gpu_utilization_pct", "%", ("node", "gpu", "job"), "gauge", "GPU utilisation"),
     (Producer(NVML, device="gpu"), Producer(PROMQL))),
    (SignalSpec("nccl_link_latency_us", "us", ("node", "link", "quantile"), "gauge", "Collective link latency"),
     (Producer(PROMQL),)),
    (SignalSpec("rank_pre_collective_ratio", "1", ("node", "job", "rank"), "gauge",
                "A rank's time before the collective over the median of its job's ranks (PromQL over every "
                "rank's step_pre_collective_ms)"),
     (Producer(PROMQL),)),
    # The device-locality poller: no probe but a reader of /proc and sysfs that the
    # probe source runs beside the probes (controller/sources/readers.py).
    (LOCALITY, (Producer(POLLER, "device_locality"),)),
    (LOCALITY_SKIPPED, (Producer(POLLER, "device_locality"),)),
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


def _declarations() -> list[tuple[Producer, tuple[SignalSpec, ...]]]:
    """Every source with the signals it emits: each probe class ``catalog.ENTRIES``
    lists (a probe whose module is not installed contributes none; ``reflexarc
    probes`` says why), the framework hooks, then ``EXTERNAL``."""
    out = []
    for e in catalog.ENTRIES:
        try:
            cls = catalog.probe_class(e.name)
        except catalog.ProbeNotAvailable:
            continue
        out.append((Producer(PROBE, e.name, getattr(cls, "device", "")), cls.signals))
    out.append((Producer(HOOKS), HOOK_SIGNALS))
    out += [(producer, (spec,)) for spec, producers in EXTERNAL for producer in producers]
    return out


def _producers(declarations) -> dict[str, tuple[Producer, ...]]:
    out: dict[str, tuple[Producer, ...]] = {}
    for producer, specs in declarations:
        for spec in specs:
            if producer not in out.get(spec.name, ()):
                out[spec.name] = (*out.get(spec.name, ()), producer)
    return out


_DECLARED = _declarations()
CATALOGUE: dict[str, SignalSpec] = assemble((str(producer), specs) for producer, specs in _DECLARED)
PRODUCERS: dict[str, tuple[Producer, ...]] = _producers(_DECLARED)


class UnknownSignal(KeyError):
    def __init__(self, name: str) -> None:
        self.name = name
        self.suggestion = suggest(name, CATALOGUE)
        super().__init__(name)

    def __str__(self) -> str:
        hint = f"; did you mean '{self.suggestion}'?" if self.suggestion else ""
        return f"unknown signal '{self.name}'{hint}"


def producers_of(name: str) -> tuple[Producer, ...]:
    """Every producer that declares signal ``name``."""
    return PRODUCERS.get(name, ())


def why_unproduced(name: str, facts: NodeFacts) -> str | None:
    """None when some producer of signal ``name`` can emit here, else every reason."""
    producers = producers_of(name)
    if not producers:
        return "nothing produces it"
    reasons = [facts.why_not(p, name) for p in producers]
    if None in reasons:
        return None
    return "; ".join(f"{p}: {reason}" for p, reason in zip(producers, reasons))
