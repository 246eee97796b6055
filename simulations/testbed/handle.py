"""A running training job of the testbed: its rank processes, where they live,
and the steps they printed.

Each rank's stdout is a file of JSON lines (``ready``, one ``step`` per step,
``done``; see ``job.py``); the accessors parse it afresh on every call, so
they always see the latest steps.

Example::

    job = tb.start_job(duration=60)          # returns once every rank is ready
    job.ranks[0].pid, job.ranks[0].cgroup, job.ranks[0].cgroup_id
    t0 = time.time(); time.sleep(10)
    job.median_step_ms(t0, time.time())      # over all ranks' steps in [t0, t1]
    job.mean_wait_ms(t0, time.time(), rank=0)
    [s["workers"] for s in job.steps(since=t0, rank=0)]
    job.stop()

Medians suit a slowed collective (every step slower); means suit a throughput
cap: with 8 workers against a store serving one request at a time, one step in
eight stalls for a second and the median stays at baseline while the mean
triples. The hooks' ``step_time_ms`` signal is a mean too.

Overhead: reading and parsing the logs, about 2 us per step line.
"""
from __future__ import annotations

import json
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from . import procs
from .procs import TestbedError


@dataclass
class Rank:
    rank: int
    proc: subprocess.Popen
    cgroup: str          # relative to the cgroup2 mount
    cgroup_id: int
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def lines(self) -> list[dict]:
        try:
            text = self.log.read_text()
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue          # a line being written
        return out

    def stderr_tail(self, lines: int = 5) -> str:
        try:
            text = Path(f"{self.log}.err").read_text(errors="replace").strip()
        except OSError:
            return ""
        return " | ".join(text.splitlines()[-lines:])


class Job:
    """The processes of one training job, one per rank."""

    def __init__(self, name: str, ranks: list[Rank]) -> None:
        self.name, self.ranks = name, ranks

    @property
    def pids(self) -> list[int]:
        return [r.pid for r in self.ranks]

    def describe(self) -> dict:
        return {"job": self.name, "ranks": [{"rank": r.rank, "pid": r.pid, "cgroup": r.cgroup,
                                             "cgroup_id": r.cgroup_id, "log": str(r.log)} for r in self.ranks],
                "sockets": self.sockets()}

    def sockets(self) -> list[str]:
        """The ranks' hook sockets, from their ``ready`` lines."""
        return [line["socket"] for r in self.ranks for line in r.lines() if line.get("event") == "ready"]

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Until every rank printed ``ready``; raises if one exits first or time runs out."""
        deadline = time.monotonic() + timeout
        waiting = list(self.ranks)
        while waiting:
            for r in waiting:
                if r.proc.poll() is not None:
                    raise TestbedError(f"rank {r.rank} of {self.name} exited ({r.proc.returncode}) before it was "
                                       f"ready: {r.stderr_tail() or '(no stderr)'}")
            waiting = [r for r in waiting if not any(line.get("event") == "ready" for line in r.lines())]
            if waiting and time.monotonic() > deadline:
                raise TestbedError(f"ranks {[r.rank for r in waiting]} of {self.name} not ready within {timeout:g}s")
            time.sleep(0.2)

    def running(self) -> bool:
        return all(r.proc.poll() is None for r in self.ranks)

    def steps(self, since: float = 0.0, until: float = float("inf"), rank: int | None = None) -> list[dict]:
        """Step lines with ``since <= ts <= until``, of one rank or all, in time order."""
        out = [line for r in self.ranks if rank in (None, r.rank) for line in r.lines()
               if line.get("event") == "step" and since <= line["ts"] <= until]
        return sorted(out, key=lambda s: s["ts"])

    def checkpoints(self, rank: int | None = None) -> list[dict]:
        """Checkpoint lines (``--checkpoint-every``), of one rank or all, in time order."""
        out = [line for r in self.ranks if rank in (None, r.rank) for line in r.lines()
               if line.get("event") == "checkpoint"]
        return sorted(out, key=lambda c: c["ts"])

    def median_step_ms(self, t0: float, t1: float, rank: int | None = None) -> float:
        return self._stat(statistics.median, "step_ms", t0, t1, rank)

    def mean_step_ms(self, t0: float, t1: float, rank: int | None = None) -> float:
        """The mean: what a throughput cap shows, where a few long stalls between
        fast steps leave the median untouched."""
        return self._stat(statistics.fmean, "step_ms", t0, t1, rank)

    def median_wait_ms(self, t0: float, t1: float, rank: int | None = None) -> float:
        return self._stat(statistics.median, "wait_ms", t0, t1, rank)

    def mean_wait_ms(self, t0: float, t1: float, rank: int | None = None) -> float:
        return self._stat(statistics.fmean, "wait_ms", t0, t1, rank)

    def _stat(self, fn, key: str, t0: float, t1: float, rank: int | None) -> float:
        values = [s[key] for s in self.steps(t0, t1, rank)]
        if not values:
            raise TestbedError(f"{self.name}: no steps between {t0:.3f} and {t1:.3f}")
        return fn(values)

    def wait(self, timeout: float) -> list[int]:
        """Wait for every rank to exit on its own (``steps``/``duration``); their exit codes."""
        deadline = time.monotonic() + timeout
        for r in self.ranks:
            try:
                r.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise TestbedError(f"rank {r.rank} of {self.name} still running after {timeout:g}s") from None
        return [r.proc.returncode for r in self.ranks]

    def stop(self, timeout: float = 20.0) -> list[int | None]:
        """Ask every rank to stop (SIGTERM: the ranks agree on a last step and exit),
        then end what is left of each process group; the exit codes."""
        for r in self.ranks:
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for r in self.ranks:
            try:
                r.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        procs.end_groups([r.proc for r in self.ranks], grace=1.0)
        return [r.proc.returncode for r in self.ranks]
