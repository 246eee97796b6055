"""Faults to inject into a running testbed, one at a time: each ``start()``
returns the wall-clock onset (also written to the testbed's events log) and
``stop()`` ends it.

* ``BulkUpload(tb, tos=0)``: a bulk TCP flow from rank 0's namespace to the
  store's sink on port 443 (a checkpoint upload) through the bottleneck, a
  process of its own in the cgroup ``<prefix>/bulk``, not one of the job's.
  ``tos=0x20`` sends it pre-marked CS1 (``IP_TOS`` set before connecting).
* ``StoreLatency(tb, ms)``: every store request waits ``ms`` (latency-bound).
* ``StoreSerial(tb, ms)``: the store serves one request at a time, ``ms`` each.
* ``CpuHog(tb, cpu)``: a busy loop pinned to ``cpu`` in rank 0's namespace
  (cgroup ``<prefix>/hog``), competing with the DataLoader workers.
* ``Misplaced(tb, trainer_pid, cpu)``: the hog, and rank 0's training process and
  workers pinned to that CPU (a rank bound to the wrong node).
* ``Nothing(tb)``: no fault, for the quiet run.

Example::

    bulk = BulkUpload(tb)
    onset = bulk.start()
    ...
    bulk.stop()

The processes run ``python -m reflexarc.simulations.testbed.faults bulk|hog ...``.

Overhead: the bulk sender moves bytes with ``sendall`` of 1 MiB buffers (a few
percent of a core at 200 mbit); the hog is one core at 100 %.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

from .procs import TestbedError, end_groups
from .topology import SINK_PORT, Testbed


class Fault:
    name = "fault"

    def __init__(self, tb: Testbed) -> None:
        self.tb = tb

    def describe(self) -> dict:
        return {"fault": self.name}

    def start(self) -> float:
        return self.tb.event(event="fault-start", **self.describe())

    def stop(self) -> float:
        return self.tb.event(event="fault-stop", **self.describe())


class Nothing(Fault):
    name = "nothing"


class _Process(Fault):
    """A fault that is a process in rank 0's namespace; onset is when it says so."""

    def __init__(self, tb: Testbed) -> None:
        super().__init__(tb)
        self.proc = None

    def argv(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 15.0) -> float:
        if self.proc is not None:
            raise TestbedError(f"{self.name} is already started")
        log = self.tb.workdir / f"{self.name}.log"
        log.unlink(missing_ok=True)
        self.proc = self.tb.spawn([sys.executable, "-m", __name__, *self.argv()], name=self.name,
                                  netns=self.tb.rank_netns(0), cgroup=self.name)
        deadline = time.monotonic() + timeout
        while True:
            text = log.read_text() if log.exists() else ""
            if "\n" in text:                 # the first line is complete
                onset = json.loads(text.split("\n", 1)[0])["ts"]
                return self.tb.event(ts=onset, event="fault-start", pid=self.proc.pid, **self.describe())
            if self.proc.poll() is not None:
                raise TestbedError(f"{self.name} exited ({self.proc.returncode}): {self.tb.log_tail(self.name)}")
            if time.monotonic() > deadline:
                raise TestbedError(f"{self.name} did not start within {timeout:g}s")
            time.sleep(0.05)

    def stop(self) -> float:
        if self.proc is not None:
            end_groups([self.proc], grace=1.0)
            self.proc = None
        return super().stop()


class BulkUpload(_Process):
    name = "bulk"

    def __init__(self, tb: Testbed, tos: int = 0) -> None:
        super().__init__(tb)
        if not 0 <= tos <= 0xFF:
            raise ValueError(f"tos {tos} outside 0..255")
        self.tos = tos

    def describe(self) -> dict:
        return {"fault": self.name, "tos": self.tos, "dscp": self.tos >> 2,
                "to": f"{self.tb.store_addr}:{SINK_PORT}"}

    def argv(self) -> list[str]:
        return ["bulk", self.tb.store_addr, str(SINK_PORT), str(self.tos)]


