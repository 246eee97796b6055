"""Common shape of every reflexarc probe: kernel feature detection, attach-point
fallback, status, compile-once, interval collection into signals.

Each probe is ``bpf/<name>.bpf.c`` beside its loader ``bpf/<name>.py``; the loader
subclasses ``Probe`` and declares the signals it emits in ``signals``
(``SignalSpec``s: name, unit, labels, kind, help); the controller's signal
catalogue is assembled from those declarations, so a probe listed in
``catalog.py`` needs no edit elsewhere. Parameters reach the C through
``cflags`` (``-DNAME=value``), never by splicing text. The C the programs
share is ``bpf/reflexarc_common.h``; ``final_source()`` inlines it where a
program includes it (bcc rewrites map calls and tracepoint arguments only in
the file it compiles, so a header found through ``-I`` would not compile),
with ``#line`` markers that keep compiler messages pointing at the real file
and line. A probe compiles once in
``start()``, aggregates in the kernel, and ``collect(now)`` reads (and resets)
its maps once per interval, returning plain ``(signal_name, labels, value)``
tuples: this layer does not know the controller; the controller stamps and
publishes them. A probe whose signals are per DataLoader worker sets
``trainers`` (``core.trainers.Trainers``): then every signal with a ``pid`` label
also carries ``trainer``, the worker's training process, which outlives the
per-epoch workers.

Example::

    probe = SchedNuma(Selection(comms=("pt_data_worker",)), features=KernelFeatures())
    probe.start()                       # compile + attach, sets probe.status
    for name, labels, value in probe.collect(now=time.time()):
        ...
    probe.stop()

Overhead: start costs one LLVM compile (~0.8 s, ~130 MB peak RSS); collect costs
one map walk per interval.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from reflexarc.core.signals import SignalSpec

HERE = Path(__file__).resolve().parent

# A program's own headers: #include "name.h", looked up in this folder.
LOCAL_INCLUDE = re.compile(r'^#include "([^"/]+)"[ \t]*$', re.MULTILINE)

OK, DEGRADED, UNSUPPORTED, STOPPED = "ok", "degraded", "unsupported", "stopped"
CAP_PERFMON, CAP_BPF = 38, 39      # capability bits (linux/capability.h)

# Signals about the probes themselves, which any probe may emit.
EVENTS_LOST = SignalSpec("probe_events_lost_total", "1", ("node", "probe"), "counter",
                         "Discrete probe events dropped because the ring buffer was full")
DEEP_EVENTS_PER_S = SignalSpec("deep_probe_events_per_s", "1/s", ("node", "probe"), "gauge",
                               "Events handled by the deep probe tier")


@dataclass
class ProbeStatus:
    state: str = STOPPED
    reason: str = ""
    attach_points: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        extra = f" ({self.reason})" if self.reason else ""
        return f"{self.state}{extra}"


@dataclass(frozen=True)
class Selection:
    """Which tasks/flows a probe watches. Changes are pushed with
    ``Probe.update_selection`` as map updates, never recompiles."""

    comms: tuple[str, ...] = ()      # process/thread names, e.g. ("pt_data_worker",)
    pids: tuple[int, ...] = ()       # tgids
    cgroup_ids: tuple[int, ...] = () # cgroup v2 ids (bpf_get_current_cgroup_id)
    ports: tuple[tuple[int, int], ...] = ()  # inclusive L4 port ranges
    job: str = ""                    # label attached to every signal
    interfaces: tuple[str, ...] = () # network interfaces, e.g. ("eth0",)
    netns: str = ""                  # their network namespace: a name under /run/netns or a
                                     # path such as /proc/PID/ns/net; "" = the controller's own
    link_speeds: tuple[tuple[str, int], ...] = ()  # (interface, bits/s) declared for virtual
                                     # or shaped links, whose reported speed says nothing
    traffic_cgroup_ids: tuple[int, ...] = ()  # cgroup v2 ids whose sockets' packets are the job's
                                     # traffic on those interfaces (not tasks to watch)
    # Filled by the probe manager from job discovery (reflexarc.core.jobs) at every refresh:
    trainers: tuple[int, ...] = ()   # tgids of the node's training processes (every job's)
    job_cgroups: tuple[tuple[str, tuple[int, ...]], ...] = ()   # (job, cgroup v2 ids of its training
                                     # processes): whose sockets' packets are each job's traffic


class KernelFeatures:
    """What the running kernel offers, read from tracefs/sysfs (roots injectable)."""

    def __init__(self, tracefs: str = "/sys/kernel/tracing", sysfs: str = "/sys",
                 procfs: str = "/proc") -> None:
        self.tracefs = Path(tracefs)
        self.sysfs = Path(sysfs)
        self.procfs = Path(procfs)

    def has_tracepoint(self, category: str, event: str) -> bool:
        return (self.tracefs / "events" / category / event / "format").exists()

    def has_kprobes(self) -> bool:
        return (self.tracefs / "kprobe_events").exists()

    def has_uprobes(self) -> bool:
        return (self.tracefs / "uprobe_events").exists()

    def missing_privilege(self) -> str | None:
        """Why this process may not load eBPF programs and read trace events, or
        None: it is root, or holds CAP_BPF and CAP_PERFMON and can read tracefs."""
        if os.geteuid() == 0:
            return None
        if not {CAP_BPF, CAP_PERFMON} <= self._effective_caps():
            return "not running as root"
        if not os.access(self.tracefs / "events", os.R_OK | os.X_OK, effective_ids=True):
            return f"cannot read {self.tracefs / 'events'}"
        return None

    def _effective_caps(self) -> set[int]:
        try:
            status = (self.procfs / "self" / "status").read_text()
        except OSError:
            return set()
        line = next((x for x in status.splitlines() if x.startswith("CapEff:")), "CapEff: 0")
        mask = int(line.split()[1], 16)
        return {bit for bit in range(mask.bit_length()) if mask >> bit & 1}

    def missing_prerequisite(self) -> str | None:
        """Why no probe can load at all, or None."""
        why = self.missing_privilege()
        if why:
            return why
        if not (self.tracefs / "events").is_dir():
            return f"tracefs is not mounted at {self.tracefs}"
        return None


class Probe:
    """Base class for probes. Subclasses set the class attributes and implement
    ``choose_attach_points``, ``attach`` and ``collect``."""

    name: str = ""
    tier: str = "light"              # "light" (always on) or "deep" (on demand)
    signals: tuple[SignalSpec, ...] = ()  # what this probe emits; the signal catalogue reads it
    fallback_order: tuple[str, ...] = ()  # human-readable, shown by `reflexarc probes`
    trainers = None                  # a trainers.Trainers: adds ``trainer`` to labels with a ``pid``
    takes_sys_root = False           # the constructor takes ``sys_root=``, the sysfs tree describing the machine

    def __init__(self, selection: Selection | None = None, features: KernelFeatures | None = None,
                 node: str = "") -> None:
        self.selection = selection or Selection()
        self.features = features or KernelFeatures()
        self.node = node or os.uname().nodename
        self.status = ProbeStatus()
        self.bpf = None

    # --- subclass hooks -------------------------------------------------
    def cflags(self) -> list[str]:
        """``-D`` flags that parameterise the C; the C reads them as macros."""
        return []

    def choose_attach_points(self) -> ProbeStatus:
        """Decide attach points from ``self.features`` following ``fallback_order``;
        return the status to report (ok/degraded/unsupported with the reason)."""
        raise NotImplementedError

    def unproduced(self) -> dict[str, str]:
        """After ``choose_attach_points``: the signals this probe will not emit
        with the points it chose, each with the reason (a degraded probe may
        still emit the others)."""
        return {}

    def attach(self) -> None:
        """Attach the compiled program (``self.bpf``) at the chosen points."""
        raise NotImplementedError

    def collect(self, now: float) -> list[tuple[str, dict, float]]:
        """Read and reset the maps; return (signal, labels, value) tuples."""
        raise NotImplementedError

    def update_selection(self, selection: Selection) -> None:
        """Apply a new selection through map updates."""
        self.selection = selection

    def capability(self) -> ProbeStatus:
        """What this probe could attach to here, without compiling: for listings.
        Deep probes override it to describe what an on-demand session can use."""
        why = self.features.missing_prerequisite()
        return ProbeStatus(UNSUPPORTED, why) if why else self.choose_attach_points()

    # --- shared behaviour -------------------------------------------------
    @property
    def source_path(self) -> Path:
        return HERE / f"{self.name}.bpf.c"

    def c_source(self) -> str:
        return self.source_path.read_text()

    def final_source(self) -> str:
        """The C handed to the compiler: the program with each ``#include "x.h"``
        of a header in this folder replaced by the header's text."""
        source, path = self.c_source(), self.source_path

        def inline(match: re.Match) -> str:
            header = HERE / match.group(1)
            if not header.is_file():
                return match.group(0)
            after = source.count("\n", 0, match.start()) + 2
            return f'#line 1 "{header}"\n{header.read_text()}#line {after} "{path}"'

        return LOCAL_INCLUDE.sub(inline, source)

    def compile(self):
        """A loaded ``bcc.BPF`` of ``final_source()`` with the cflags."""
        from bcc import BPF  # imported here: listing probes must not need bcc
        return BPF(text=self.final_source().encode(), cflags=self.cflags())

    def dump_bpf(self) -> str:
        """The final C as the compiler sees it: the cflags, then the source with
        its headers inlined."""
        flags = "\n".join(f"// cflag: {f}" for f in self.cflags())
        return f"// probe: {self.name}\n{flags}\n{self.final_source()}"

    def start(self) -> ProbeStatus:
        why = self.features.missing_prerequisite()
        if why:
            self.status = ProbeStatus(UNSUPPORTED, why)
            return self.status
        status = self.choose_attach_points()
        if status.state == UNSUPPORTED:
            self.status = status
            return status
        self.bpf = self.compile()
        self.attach()
        self.status = status
        return status

    def stop(self) -> None:
        if self.bpf is not None:
            self.bpf.cleanup()
            self.bpf = None
        if self.status.state != UNSUPPORTED:
            self.status = ProbeStatus(STOPPED, "", self.status.attach_points)

    def labels(self, **extra) -> dict:
        """``node``, ``job`` and ``extra`` as strings; with a ``pid`` and
        ``trainers``, also the pid's ``trainer`` when it is known."""
        base = {"node": self.node}
        if self.selection.job:
            base["job"] = self.selection.job
        if self.trainers is not None and "pid" in extra:
            trainer = self.trainers.of(int(extra["pid"]))
            if trainer is not None:
                base["trainer"] = str(trainer)
        base.update({k: str(v) for k, v in extra.items()})
        return base
