"""Signal sources for live runs: each ``poll(now)`` returns new samples.

- ``ProbeSource``: the bcc probes (``reflexarc.bpf.manager.ProbeManager``); also
  refreshes the probes' target selection, expires deep probes at their TTL
  and, given the ``bus``, drops the series of the processes the probes saw
  exit (``SignalBus.drop_exited``). Given a ``DeviceLocality`` poller
  (``bpf/device_locality.py``), it also reports ``device_numa_local_ratio``
  of the training processes discovery found.
- ``HookSource``: step signals (``step_time_ms``, ``dataloader_batch_wait_ms``)
  that training scripts report through ``reflexarc.actuators.hooks``.
- ``NvmlSource``: ``gpu_utilization_pct{gpu}`` of every NVIDIA GPU through NVML
  (``nvidia-ml-py``), where the node has GPUs.
- ``ReplaySource``: a JSONL file of ``{"t": seconds-from-start, "name", "labels", "value"}``
  replayed against wall time (recorded incidents, tests, demos), in file
  order, at most ``intake.BATCH_LIMIT`` records a poll (a storm falls behind,
  memory does not grow with the file).

Example::

    src = ReplaySource("incident.jsonl", start=time.time())
    for name, labels, value in src.poll(time.time()):
        bus.publish(name, labels, value, now)

Overhead: ProbeSource reads the probes' maps once per interval and lists the
hook directory every 5 s, and hands the bus the exits of each interval (a
look-up per exited process on the node); its locality poller reads /proc and
sysfs every 30 s and hands out what it read in between; HookSource makes
one Unix-socket request per training process per interval; NvmlSource one
utilisation query per GPU per interval (~50 us each); ReplaySource checks
every record of its file at start (~3 us each), then reads each again as it
comes due, holding one record ahead.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from reflexarc.bpf.device_locality import DeviceLocality
from reflexarc.core.jobs import OWN_EVIDENCE

from ..signals.catalogue import CATALOGUE, UnknownSignal
from .intake import BATCH_LIMIT

log = logging.getLogger("reflexarc.sources")


# signals both the probes (from an unmodified job) and a training script's hooks produce
HOOK_STEP_SIGNALS = ("step_time_ms", "dataloader_batch_wait_ms")


class SourceError(ValueError):
    pass


class ReplaySource:
    """Records come due at ``start + t``, in file order (one whose ``t`` goes
    back in time is due at once); each sample carries ``start + t``, the time it
    claims, for the intake to check. One whose ``t`` no replay could reach (not
    finite, or beyond ``MAX_SPAN``) is handed over at once, for the intake to
    reject. Every record is checked when the source opens, so a malformed file
    is one error before the controller starts; lines appended later are not
    replayed, and a file rewritten meanwhile ends the replay with a warning."""

    name = "replay"
    MAX_SPAN = 30 * 86400.0      # seconds: no recorded incident runs longer

    def __init__(self, path: str | Path, start: float, limit: int = BATCH_LIMIT) -> None:
        self.path = Path(path)
        self.start = start
        self.limit = limit
        try:
            self._file = self.path.open("rb")
        except OSError as exc:
            raise SourceError(f"{path}: {exc.strerror or exc}") from None
        try:
            for n, line in enumerate(self._file, 1):
                if line.strip():
                    self._parse(line, n)
        except SourceError:
            self._file.close()
            raise
        self._end = self._file.tell()        # lines a recorder appends later were not checked
        self._file.seek(0)
        self._pos = self._line = 0
        self._next: tuple[float, str, dict, float] | None = self._read()

    def _parse(self, line: bytes, n: int) -> tuple[float, str, dict, float]:
        try:
            rec = json.loads(line)
            name = rec["name"]
            if name not in CATALOGUE:
                raise UnknownSignal(name)
            return float(rec["t"]), name, dict(rec.get("labels", {})), float(rec["value"])
        except (ValueError, KeyError, TypeError, UnknownSignal) as exc:
            raise SourceError(f"{self.path}:{n}:1: error: bad replay record: {exc}") from None

    def _read(self) -> tuple[float, str, dict, float] | None:
        """The next record of the checked part of the file, None at its end."""
        while self._pos < self._end:
            line = self._file.readline()
            if not line:                     # cut short since it was checked
                return None
            self._pos += len(line)
            self._line += 1
            if line.strip():
                try:
                    return self._parse(line, self._line)
                except SourceError as exc:   # rewritten since it was checked
                    log.warning("%s; the replay ends there", exc)
                    return None
        return None

    def poll(self, now: float) -> list[tuple[str, dict, float, float]]:
        out = []
        elapsed = now - self.start
        while self._next is not None and len(out) < self.limit:
            t, name, labels, value = self._next
            if t > elapsed and t <= self.MAX_SPAN:      # not due yet (a NaN t is due at once)
                break
            out.append((name, labels, value, self.start + t))
            self._next = self._read()
        return out

    def close(self) -> None:
        self._file.close()


class NvmlSource:
    """GPU utilisation from NVML. ``nvml`` is the ``pynvml`` module (injectable:
    no GPU exists on the test machines, so tests pass a stand-in that answers the
    same calls)."""

    name = "nvml"

    def __init__(self, nvml=None, job: str | None = None) -> None:
        if nvml is None:
            import pynvml as nvml
        self.nvml, self.job = nvml, job
        try:
            nvml.nvmlInit()
            self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        except nvml.NVMLError as exc:
            raise SourceError(f"NVML: {exc}") from None

    def poll(self, now: float) -> list[tuple[str, dict, float]]:
        out = []
        for index, handle in enumerate(self.handles):
            try:
                rates = self.nvml.nvmlDeviceGetUtilizationRates(handle)
            except self.nvml.NVMLError:     # a GPU fallen off the bus: no sample, the rule goes stale
                continue
            labels = {"gpu": str(index), **({"job": self.job} if self.job else {})}
            out.append(("gpu_utilization_pct", labels, float(rates.gpu)))
        return out

    def close(self) -> None:
        self.nvml.nvmlShutdown()


class ProbeSource:
    """The probes' samples; those of a training process that serves framework
    hooks also carry its ``rank`` (from the hook socket's name), and the
    step signals the probes measure for it (``HOOK_STEP_SIGNALS``) are dropped:
    where the script reports them itself, its own value wins. A training
    process started by no launcher (discovery names its job after it:
    ``train.py-4242``) that serves hooks takes the job its script names, so
    the probes' signals and the hooks' meet in one target.

    With the ``bus`` the samples go to, each poll first drops from it the
    series of the processes whose exit the previous poll's collect saw
    (``ProbeManager.exited``): that collect carried their last samples, stamped
    with its time, and the probes report nothing of them afterwards; a process
    that reused a pid since is fed later and keeps its series. So a worker's
    series leave the bus one interval after it exits, not after the
    retention.

    With ``locality``, each poll adds the device locality of the training
    processes the manager's discovery found (``Selection.trainers``), less
    those whose exit the probes saw since the last refresh, each labelled with
    its job like the probes' samples (``ProbeManager.label_job``)."""

    name = "probes"

    def __init__(self, manager, refresh_every: float = 5.0, hook_dir: str | None = None, bus=None,
                 locality: DeviceLocality | None = None) -> None:
        self.manager = manager
        self.refresh_every = refresh_every   # /proc rescans; renames are caught in the kernel meanwhile
        self.hook_dir = hook_dir
        self.bus = bus
        self.locality = locality
        self._gone: set[int] = set()         # training processes seen to exit since the last refresh
        self._served: dict[int, tuple[str, str]] = {}   # training process pid -> (rank, job), from its hooks
        self._refreshed = float("-inf")
        self._exited: tuple[frozenset[int], float] = (frozenset(), 0.0)   # pids, time of the poll that saw them

    def poll(self, now: float) -> list[tuple[str, dict, float]]:
        if self.bus is not None and self._exited[0]:
            self.bus.drop_exited(*self._exited)
        if now - self._refreshed >= self.refresh_every:
            self.manager.refresh_selection()
            self._gone.clear()
            if self.hook_dir:
                from reflexarc.actuators.framework_hook import served_by_pid
                self._served = served_by_pid(self.hook_dir)
            self._refreshed = now
        self.manager.expire_deep(now)
        samples = self.manager.collect(now)
        if self.bus is not None:
            self._exited = (self.manager.exited, now)
        if self.locality is not None:
            samples = samples + self._locality(now)
        return self._with_hooks(samples)

    def poll_arrived(self, now: float) -> list[tuple[str, dict, float]]:
        """Between two polls: the step signals the probes took since
        (``ProbeManager.collect_arrived``), treated as ``poll`` treats them."""
        return self._with_hooks(self.manager.collect_arrived(now))

    def _with_hooks(self, samples: list[tuple[str, dict, float]]) -> list[tuple[str, dict, float]]:
        """``samples`` less the step signals of the processes whose scripts
        report them through hooks, the others of those processes with the
        rank (and the job, where discovery named none) their hooks give."""
        if not self._served:
            return samples
        kept = []
        for sample in samples:               # each sample has its own labels dict
            name, labels, _ = sample
            trainer = labels.get("trainer")
            served = self._served.get(int(trainer)) if trainer else None
            if served is not None and name in HOOK_STEP_SIGNALS:
                continue                     # the script reports it itself: its value wins
            if served is not None:
                if "rank" not in labels:     # a rank discovery found wins
                    labels["rank"] = served[0]
                if self._own_job(int(trainer)):
                    labels["job"] = served[1]
            kept.append(sample)
        return kept

    def _locality(self, now: float) -> list[tuple[str, dict, float]]:
        """The locality samples of the training processes discovery found that
        the probes have not seen exit, labelled with their job."""
        self._gone |= self.manager.exited
        pids = [pid for pid in self.manager.selection.trainers if pid not in self._gone]
        samples = self.locality.collect(pids, now)
        for _, labels, _ in samples:
            self.manager.label_job(labels)
        return samples

    def _own_job(self, pid: int) -> bool:
        """Discovery named this training process's job after it (no launcher, pod
        or Slurm job said which)."""
        discovery = getattr(self.manager, "discovery", None)
        identity = discovery.identity(pid) if discovery is not None else None
        return identity is None or identity.evidence == (OWN_EVIDENCE,)

    def close(self) -> None:
        self.manager.stop()


class HookSource:
    """Step signals from the training scripts' hook sockets, only from those the
    hook channel trusts (``reflexarc.actuators.framework_hook``: the serving
    process is the one the socket claims, in a directory made for its user, with
    a reply that fits the schema) whose process is inside the selector (pids,
    cgroup) of every one of ``policies`` that reads its job. Everything else is
    ignored, logged once per socket and reason, and counted in
    ``reflexarc_hook_rejected_total{reason}`` on ``registry`` (the controller's)."""

    name = "hooks"

    def __init__(self, hook_dir: str, job: str | None = None, policies=(), registry=None,
                 proc_root: str = "/proc") -> None:
        from prometheus_client import CollectorRegistry, Counter

        from reflexarc.core.procfs import ProcFS

        from ..engine.bus import Matcher
        self.hook_dir = hook_dir
        self.job = job or None
        self.procfs = ProcFS(proc_root)
        self._scopes = [(p.name, Matcher(p.selector.match), tuple(p.selector.pids), p.selector.cgroup)
                        for p in policies if p.selector.pids or p.selector.cgroup]
        self.rejected = Counter("reflexarc_hook_rejected_total",
                                "Hook sockets, directories and replies ignored as untrusted, by reason",
                                ["reason"], registry=registry if registry is not None else CollectorRegistry())
        self._logged: set[tuple[str, str]] = set()
        self._seen: dict[tuple, float] = {}

    def _admit(self, ep) -> str | None:
        """Why the process serving ``ep`` is outside a policy's selector, or None."""
        labels = {"job": ep.job, "rank": str(ep.rank)}
        for policy, match, pids, cgroup in self._scopes:
            if not match(labels):
                continue
            if pids and not self.procfs.descends_from(ep.pid, pids):
                return f"pid {ep.pid} is not below pids {','.join(map(str, pids))} of policy {policy}"
            if cgroup and not self.procfs.in_cgroup(ep.pid, cgroup):
                return f"pid {ep.pid} is not in cgroup {cgroup} of policy {policy}"
        return None

    def poll(self, now: float) -> list[tuple[str, dict, float]]:
        from reflexarc.actuators.framework_hook import read_signals
        read = read_signals(self.hook_dir, self.job, procfs=self.procfs, admit=self._admit)
        for rejected in read.rejected:
            self.rejected.labels(rejected.reason).inc()
            if (rejected.where, rejected.reason) not in self._logged:
                if len(self._logged) >= 4096:      # bounded, however many sockets come and go
                    self._logged.clear()
                self._logged.add((rejected.where, rejected.reason))
                log.warning("hook channel: ignored (%s): %s", rejected.reason, rejected)
        out = []
        for rec in read.signals:
            key = (rec["name"], tuple(sorted(rec["labels"].items())))
            if self._seen.get(key) != rec["ts"]:      # only new reports
                self._seen[key] = rec["ts"]
                out.append((rec["name"], rec["labels"], rec["value"]))
        return out

    poll_arrived = poll       # the scripts' latest reports, between two polls too

    def close(self) -> None:
        pass
