"""Loader of ``proc_exit.bpf.c``: which processes exited, so that their series
leave the signal bus when they exit rather than after its retention.

A DataLoader without ``persistent_workers`` replaces its workers every epoch;
ten training processes with five workers each on an epoch a second start 50
processes a second, each with its own per-worker series. The kernel reports
each process exit (``sched:sched_process_exit``, once per process) through a
ring buffer, waking no one; ``drain_exits`` reads it and hands the tgids to
the probe manager (``ProbeManager.collect``), which has the probes forget
them and leaves them for the source that publishes to the bus
(``controller/sources/readers.py``), which drops their series there.

Why a tracepoint and not /proc: the loaders already notice processes that
vanished, at collect, by a ``stat`` of each one that was idle in the interval,
but a pid that another process took meanwhile looks alive, and every known
process costs a ``stat`` every interval whether it exited or not. The
tracepoint costs nothing until a process exits, misses none that exit between
two collects, and says when: before the collect that reads its last counts.
Exits are not filtered in the kernel: the processes with series are the
selected workers, their training processes (``batch_wait``) and any process
that submits to a GPU (``gpu_submit``), which no one selection map holds; a
look-up per exit on the node costs less than keeping one.

Signals: ``probe_events_lost_total{probe="proc_exit"}``, the exits the full
ring buffer could not take (their processes' series leave the bus only when
silent, as without this probe).

Fallback order: sched_process_exit with its ``group_dead`` field (ok: the
process's last thread); without ``group_dead`` (older kernels), the main
thread's exit stands for the process's (ok: a main thread that ends alone,
with ``pthread_exit``, passes for its process's exit); no sched_process_exit
(unsupported).

Example::

    probe = ProcExit()
    probe.start()
    ...
    probe.drain_exits()              # {4250, 4251}: exited since the last call
    probe.collect(now=time.time())   # [("probe_events_lost_total", {"probe": "proc_exit", ...}, 0.0)]

Overhead: one tracepoint hit per thread exit on the node (a comparison; one
ring-buffer reserve and submit, 16 bytes, per process): 0.5-0.7 us a process
exit on the 2-core test VM (nested virtualisation, ``kernel.bpf_stats_enabled``,
medians of five rounds of 500), against the fork and exit themselves
(~1 ms there); 16 pages hold ~4 000 exits between two reads. Collect: one
read of the ring buffer (a ctypes call per exit) and one per-CPU array read.
Start: one LLVM compile (~0.5 s here, the smallest program of the tier).
"""
from __future__ import annotations

import ctypes as ct

from .dataloader_io import tracepoint_fields
from .probe import EVENTS_LOST, OK, UNSUPPORTED, KernelFeatures, Probe, ProbeStatus, Selection

RING_PAGES = 16


class ProcExit(Probe):
    name = "proc_exit"
    tier = "light"
    signals = (EVENTS_LOST,)
    fallback_order = (
        "sched:sched_process_exit with group_dead: the process's last thread",
        "sched:sched_process_exit without group_dead (older kernels): the main thread's exit",
    )

    def __init__(self, selection: Selection | None = None, features: KernelFeatures | None = None,
                 node: str = "", ring_pages: int = RING_PAGES) -> None:
        super().__init__(selection, features, node)
        if ring_pages < 1 or ring_pages & (ring_pages - 1):
            raise ValueError(f"ring_pages must be a power of two, not {ring_pages}")
        self.ring_pages = ring_pages
        self._group_dead = False
        self._exited: set[int] = set()

    def cflags(self) -> list[str]:
        return [f"-DRING_PAGES={self.ring_pages}"] + (["-DGROUP_DEAD"] if self._group_dead else [])

    def choose_attach_points(self) -> ProbeStatus:
        if not self.features.has_tracepoint("sched", "sched_process_exit"):
            return ProbeStatus(UNSUPPORTED, "no sched:sched_process_exit tracepoint: the series of "
                                            "exited processes leave the bus only when silent")
        self._group_dead = "group_dead" in tracepoint_fields(self.features, "sched", "sched_process_exit")
        return ProbeStatus(OK, "", ["tracepoint:sched:sched_process_exit"])

    def attach(self) -> None:
        self._exited = set()
        self.bpf[b"exits"].open_ring_buffer(self._on_exit)
        self.bpf.attach_tracepoint(tp=b"sched:sched_process_exit", fn_name=b"on_exit")

    def _on_exit(self, _ctx, data, _size) -> None:
        self._exited.add(ct.cast(data, ct.POINTER(ct.c_uint32)).contents.value)

    def drain_exits(self) -> set[int]:
        """The tgids of the processes that exited since the last call."""
        if self.bpf is None:
            return set()
        self.bpf.ring_buffer_consume()
        exited, self._exited = self._exited, set()
        return exited

    def collect(self, now: float) -> list[tuple[str, dict, float]]:
        if self.bpf is None:
            return []
        lost = self.bpf[b"exits_lost"].sum(0).value
        # One count for the node's probe, not a job's: no job label.
        return [("probe_events_lost_total", {"node": self.node, "probe": self.name}, float(lost))]
