"""An unmodified training script whose DataLoader reads small records of a
block device: the workload of the read-amplification tests.

It imports torch and the standard library only, never reflexarc. The Dataset's
item i reads a 16 KiB record, in four 4 KiB ``pread`` calls, at a random
256 KiB-aligned place of ``--device`` (a loop device in the tests), then spends
``--decode-ms`` decoding it. The second read of a record looks sequential to
the kernel, which reads ahead well past the record: the disk reads several
times the bytes the loader uses, as for a shuffled dataset of small records
under the default readahead. So that the dataset behaves as one far larger
than the page cache, each worker drops the device's cached pages every
``--drop-every`` items (``POSIX_FADV_DONTNEED``). One worker, batches of
``--batch`` items and ``--step-ms`` of step: the loop waits for every batch.

Stdout carries JSON lines: ``{"event": "ready", "pid": ...}``, then
``{"event": "step", "step": n, "wait_ms": ...}`` after every step.

Example::

    .venv/bin/python tests/workloads/record_reader.py --device /dev/loop3 --duration 120

Overhead: it is the load: a worker reading ~0.5 MB/s of records and
sleeping in its decode; the main process ~1 ms of CPU a step.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time

import torch
from torch.utils.data import DataLoader, Dataset

RECORD, READ, ALIGN = 16 << 10, 4 << 10, 256 << 10


class Records(Dataset):
    def __init__(self, device: str, items: int, decode_ms: float, drop_every: int) -> None:
        self.device, self.items, self.decode_s, self.drop_every = device, items, decode_ms / 1000.0, drop_every
        self.fd = -1
        self.read = 0

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, i: int):
        if self.fd < 0:
            self.fd = os.open(self.device, os.O_RDONLY)
            self.slots = os.lseek(self.fd, 0, os.SEEK_END) // ALIGN
        base = random.randrange(self.slots) * ALIGN
        data = b"".join(os.pread(self.fd, READ, base + off) for off in range(0, RECORD, READ))
        self.read += 1
        if self.read % self.drop_every == 0:
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        time.sleep(self.decode_s)
        return torch.tensor(len(data), dtype=torch.float32)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--decode-ms", type=float, default=2.0)
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--drop-every", type=int, default=200)
    ap.add_argument("--duration", type=float, default=120.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    loader = DataLoader(Records(args.device, 1 << 30, args.decode_ms, args.drop_every), batch_size=args.batch,
                        num_workers=1)
    print(json.dumps({"event": "ready", "pid": os.getpid()}), flush=True)
    end, step = time.monotonic() + args.duration, 0
    it = iter(loader)
    while time.monotonic() < end:
        asked = time.monotonic()
        next(it)
        got = time.monotonic()
        time.sleep(args.step_ms / 1000.0)
        step += 1
        print(json.dumps({"event": "step", "step": step, "wait_ms": (got - asked) * 1e3}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
