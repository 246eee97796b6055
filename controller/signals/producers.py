"""What produces each catalogued signal, and whether anything can produce it on
this node: a shipped policy whose signal nothing here emits would wait forever.

A signal's producers are the probes that declare it, the framework hooks, NVML
(GPU utilisation where a GPU exists), a poller (a reader of /proc and sysfs
the probe source runs: ``bpf/device_locality.py``) or a PromQL source (a
query the operator configures against the cluster's Prometheus). A probe
producer is named with its tier: a light probe is always on, a deep one runs
only while a policy switches it on, so a signal only a deep probe produces
cannot be what starts it (the RDMA NIC counters are the light tier's
``rdma_counters``, polled from sysfs; the per-QP latency is the deep tier's
``rdma_qp``).
``NodeFacts.why_not`` says why a producer cannot run here (no GPU, no RDMA
device, bcc missing for a probe that compiles a program, the probe's
tracepoints are missing, no PromQL source configured, or none with a query for
that signal), looking for devices under the same roots as ``Devices``;
``catalogue.why_unproduced`` collects that for a signal (``policy/readiness.py``
turns it into findings about policies). ``NodeFacts.missing`` answers for what a policy's
``requires`` names (``REQUIREMENTS``: a device kind, or ``promql``).

Example::

    facts = NodeFacts()
    facts.why_not(Producer("probe", "gpu_submit", device="gpu"))   # "no GPU (no /dev/nvidia<N>)"
    str(Producer("probe", "rdma_counters", device="rdma"))       # "probe rdma_counters (light tier, always on)"
    catalogue.why_unproduced("gpu_utilization_pct", facts)
    # "NVML: no GPU (no /dev/nvidia<N>); a PromQL source: no PromQL source configured"
    NodeFacts(promql=frozenset({"gpu_utilization_pct"})).missing("promql")   # None: a source is configured

Overhead: on first use per producer, one import of the probe module and its
attach-point choice (tracefs ``stat``s); then a dictionary look-up.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from reflexarc.bpf import catalog
from reflexarc.bpf.probe import UNSUPPORTED, KernelFeatures
from reflexarc.core.devices import KINDS as DEVICE_KINDS
from reflexarc.core.devices import Devices

PROBE, HOOKS, NVML, PROMQL = "probe", "hooks", "nvml", "promql"
POLLER = "poller"      # a reader of /proc and sysfs with no BPF program that the probe source runs (name: its module)
TIER_WORDS = {catalog.LIGHT: "light tier, always on", catalog.DEEP: "deep tier, on demand"}
REQUIREMENTS = (*DEVICE_KINDS, PROMQL)     # what a policy may declare in 'requires'
NO_PROMQL = "no PromQL source configured"


@dataclass(frozen=True)
class Producer:
    kind: str          # PROBE, HOOKS, NVML or PROMQL
    name: str = ""     # the probe's name
    device: str = ""   # a device kind (core.devices.KINDS) it needs

    def __str__(self) -> str:
        if self.kind == PROBE:
            return f"probe {self.name} ({TIER_WORDS[catalog.entry(self.name).tier]})"
        return {HOOKS: "the framework hooks", NVML: "NVML", PROMQL: "a PromQL source",
                POLLER: f"the {self.name} poller (/proc and sysfs, no BPF program)"}[self.kind]


class NodeFacts:
    """What this node can produce; roots and the PromQL configuration injectable.
    ``promql``: the signals the configured PromQL source has a query for
    (``promql_config.PromqlConfig.signals``); True for a source of any signal."""

    def __init__(self, devices: Devices | None = None, features: KernelFeatures | None = None,
                 promql: bool | frozenset[str] = False, jobs: tuple[str, ...] | None = None) -> None:
        self.devices = devices or Devices()
        self.features = features or KernelFeatures()
        self.promql = promql
        self.jobs = jobs      # the jobs running on the node now (core.jobs), None when not looked at
        self._cache: dict[Producer, tuple[str | None, dict[str, str]]] = {}

    def why_not(self, producer: Producer, signal: str = "") -> str | None:
        """None when ``producer`` can emit (``signal``) here, else the reason."""
        if producer.kind == PROMQL:
            if not self.promql:
                return NO_PROMQL
            if self.promql is True or signal in self.promql:
                return None
            return "the PromQL configuration has no query for it"
        if producer not in self._cache:
            self._cache[producer] = self._why_not(producer)
        reason, unproduced = self._cache[producer]
        return reason or unproduced.get(signal)

    def missing(self, requirement: str) -> str | None:
        """None when the node has what ``requires`` names (``REQUIREMENTS``), else why not."""
        if requirement == PROMQL:
            return None if self.promql else NO_PROMQL
        return self.devices.missing(requirement)

    def _why_not(self, producer: Producer) -> tuple[str | None, dict[str, str]]:
        """Why the producer cannot run here (None: it can), and the signals it
        will not emit even so, each with why (``Probe.unproduced``)."""
        if producer.device:
            missing = self.devices.missing(producer.device)
            if missing:
                return missing, {}
        if producer.kind == HOOKS:
            return None, {}      # the training script serves them (reflexarc.actuators.hooks)
        if producer.kind == POLLER:
            return None, {}      # /proc and sysfs are always there to read
        if producer.kind == NVML:
            return (None if importlib.util.find_spec("pynvml") else "NVML bindings (nvidia-ml-py) not installed"), {}
        try:
            cls = catalog.probe_class(producer.name)
        except catalog.ProbeNotAvailable as exc:
            return str(exc), {}
        if getattr(cls, "uses_bpf", True):
            if importlib.util.find_spec("bcc") is None:
                return "bcc is not installed", {}
            unprivileged = self.features.missing_privilege()
            if unprivileged:
                return unprivileged, {}
        probe = cls(features=self.features, **self._roots(cls))
        status = probe.choose_attach_points()
        if status.state == UNSUPPORTED:
            return status.reason or "unsupported", {}
        return None, probe.unproduced()

    def _roots(self, cls) -> dict:
        """A probe looks for its devices where this node's devices are read."""
        roots = {}
        if getattr(cls, "takes_dev_root", False):
            roots["dev_root"] = str(self.devices.dev_root)
        if cls.takes_sys_root:
            roots["sys_root"] = str(self.devices.sys_root)
        return roots
