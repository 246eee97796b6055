"""A training-like loop whose DataLoader starts new worker processes every epoch.

The DataLoader is PyTorch's default kind: ``num_workers=2``, no
``persistent_workers``, so each epoch forks two new ``pt_data_worker``
processes (new pids) and ends them when the epoch is done, as many real jobs
do. Each item is a real ``pread`` of a page-cached file the loop creates in a
temporary directory, turned into a small tensor and pushed through a few small
matrix products (~0.7 ms of CPU per item in one thread); the training step is
a tiny linear model with SGD in the main process, on batches of 16. Epochs are
short (3072 items by default: ~1.4 s and ~140 steps/s on a 2-core VM), so the
worker churn is fast: two new pids every ~1.4 s.

Stdout carries JSON lines, one object each, flushed:

* ``{"event": "ready", "pid": ..., "hook_socket": ...}`` once the data file exists;
* ``{"event": "progress", "elapsed": s, "steps": n, "items": n, "epochs": done,
  "workers": distinct worker pids so far}`` every ``--interval`` seconds;
* ``{"event": "epoch", "epoch": k, "epoch_s": s, "worker_pids": [...], ...}`` at
  the end of each epoch (plus the progress fields);
* ``{"event": "done", ...}`` at the end (``--duration`` or ``--epochs``, whichever
  comes first; SIGTERM ends the loop the same way).

Worker pids are exact: each worker appends its pid to a file in the temporary
directory from ``worker_init_fn``. With ``--hook-dir`` the loop serves
reflexarc's framework hooks (``actuators/hooks.py``) as job ``--job``, rank 0,
and reports ``step_time_ms`` and ``dataloader_batch_wait_ms`` every step, as a
real training script does.

Example::

    .venv/bin/python tests/workloads/epoch_loader.py --epochs 5 --epoch-items 1536
    .venv/bin/python tests/workloads/epoch_loader.py --duration 60 --hook-dir /run/reflexarc/hooks --job churn

Overhead: it is the load: the main process and its two workers keep both cores
of a 2-core machine busy; an 8 MiB scratch file; ~2 s from launch to the first
step (torch import, the file).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

FILE_BYTES = 8 << 20
READ_BYTES = 16 << 10          # one item: 16 KiB = 128 x 128 bytes
SIDE = 128
PRODUCTS = 10                  # 128x128 matrix products per item (the item's CPU work)
CLASSES = 10


class PreadDataset(Dataset):
    """Item i: 16 KiB pread at a pseudo-random page of the scratch file, as a
    128x128 float tensor multiplied ``PRODUCTS`` times by a fixed matrix; the
    features are its row means, the label ``i % CLASSES``."""

    def __init__(self, path: str, items: int) -> None:
        self.path, self.items = path, items
        self.weight = torch.randn(SIDE, SIDE, generator=torch.Generator().manual_seed(0)) / SIDE ** 0.5
        self._fd, self._owner = -1, -1

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, i: int):
        if self._owner != os.getpid():           # first item in this worker process
            self._fd, self._owner = os.open(self.path, os.O_RDONLY), os.getpid()
        offset = (i * 2654435761 % ((FILE_BYTES - READ_BYTES) // 4096)) * 4096
        raw = os.pread(self._fd, READ_BYTES, offset)
        x = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(SIDE, SIDE).float() / 255.0
        for _ in range(PRODUCTS):
            x = torch.tanh(x @ self.weight)
        return x.mean(dim=1), i % CLASSES


def note_worker(pids_path: str, _worker_id: int) -> None:
    """worker_init_fn: append this worker's pid (one short O_APPEND write: atomic)."""
    fd = os.open(pids_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
    finally:
        os.close(fd)


def read_pids(pids_path: str) -> list[int]:
    try:
        with open(pids_path) as f:
            return [int(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def make_file(path: str) -> None:
    with open(path, "wb") as f:
        f.write(os.urandom(FILE_BYTES))
    with open(path, "rb") as f:                  # into the page cache
        while f.read(1 << 20):
            pass


def say(**fields) -> None:
    print(json.dumps(fields), flush=True)


def train(args, tmp: str, hooks, stopping: list) -> dict:
    data_path, pids_path = os.path.join(tmp, "data"), os.path.join(tmp, "worker-pids")
    make_file(data_path)
    say(event="ready", pid=os.getpid(), hook_socket=hooks.path if hooks else None)
    dataset = PreadDataset(data_path, args.epoch_items)
    loader = DataLoader(dataset, batch_size=args.batch, shuffle=True, num_workers=2,
                        worker_init_fn=functools.partial(note_worker, pids_path))
    model = nn.Linear(SIDE, CLASSES)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    began = time.monotonic()
    deadline = began + args.duration if args.duration else float("inf")
    state = {"steps": 0, "items": 0, "epochs": 0}

    def progress() -> dict:
        return {**state, "elapsed": round(time.monotonic() - began, 3), "workers": len(set(read_pids(pids_path)))}

    next_report = began + args.interval
    while (not args.epochs or state["epochs"] < args.epochs) and time.monotonic() < deadline and not stopping:
        epoch_began = waited = time.monotonic()
        for x, y in loader:
            arrived = time.monotonic()
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            done = time.monotonic()
            state["steps"] += 1
            state["items"] += len(y)
            if hooks:
                hooks.report(iteration=state["steps"], step_time_ms=(done - waited) * 1e3,
                             dataloader_batch_wait_ms=(arrived - waited) * 1e3)
                hooks.step_boundary()
            if done >= next_report:
                say(event="progress", **progress())
                next_report = done + args.interval
            if done >= deadline or stopping:
                break
            waited = time.monotonic()
        else:
            state["epochs"] += 1
            say(event="epoch", epoch=state["epochs"], epoch_s=round(time.monotonic() - epoch_began, 3),
                worker_pids=read_pids(pids_path)[-2:], **progress())
    return progress()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=0.0, help="seconds to run (0: until --epochs or SIGTERM)")
    ap.add_argument("--epochs", type=int, default=0, help="epochs to run (0: until --duration or SIGTERM)")
    ap.add_argument("--epoch-items", type=int, default=3072, help="items per epoch (~1.4 s on 2 cores)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between progress lines")
    ap.add_argument("--hook-dir", help="serve reflexarc's framework hooks there and report step signals")
    ap.add_argument("--job", default="epoch-loader", help="job name for the hooks")
    args = ap.parse_args(argv)

    stopping: list = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    torch.manual_seed(0)
    torch.set_num_threads(1)                     # the two workers have the other core
    hooks = None
    if args.hook_dir:
        from reflexarc.actuators.hooks import Hooks
        hooks = Hooks.start(job=args.job, rank=0, hook_dir=args.hook_dir)
    try:
        with tempfile.TemporaryDirectory(prefix="rx-epoch-") as tmp:
            final = train(args, tmp, hooks, stopping)
    finally:
        if hooks:
            hooks.close()
    say(event="done", **final)
    return 0


if __name__ == "__main__":
    sys.exit(main())
