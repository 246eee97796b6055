"""Signal sources for live runs: each ``poll(now)`` returns new samples.

- ``ProbeSource``: the bcc probes (``reflexarc.bpf.manager.ProbeManager``); also
  refreshes the probes' target selection and expires deep probes at their TTL.
- ``HookSource``: step signals (``step_time_ms``, ``dataloader_batch_wait_ms``)
  that training scripts report through ``reflexarc.actuators.hooks``.
- ``NvmlSource``: ``gpu_utilization_pct{gpu}`` of every NVIDIA GPU through NVML
  (``nvidia-ml-py``), where the node has GPUs.
- ``ReplaySource``: a JSONL file of ``{"t": seconds-from-start, "name", "labels", "value"}``
  replayed against wall time (recorded incidents, tests, demos).

Example::

    src = ReplaySource("incident.jsonl", start=time.time())
    for name, labels, value in src.poll(time.time()):
        bus.publish(name, labels, value, now)

Overhead: ProbeSource reads the probes' maps once per interval and lists the
hook directory every 5 s; HookSource makes
one Unix-socket request per training process per interval; NvmlSource one
utilisation query per GPU per interval (~50 us each); ReplaySource reads its
file once at start.
"""
from __future__ import annotations

import json
from pathlib import Path

from .signals import CATALOGUE, UnknownSignal


class SourceError(ValueError):
    pass


class ReplaySource:
    name = "replay"

    def __init__(self, path: str | Path, start: float) -> None:
        self.path = Path(path)
        self.start = start
        self._items = []
        try:
            lines = self.path.read_text().splitlines()
        except OSError as exc:
            raise SourceError(f"{path}: {exc.strerror or exc}") from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                name = rec["name"]
                if name not in CATALOGUE:
                    raise UnknownSignal(name)
                self._items.append((float(rec["t"]), name, dict(rec.get("labels", {})), float(rec["value"])))
            except (ValueError, KeyError, TypeError, UnknownSignal) as exc:
                raise SourceError(f"{path}:{n}:1: error: bad replay record: {exc}") from None
        self._items.sort(key=lambda i: i[0])
        self._pos = 0

    def poll(self, now: float) -> list[tuple[str, dict, float]]:
        out = []
        while self._pos < len(self._items) and self._items[self._pos][0] <= now - self.start:
            _, name, labels, value = self._items[self._pos]
            out.append((name, labels, value))
            self._pos += 1
        return out

    def close(self) -> None:
        pass


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
    hooks also carry its ``rank`` (from the hook socket's name)."""

    name = "probes"

    def __init__(self, manager, refresh_every: float = 5.0, hook_dir: str | None = None) -> None:
        self.manager = manager
        self.refresh_every = refresh_every   # /proc rescans; renames are caught in the kernel meanwhile
        self.hook_dir = hook_dir
        self._ranks: dict[int, str] = {}     # training process pid -> rank
        self._refreshed = float("-inf")

    def poll(self, now: float) -> list[tuple[str, dict, float]]:
        if now - self._refreshed >= self.refresh_every:
            self.manager.refresh_selection()
            if self.hook_dir:
                from reflexarc.actuators.framework_hook import ranks_by_pid
                self._ranks = ranks_by_pid(self.hook_dir)
            self._refreshed = now
        self.manager.expire_deep(now)
        samples = self.manager.collect(now)
        if self._ranks:
            for _, labels, _ in samples:       # each sample has its own labels dict
                trainer = labels.get("trainer")
                rank = self._ranks.get(int(trainer)) if trainer else None
                if rank is not None:
                    labels["rank"] = rank
        return samples

    def close(self) -> None:
        self.manager.stop()


class HookSource:
    name = "hooks"

    def __init__(self, hook_dir: str, job: str | None = None) -> None:
        self.hook_dir = hook_dir
        self.job = job or None
        self._seen: dict[tuple, float] = {}

    def poll(self, now: float) -> list[tuple[str, dict, float]]:
        from reflexarc.actuators.framework_hook import read_signals
        out = []
        for rec in read_signals(self.hook_dir, self.job):
            key = (rec["name"], tuple(sorted(rec["labels"].items())))
            if self._seen.get(key) != rec["ts"]:      # only new reports
                self._seen[key] = rec["ts"]
                out.append((rec["name"], rec["labels"], rec["value"]))
        return out

    def close(self) -> None:
        pass
