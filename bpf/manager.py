"""ProbeManager: starts the light probe tier, keeps the task selection current,
collects every probe once per interval, and switches deep probes on and off.

A probe that fails to compile, attach or collect is marked unsupported (with
the reason) and the others keep running. The selection's thread names are
resolved to processes under /proc at start and on ``refresh_selection``; every
probe gets the resolved pids as map updates (no recompiles), so a DataLoader
that spawns new workers is followed. Deep probes (``tier = "deep"``, e.g.
``RdmaQp``) run per requesting key with a time-to-live; the constructor of a
deep probe class takes the session's ``params`` as keyword arguments. A probe
with ``takes_sys_root`` (``sched_numa``: the NUMA topology) gets ``sys_root``,
the sysfs tree describing the machine (``/sys``, or a fixture tree).

Exits: each collect first takes the processes that exited since the last one
from the probes that see exits (``drain_exits``: ``proc_exit``), then reads
every probe, then has the probes that keep per-process state forget those
processes (``forget_exited``), and leaves them in ``exited``. Taken first,
an exit precedes the read of the maps holding the process's last counts, so
that collect carries them and no later one reports the process again (a
source hands ``exited`` to the bus, which drops the processes' series).

Example::

    mgr = ProbeManager(Selection(comms=("pt_data_worker",), job="llama"), sys_root="/sys")
    mgr.start()                                   # {"dataloader_io": ok, ...}
    for batch in mgr.run(should_stop=lambda: False):
        publish(batch)                            # [(signal, labels, value), ...]
        mgr.events()                              # [{"probe": "sched_numa", "kind": ...}]
        mgr.exited                                # frozenset({4250, 4251}): exits this collect saw
    mgr.enable_deep("policy/rdma-slow", "rdma_qp", ttl=60, params={"device": "mlx5_0"})

    python -m reflexarc.bpf.manager --list        # probes, tiers, attach points
    python -m reflexarc.bpf.manager --dump-bpf    # the C each probe compiles
    python -m reflexarc.bpf.manager --watch 10 --comm pt_data_worker

Overhead: start compiles each probe once (~0.8 s and ~130 MB peak RSS per
LLVM run); collect is a few batched map reads per probe, plus a set
operation per exited process for each probe that forgets; a selection
refresh reads one comm file per thread on the node.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from reflexarc.core.cgroups import cgroup2_id
from reflexarc.core.jobs import Discovery
from reflexarc.core.procfs import ProcFS

from . import catalog
from .probe import DEGRADED, OK, STOPPED, UNSUPPORTED, KernelFeatures, Probe, ProbeStatus, Selection

Sample = tuple[str, dict, float]
RUNNING = (OK, DEGRADED)


@dataclass
class DeepSession:
    key: str
    probe_name: str
    params: dict
    probe: Probe
    expires: float


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def start_probe(probe: Probe) -> ProbeStatus:
    """Start one probe; any failure leaves it stopped and unsupported with the reason."""
    try:
        status = probe.start()
    except Exception as exc:  # compile errors, attach errors, verifier rejections
        try:
            probe.stop()
        except Exception:
            pass
        status = ProbeStatus(UNSUPPORTED, _describe(exc), probe.status.attach_points)
        probe.status = status
    return status


class ProbeManager:
    def __init__(self, selection: Selection, interval: float = 1.0,
                 features: KernelFeatures | None = None, node: str = "",
                 probes: Sequence[str | type[Probe] | Probe] | None = None, *,
                 proc_root: str = "/proc", sys_root: str = "/sys",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.base_selection = selection
        self.selection = selection
        self.interval = interval
        self.features = features or KernelFeatures()
        self.node = node
        self.procfs = ProcFS(proc_root)
        self.discovery = Discovery(proc_root, fallback=selection.job)
        self.jobs: list = []                     # the jobs found at the last refresh (core.jobs.Job)
        self.skipped: dict[str, int] = {}        # processes discovery skipped so far, by reason
        self.sys_root = sys_root
        self.clock = clock
        self.armed_after: float | None = None   # seconds from start() to every probe armed
        self.exited: frozenset[int] = frozenset()   # processes whose exit the last collect saw
        self._probes: dict[str, Probe] = {}
        self._status: dict[str, ProbeStatus] = {}
        self._deep: dict[str, DeepSession] = {}
        for spec in (catalog.names(catalog.LIGHT) if probes is None else probes):
            self._add(spec)

    def _add(self, spec: str | type[Probe] | Probe) -> None:
        if isinstance(spec, Probe):
            self._probes[spec.name] = spec
            self._status[spec.name] = spec.status
            return
        if isinstance(spec, str):
            try:
                spec = catalog.probe_class(spec)
            except catalog.ProbeNotAvailable as exc:
                name = str(spec)
                self._status[name] = ProbeStatus(UNSUPPORTED, str(exc))
                return
        probe = self._new(spec)
        self._probes[probe.name] = probe
        self._status[probe.name] = probe.status

    def _new(self, cls: type[Probe], **params) -> Probe:
        if cls.takes_sys_root:
            params["sys_root"] = self.sys_root
        return cls(self.selection, self.features, self.node, **params)

    @property
    def probes(self) -> dict[str, Probe]:
        return dict(self._probes)

    def probe(self, name: str) -> Probe | None:
        """The light probe ``name``, or None when it is not loaded (unknown or
        not installed: its status says why)."""
        return self._probes.get(name)

    def _running(self) -> list[Probe]:
        light = [p for p in self._probes.values() if p.status.state in RUNNING]
        return light + [s.probe for s in self._deep.values()]

    # --- lifecycle ------------------------------------------------------
    def start(self) -> dict[str, ProbeStatus]:
        """Resolve the selection, then compile and attach every light probe not
        already running."""
        began = time.monotonic()
        self.discovery.refresh()
        self.selection = self._resolve()
        for name, probe in self._probes.items():
            if probe.status.state in RUNNING:
                continue
            probe.selection = self.selection
            self._status[name] = start_probe(probe)
        self.armed_after = time.monotonic() - began
        return self.statuses()

    def stop(self) -> None:
        for key in list(self._deep):
            self.disable_deep(key)
        for name, probe in self._probes.items():
            probe.stop()
            self._status[name] = probe.status

    def statuses(self) -> dict[str, ProbeStatus]:
        """Light probes by name; deep sessions (running, or stopped by a failed
        collect) as ``probe[key]``."""
        out = dict(self._status)
        for key, s in self._deep.items():
            out[f"{s.probe_name}[{key}]"] = s.probe.status
        return out

    # --- signals --------------------------------------------------------
    def collect(self, now: float) -> list[Sample]:
        """One interval of every running probe. A probe whose collect raises is
        stopped and marked unsupported; the others are unaffected. Sets
        ``exited`` to the processes that exited since the last collect, which
        the probes forget once they reported their last counts here."""
        exited = self._drain_exits()
        out = self._from_running("collect", now)
        for key, s in list(self._deep.items()):
            try:
                out.extend(s.probe.collect(now))
            except Exception as exc:
                self.disable_deep(key)
                self._status[f"{s.probe_name}[{key}]"] = ProbeStatus(
                    UNSUPPORTED, f"collect failed: {_describe(exc)}", s.probe.status.attach_points)
        for _, labels, _ in out:
            self.label_job(labels)
        if exited:
            for probe in self._running():
                forget_exited = getattr(probe, "forget_exited", None)
                if forget_exited is not None:
                    forget_exited(exited)
        self.exited = exited
        return out

    def collect_arrived(self, now: float) -> list[Sample]:
        """Between two collects: what the running probes that give arrivals
        (``collect_arrived``: the step signals) took since, labelled like
        ``collect``'s samples. A probe whose call raises is failed the same way."""
        out = self._from_running("collect_arrived", now)
        for _, labels, _ in out:
            self.label_job(labels)
        return out

    def _from_running(self, method: str, now: float) -> list[Sample]:
        """``method(now)`` of every running light probe that has it; one that
        raises is stopped and marked unsupported, the others are unaffected."""
        out: list[Sample] = []
        for name, probe in list(self._probes.items()):
            call = getattr(probe, method, None)
            if call is None or probe.status.state not in RUNNING:
                continue
            try:
                out.extend(call(now))
            except Exception as exc:
                self._fail(name, probe, exc)
        return out

    def _drain_exits(self) -> frozenset[int]:
        """The processes that exited since the last call, from every running
        probe with ``drain_exits``; one that raises is failed like a collect."""
        exited: set[int] = set()
        for name, probe in list(self._probes.items()):
            drain_exits = getattr(probe, "drain_exits", None)
            if drain_exits is None or probe.status.state not in RUNNING:
                continue
            try:
                exited |= drain_exits()
            except Exception as exc:
                self._fail(name, probe, exc)
        return frozenset(exited)

    def _fail(self, name: str, probe: Probe, exc: BaseException) -> None:
        probe.stop()
        probe.status = self._status[name] = ProbeStatus(
            UNSUPPORTED, f"collect failed: {_describe(exc)}", probe.status.attach_points)

    def label_job(self, labels: dict) -> None:
        """Give a sample about a process (``trainer`` or ``pid``) the job, rank and
        pod discovery found for its training process; ``--job`` only names the
        ones it found none for."""
        pid = labels.get("trainer") or labels.get("pid")
        identity = self.discovery.identity(int(pid)) if pid and str(pid).isdigit() else None
        if identity is not None:
            labels.update(identity.labels())

    def events(self) -> list[dict]:
        """The discrete events (rare, e.g. a cross-NUMA migration) that running
        probes with ``drain_events`` polled since the last call, each tagged
        ``"probe": name``, oldest first; they are handed out once."""
        out: list[dict] = []
        for probe in self._running():
            drain_events = getattr(probe, "drain_events", None)
            if drain_events is not None:
                out.extend({**event, "probe": probe.name} for event in drain_events())
        return sorted(out, key=lambda event: event.get("ts_ns", 0))

    def run(self, should_stop: Callable[[], bool], refresh_every: float = 5.0) -> Iterator[list[Sample]]:
        """Yield one collected batch per interval until ``should_stop()``; refresh
        the selection every ``refresh_every`` seconds and expire deep sessions."""
        next_tick = time.monotonic() + self.interval
        next_refresh = time.monotonic() + refresh_every
        while not should_stop():
            time.sleep(max(0.0, next_tick - time.monotonic()))
            next_tick += self.interval
            now = self.clock()
            if time.monotonic() >= next_refresh:
                self.refresh_selection()
                next_refresh += refresh_every
            self.expire_deep(now)
            yield self.collect(now)

    # --- selection ------------------------------------------------------
    def _resolve(self) -> Selection:
        base = self.base_selection
        found = set(self.procfs.find(base.comms))
        jobs = self.jobs = self.discovery.jobs()
        self.skipped = dict(self.discovery.skipped)
        return replace(base, pids=tuple(sorted(set(int(p) for p in base.pids) | found)),
                       trainers=tuple(sorted(t.pid for job in jobs for t in job.trainers)),
                       job_cgroups=self._job_cgroups(jobs))

    def _job_cgroups(self, jobs) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """Each found job's cgroup v2 ids: those its training processes sit in, but
        not the root, and none that two jobs share (whose traffic would be whose?)."""
        owners: dict[int, set[str]] = {}
        for job in jobs:
            if not job.name:
                continue
            for t in job.trainers:
                path = self.procfs.cgroup2(t.pid)
                ident = cgroup2_id(path, self.procfs.root) if path not in (None, "", "/") else None
                if ident is not None:
                    owners.setdefault(ident, set()).add(job.name)
        by_job: dict[str, set[int]] = {}
        for ident, names in owners.items():
            if len(names) == 1:
                by_job.setdefault(next(iter(names)), set()).add(ident)
        return tuple((name, tuple(sorted(ids))) for name, ids in sorted(by_job.items()))

    def refresh_selection(self) -> bool:
        """Rescan /proc for processes named as the selection's comms;
        when the set changed (new or exited workers) push it to every running
        probe as map updates. Returns whether it changed."""
        self.discovery.refresh()
        resolved = self._resolve()
        if resolved == self.selection:
            return False
        self.selection = resolved
        for probe in self._probes.values():
            probe.selection = resolved
        for probe in self._running():
            probe.update_selection(resolved)
        return True

    # --- deep tier ------------------------------------------------------
    def enable_deep(self, key: str, probe_name: str, ttl: float, params: dict | None = None) -> ProbeStatus:
        """Run deep probe ``probe_name`` for ``key`` until ``ttl`` seconds from now.
        Asking again with the same probe and params extends the deadline without
        recompiling; different params restart the session."""
        params = dict(params or {})
        expires = self.clock() + ttl
        current = self._deep.get(key)
        if current and current.probe_name == probe_name and current.params == params:
            current.expires = expires
            return current.probe.status
        if current:
            self.disable_deep(key)
        try:
            cls = catalog.probe_class(probe_name)
        except catalog.ProbeNotAvailable as exc:
            return ProbeStatus(UNSUPPORTED, str(exc))
        if cls.tier != catalog.DEEP:
            return ProbeStatus(UNSUPPORTED, f"'{probe_name}' is a {cls.tier} probe, always on")
        try:
            probe = self._new(cls, **params)
        except (TypeError, ValueError) as exc:
            return ProbeStatus(UNSUPPORTED, f"bad params for {probe_name}: {exc}")
        status = start_probe(probe)
        if status.state in RUNNING:
            self._deep[key] = DeepSession(key, probe_name, params, probe, expires)
            self._status.pop(f"{probe_name}[{key}]", None)   # an earlier failure of this session
        return status

    def disable_deep(self, key: str) -> bool:
        """Stop the deep session of ``key``; False when there was none."""
        session = self._deep.pop(key, None)
        if session is None:
            return False
        session.probe.stop()
        return True

    def expire_deep(self, now: float) -> list[str]:
        """Stop the sessions whose deadline passed; returns their keys."""
        expired = [k for k, s in self._deep.items() if s.expires <= now]
        for key in expired:
            self.disable_deep(key)
        return expired

    def deep_sessions(self) -> dict[str, DeepSession]:
        return dict(self._deep)

    def active_deep(self) -> dict[str, dict]:
        """Running deep sessions as plain data: key -> {"probe", "params",
        "expires_at", "status", "events_per_s"} (the probe's own measure of its
        event rate when it keeps one, else None)."""
        return {key: {"probe": s.probe_name, "params": dict(s.params), "expires_at": s.expires,
                      "status": str(s.probe.status), "events_per_s": getattr(s.probe, "events_per_s", None)}
                for key, s in self._deep.items()}

    # --- introspection --------------------------------------------------
    def dump_bpf(self) -> str:
        """The C of every light probe as its compiler sees it. Probes not started
        choose their attach points first, since those set the cflags."""
        parts = []
        for probe in self._probes.values():
            if probe.status.state == STOPPED:
                probe.choose_attach_points()
            parts.append(probe.dump_bpf())
        return "\n".join(parts)


