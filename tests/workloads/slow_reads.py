"""A Dataset whose reads are really slow: each item is read from a pipe whose
writer (a separate feeder process) sleeps ``delay`` before writing, so the
``read`` syscall itself blocks that long, as on slow storage. Each item also
does a few small page-cache reads of an index file first, as a real loader does.

Feeder and worker run SCHED_FIFO: on a busy 2-core box a woken normal task can
wait several ms for a CPU, and the workloads are about the probes' accuracy,
not the box's load.

With ``timings`` (a directory) each worker appends how long each of its reads
took, as it timed them itself, to ``timings/<pid>``: one line of nanoseconds
per read, the payload's and the index's.

Example::

    ds = PipeDelayDataset(400, 0.002, "/tmp/index.bin")
    DataLoader(ds, num_workers=2)     # workers named pt_data_worker by torch
"""
from __future__ import annotations

import os
import select
import subprocess
import sys
import time

INDEX_READS = 4      # small page-cache reads per item before its payload

FEEDER = r"""
import os, sys, time
delay, chunk = float(sys.argv[1]), b"x" * 4096
os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
os.write(1, b"!")               # ready
while os.read(0, 1):            # one request byte per item
    time.sleep(delay)
    os.write(1, chunk)          # <= PIPE_BUF: arrives in one piece
"""


class PipeDelayDataset:
    def __init__(self, n: int, delay: float, index_path: str, timings: str | None = None) -> None:
        self.n, self.delay, self.index_path, self.timings = n, delay, index_path, timings
        self._feeder = None
        self._index = None
        self._owner = None

    def __len__(self) -> int:
        return self.n

    def _pipe(self):
        if self._owner != os.getpid():    # first item in this worker process
            self._feeder = subprocess.Popen([sys.executable, "-c", FEEDER, str(self.delay)],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
            self._owner = os.getpid()
            self._index = os.open(self.index_path, os.O_RDONLY)
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
            select.select([self._feeder.stdout], [], [])   # the feeder's start-up, not a timed read
            os.read(self._feeder.stdout.fileno(), 1)
        return self._feeder

    def __getitem__(self, i: int) -> int:
        feeder = self._pipe()
        took = []
        for k in range(INDEX_READS):
            t0 = time.perf_counter_ns()
            os.pread(self._index, 64, (i * INDEX_READS + k) * 64 % 4096)
            took.append(time.perf_counter_ns() - t0)
        feeder.stdin.write(b"r")
        t0 = time.perf_counter_ns()
        data = os.read(feeder.stdout.fileno(), 4096)   # blocks until the feeder writes
        took.append(time.perf_counter_ns() - t0)
        if self.timings:
            with open(os.path.join(self.timings, str(os.getpid())), "a") as f:
                f.write("".join(f"{ns}\n" for ns in took))
        return len(data)


def make_index(path: str) -> str:
    with open(path, "wb") as f:
        f.write(os.urandom(4096))
    return path
