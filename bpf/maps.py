"""Helpers over the bcc tables the probe loaders share: writing a task selection
into the kernel's selection maps, reading and resetting aggregate maps, and
turning per-interval counts into running (monotonic) counters.

Selection map convention (declared in ``reflexarc_common.h`` for programs that
define ``WITH_SELECTION``)::

    BPF_ARRAY(sel_mode, u32, 1);                 // 0: every task; else SEL_* bits
    BPF_HASH(sel_pid, u32, u8, N);               // selected tgids
    BPF_HASH(sel_comm, struct comm_key, u8, N);  // names (16 bytes, NUL padded)
    BPF_HASH(sel_cgroup, u64, u8, N);            // cgroup v2 ids

A program tests only ``sel_pid`` per event (its hot paths see every syscall or
context switch on the node), plus ``sel_cgroup`` when ``SEL_CGROUPS`` is set,
and leaves names to ``sync_selection(..., procs)``,
which resolves them to processes from /proc, and to a ``task:task_rename``
program (``on_rename``) that adds the tgid of a main thread naming itself
(prctl, exec) as a selected comm. That way a comm selects the processes of that
name, which is how DataLoader workers (every thread ``pt_data_worker``) are
found.

Example::

    sync_selection(probe.bpf, Selection(comms=("pt_data_worker",)), ProcFS())
    for key, value in drain(probe.bpf[b"reads"]):
        totals.add(key, value)
    for pid, hist in drain_hists(probe.bpf[b"lat_hist"]).items():
        print(pid, quantiles(hist))      # hist: {slot: count}, see loghist.py

Overhead: a /proc scan (one comm file per process) when the selection names
comms, and one map update per added/removed entry; ``drain`` is one batched
lookup-and-delete syscall per map per interval (``drain_hists`` too).
"""
from __future__ import annotations

import ctypes as ct
from collections import defaultdict
from collections.abc import Hashable, Iterable

from reflexarc.core.procfs import ProcFS, comm_bytes

from .probe import Selection

SEL_FILTER = 1    # sel_mode bits (as in reflexarc_common.h): a selection is in force
SEL_CGROUPS = 2   # ... and it names cgroups (the hot path reads the cgroup id)


def selected_pids(selection: Selection, procs: ProcFS | None) -> set[int]:
    """The selection's pids plus, given a proc scanner, every process named as
    one of its comms."""
    pids = {int(p) for p in selection.pids}
    if procs is not None:
        pids |= set(procs.find(selection.comms))
    return pids


def sync_selection(bpf, selection: Selection, procs: ProcFS | None = None) -> set[int]:
    """Make the selection maps of ``bpf`` equal ``selection``; returns the pids
    written to ``sel_pid``. With ``procs`` the comms are resolved to processes
    under it (for programs that test only ``sel_pid`` per event); without, the
    program is expected to test ``sel_comm`` itself. Entries are added before
    stale ones are removed, so a task that stays selected never drops out; pids
    the kernel added by name since the last sync and that still match are
    re-found by the scan."""
    pids = selected_pids(selection, procs)
    _sync_keys(bpf[b"sel_comm"], {comm_bytes(c) for c in selection.comms})
    _sync_keys(bpf[b"sel_cgroup"], {int(c) for c in selection.cgroup_ids})
    _sync_keys(bpf[b"sel_pid"], pids)
    mode = 0
    if selection.pids or selection.comms or selection.cgroup_ids:
        mode = SEL_FILTER | (SEL_CGROUPS if selection.cgroup_ids else 0)
    bpf[b"sel_mode"][ct.c_int(0)] = ct.c_uint32(mode)
    return pids


def _key_value(key):
    return bytes(key.comm) if hasattr(key, "comm") else key.value


def _sync_keys(table, wanted: set) -> None:
    present = {_key_value(k): k for k in table.keys()}
    for value in wanted - present.keys():
        key = table.Key()
        if isinstance(value, bytes):
            key.comm = value
        else:
            key.value = value
        table[key] = table.Leaf(1)
    for value in present.keys() - wanted:
        del table[present[value]]


def drain(table) -> list[tuple]:
    """Read and delete every element of a hash map. Each element is read and
    removed under its bucket lock, so an increment lands in this interval or the
    next, never in neither. Kernels without batch map operations (< 5.6) fall back
    to a walk that deletes each key after reading it."""
    try:
        items = list(table.items_lookup_and_delete_batch())
    except Exception:  # bcc raises a bare Exception when the syscall is refused
        items = list(table.items())
        for key, _ in items:
            try:
                del table[key]
            except KeyError:
                pass
    return [(_plain(k), _plain(v)) for k, v in items]


def drain_hists(table) -> dict[int, dict[int, int]]:
    """Read and delete a map keyed by ``struct hist_key`` (reflexarc_common.h):
    one histogram ``{slot: count}`` per id."""
    hists: dict[int, dict[int, int]] = defaultdict(dict)
    for key, n in drain(table):
        hists[key.id][key.slot] = n
    return dict(hists)


def _plain(obj):
    """ctypes scalars as Python numbers (batch reads already give numbers, walks
    give ``c_uint``/``c_ulong``); structures unchanged."""
    return obj.value if isinstance(obj, ct._SimpleCData) else obj


class RunningTotals:
    """Monotonic counters built from per-interval deltas, keyed by any hashable
    (a pid, a device, a (pid, kind) pair)."""

    def __init__(self) -> None:
        self._totals: dict[Hashable, float] = {}

    def add(self, key: Hashable, delta: float) -> None:
        self._totals[key] = self._totals.get(key, 0) + delta

    def ensure(self, key: Hashable) -> None:
        """Start ``key`` at zero so it is reported before its first event."""
        self._totals.setdefault(key, 0)

    def items(self) -> list[tuple[Hashable, float]]:
        return sorted(self._totals.items(), key=lambda kv: str(kv[0]))

    def get(self, key: Hashable) -> float:
        return self._totals.get(key, 0)

    def forget(self, keys: Iterable[Hashable]) -> None:
        for key in keys:
            self._totals.pop(key, None)

    def keys(self) -> set:
        return set(self._totals)