class CpuHog(_Process):
    name = "hog"

    def __init__(self, tb: Testbed, cpu: int = 0) -> None:
        super().__init__(tb)
        if cpu not in os.sched_getaffinity(0):
            raise ValueError(f"cpu {cpu} is not available here ({sorted(os.sched_getaffinity(0))})")
        self.cpu = cpu

    def describe(self) -> dict:
        return {"fault": self.name, "cpu": self.cpu}

    def argv(self) -> list[str]:
        return ["hog", str(self.cpu)]


class Misplaced(CpuHog):
    """Rank 0 bound to the wrong node: its training process (every thread, so the
    DataLoader workers it forks inherit it) and its current workers pinned to
    ``cpu``, beside a CPU hog on that CPU. On this two-core host, with CPU 1
    declared node 1, the closest stand-in for a rank a launcher bound to the far
    socket. ``stop()`` ends the hog and gives the training process's threads back
    the affinity they had."""
    name = "misplaced"

    def __init__(self, tb: Testbed, trainer_pid: int, cpu: int = 1) -> None:
        super().__init__(tb, cpu)
        self.trainer_pid = trainer_pid
        self.saved: dict[int, set[int]] = {}

    def describe(self) -> dict:
        return {"fault": self.name, "cpu": self.cpu, "trainer": self.trainer_pid}

    def start(self, timeout: float = 15.0) -> float:
        onset = super().start(timeout)
        for tid in _threads(self.trainer_pid) + _children(self.trainer_pid):
            try:
                self.saved.setdefault(tid, os.sched_getaffinity(tid))
                os.sched_setaffinity(tid, {self.cpu})
            except (ProcessLookupError, PermissionError):
                pass                          # a worker that just exited
        return onset

    def stop(self) -> float:
        for tid in _threads(self.trainer_pid):
            if tid in self.saved:
                try:
                    os.sched_setaffinity(tid, self.saved[tid])
                except ProcessLookupError:
                    pass
        self.saved.clear()
        return super().stop()


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def _children(pid: int) -> list[int]:
    out = []
    for tid in _threads(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except FileNotFoundError:
            pass
    return out


class _StoreMode(Fault):
    mode = "normal"

    def __init__(self, tb: Testbed, ms: float) -> None:
        super().__init__(tb)
        if ms <= 0:
            raise ValueError("ms must be positive")
        self.ms = float(ms)

    def describe(self) -> dict:
        return {"fault": self.name, "ms": self.ms}

    def start(self) -> float:
        return self.tb.event(ts=self.tb.store_mode(self.mode, self.ms), event="fault-start", **self.describe())

    def stop(self) -> float:
        self.tb.store_mode("normal")
        return super().stop()


class StoreLatency(_StoreMode):
    name, mode = "store-latency", "latency"


class StoreSerial(_StoreMode):
    name, mode = "store-serial", "serial"


def _say(**fields) -> None:
    print(json.dumps({"ts": time.time(), **fields}), flush=True)


def _bulk(host: str, port: int, tos: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
    sock.connect((host, port))
    _say(event="connected", to=f"{host}:{port}", tos=tos)
    chunk = b"\0" * (1 << 20)
    while True:
        sock.sendall(chunk)


def _hog(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    _say(event="spinning", cpu=cpu)
    while True:
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="The processes behind the testbed's faults.")
    sub = ap.add_subparsers(dest="what", required=True)
    bulk = sub.add_parser("bulk", help="send zeros to HOST:PORT until killed")
    bulk.add_argument("host")
    bulk.add_argument("port", type=int)
    bulk.add_argument("tos", type=lambda s: int(s, 0))
    hog = sub.add_parser("hog", help="spin on one CPU until killed")
    hog.add_argument("cpu", type=int)
    args = ap.parse_args(argv)
    if args.what == "bulk":
        _bulk(args.host, args.port, args.tos)
    else:
        _hog(args.cpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
