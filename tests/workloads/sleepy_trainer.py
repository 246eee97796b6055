"""An unmodified training script, starved of batches or not at will: the
workload of the batch_wait probe's tests and of ``bench/step_signals.py``.

It imports torch and the standard library only, never reflexarc: the probe
must read its step signals from the outside. A ``torch.utils.data.DataLoader``
(``--workers`` worker processes, 2 by default, no pin memory) serves batches of
``--batch`` items from a Dataset whose ``__getitem__`` sleeps ``--item-ms`` per
item (a slow source: storage, decoding), so with slow items the loop waits for
its workers. Each step is a tiny linear model's forward, backward and SGD
update, then ``--step-ms`` of sleep standing in for the accelerator's time
(a GPU job's training process sleeps in the driver while its kernels run).
With ``--slow-worker-ms`` worker 0's items take longer, so its batches are
finished after the other workers' later ones: the DataLoader, which returns
batches in order, reads several in one ``next()`` and keeps the early ones.
Without ``--persistent`` every epoch (``--epoch-items`` items) starts new
worker processes and a new data queue, as PyTorch does by default; the new
queue often gets fd numbers of its own (the old one's are not all closed yet),
and ``--shift-fds`` (an fd more held open before each epoch) makes sure of it.

Stdout carries JSON lines, one object each, flushed:

* ``{"event": "ready", "pid": ...}`` before the first epoch;
* ``{"event": "epoch", "epoch": k, "worker_pids": [...]}`` from the training
  process as each epoch's iterator is made (the same pids every epoch with
  ``--persistent``);
* ``{"event": "step", "step": n, "epoch": k, "t": ..., "got": ..., "step_ms": ...,
  "wait_ms": ..., "setup_ms": ...}`` after every step. ``t`` is ``time.monotonic()`` at the end
  of the step and ``got`` when its batch was in hand (CLOCK_MONOTONIC: the
  clock of ``bpf_ktime_get_ns``, the same in every process). ``step_ms`` runs from the end of the previous step to the end
  of this one (null for the first step); ``wait_ms`` is the time the loop spent
  getting this step's batch: inside ``next(iterator)``, and at an epoch's start
  also ending the old iterator and creating the new one (``iter(loader)``
  starts the workers), which ``setup_ms`` is the part of (0 for the others);
* ``{"event": "done", "steps": n}`` at the end (``--duration``, ``--steps`` or
  SIGTERM, whichever comes first).

Example::

    .venv/bin/python tests/workloads/sleepy_trainer.py --item-ms 20 --duration 10     # starved
    .venv/bin/python tests/workloads/sleepy_trainer.py --item-ms 0 --step-ms 20 --epoch-items 400

Overhead: it is the load: with slow items the workers mostly sleep; the main
process runs ~1 ms of CPU per step; ~2 s from launch to the first step (torch
import, worker start).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, get_worker_info

FEATURES, CLASSES = 32, 4


class SleepyDataset(Dataset):
    """Item i: ``item_ms`` of sleep (``slow_worker_ms`` more in worker 0), then a
    small random feature vector and its label."""

    def __init__(self, items: int, item_ms: float, slow_worker_ms: float = 0.0) -> None:
        self.items, self.item_s, self.slow_s = items, item_ms / 1000.0, slow_worker_ms / 1000.0

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, i: int):
        pause = self.item_s
        if self.slow_s:
            info = get_worker_info()
            if info is not None and info.id == 0:
                pause += self.slow_s
        if pause > 0:
            time.sleep(pause)
        return torch.randn(FEATURES), i % CLASSES


def say(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--item-ms", type=float, default=20.0, help="sleep per item in the workers")
    ap.add_argument("--step-ms", type=float, default=5.0, help="sleep per step: the accelerator's time")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--slow-worker-ms", type=float, default=0.0,
                    help="more sleep per item in worker 0: its batches finish after later ones (out of order)")
    ap.add_argument("--epoch-items", type=int, default=1 << 30, help="items per epoch (default: one endless epoch)")
    ap.add_argument("--persistent", action="store_true", help="persistent_workers=True")
    ap.add_argument("--shift-fds", action="store_true",
                    help="open one more fd before each epoch, so each epoch's data queue gets new fd numbers")
    ap.add_argument("--sharing-strategy", choices=("file_descriptor", "file_system"),
                    help="torch.multiprocessing's sharing strategy (default: torch's, file_descriptor); with "
                         "file_system a batch's tensors are rebuilt without a round trip to the worker")
    ap.add_argument("--duration", type=float, default=0.0, help="seconds to run (0: until --steps or SIGTERM)")
    ap.add_argument("--steps", type=int, default=0, help="steps to run (0: until --duration or SIGTERM)")
    args = ap.parse_args(argv)

    stopping: list = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if args.sharing_strategy:
        torch.multiprocessing.set_sharing_strategy(args.sharing_strategy)
    loader = DataLoader(SleepyDataset(args.epoch_items, args.item_ms, args.slow_worker_ms), batch_size=args.batch,
                        num_workers=args.workers, persistent_workers=args.persistent)
    model = nn.Linear(FEATURES, CLASSES)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    say(event="ready", pid=os.getpid())

    began = time.monotonic()
    deadline = began + args.duration if args.duration else float("inf")
    step, epoch, it, last_end = 0, 0, None, None
    held: list[int] = []
    while not stopping and time.monotonic() < deadline and (not args.steps or step < args.steps):
        asked = time.monotonic()
        batch, setup = None, 0.0
        while batch is None:
            if it is None:
                began_setup = time.monotonic()
                epoch += 1
                if args.shift_fds:
                    held.append(os.open(os.devnull, os.O_RDONLY))
                it = iter(loader)
                setup += time.monotonic() - began_setup
                say(event="epoch", epoch=epoch, worker_pids=[w.pid for w in getattr(it, "_workers", [])])
            try:
                began_next = time.monotonic()
                batch = next(it)
            except StopIteration:     # the old workers were shut down inside next()
                setup += time.monotonic() - began_next
                it = None
        arrived = time.monotonic()
        x, y = batch
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        if args.step_ms > 0:
            time.sleep(args.step_ms / 1000.0)
        end = time.monotonic()
        step += 1
        say(event="step", step=step, epoch=epoch, t=end, got=arrived,
            step_ms=None if last_end is None else (end - last_end) * 1e3,
            wait_ms=(arrived - asked) * 1e3, setup_ms=setup * 1e3)
        last_end = end
    del it
    say(event="done", steps=step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