def _list(mgr: ProbeManager) -> str:
    lines = []
    for name in catalog.names():
        tier = catalog.entry(name).tier
        try:
            cls = catalog.probe_class(name)
        except catalog.ProbeNotAvailable as exc:
            lines.append(f"{name:<14} {tier:<5} unavailable: {exc}")
            continue
        probe = mgr.probes.get(name) or mgr._new(cls)
        status = probe.capability()
        lines.append(f"{name:<14} {tier:<5} {status}")
        lines.append(f"{'':<20} signals: {', '.join(s.name for s in cls.signals)}")
        for i, step in enumerate(cls.fallback_order, 1):
            lines.append(f"{'':<20} fallback {i}: {step}")
        for point in status.attach_points:
            lines.append(f"{'':<20} attach: {point}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reflexarc.bpf.manager",
                                 description="List, dump or run reflexarc's light probe tier.")
    ap.add_argument("--list", action="store_true", help="probes, tiers, fallback order, attach points")
    ap.add_argument("--dump-bpf", action="store_true", help="print the C each light probe compiles")
    ap.add_argument("--watch", type=float, metavar="SECONDS",
                    help="start the light tier and print JSON lines for SECONDS (0: until SIGTERM/SIGINT)")
    ap.add_argument("--comm", action="append", default=[], help="select threads by name (repeatable)")
    ap.add_argument("--pid", action="append", type=int, default=[], help="select a process (repeatable)")
    ap.add_argument("--job", default="", help="job label for every signal")
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--probe", action="append", default=[], choices=catalog.names(catalog.LIGHT),
                    help="run only this light probe (repeatable; default: every light probe)")
    args = ap.parse_args(argv)

    selection = Selection(comms=tuple(args.comm or ["pt_data_worker"]), pids=tuple(args.pid), job=args.job)
    mgr = ProbeManager(selection, interval=args.interval, probes=args.probe or None)
    if args.list:
        print(_list(mgr))
    if args.dump_bpf:
        print(mgr.dump_bpf())
    if args.watch is None:
        if not (args.list or args.dump_bpf):
            ap.print_usage()
            return 2
        return 0

    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    statuses = mgr.start()
    print(json.dumps({"armed_s": round(mgr.armed_after, 3),
                      "status": {k: str(v) for k, v in statuses.items()}}), flush=True)
    deadline = time.monotonic() + args.watch if args.watch > 0 else float("inf")
    try:
        for batch in mgr.run(lambda: bool(stopping) or time.monotonic() >= deadline):
            print(json.dumps({"ts": round(time.time(), 3),
                              "samples": [[n, labels, v] for n, labels, v in batch]}), flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        mgr.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
