"""A small PyTorch CPU training job wired to reflexarc's framework hooks.

Trains an MLP on a synthetic regression set whose samples cost a simulated storage
read (``--read-ms`` of sleep per sample in the DataLoader workers). It registers
``dataloader.prefetch``: the handler sets the DataLoader's ``prefetch_factor`` for
the next epoch (each epoch builds a new DataLoader with two worker processes), its
preview reports the current and requested factor, and its undo restores the factor
the job started with. Every step reports ``step_time_ms`` and
``dataloader_batch_wait_ms`` and reaches a step boundary, where queued calls run.

It prints one JSON line per epoch (``{"event": "epoch", "epoch": 3,
"prefetch_factor": 4, ...}`` read back from the DataLoader actually built) and one
at the end.

Example::

    python examples/train_with_hooks.py --job llama --rank 0 --steps 400
    # elsewhere, as root or the same user:
    #   FrameworkHookActuator().plan(Target({"job": "llama"}),
    #                                {"handler": "dataloader.prefetch", "args": {"factor": 4}})

Overhead of the hooks on the loop: a few microseconds per step.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from reflexarc.actuators.hooks import Hooks


class SlowReadDataset(Dataset):
    """y = x . w + noise; each sample waits ``read_ms`` as if read from storage."""

    def __init__(self, size: int, features: int, read_ms: float, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, features, generator=gen)
        self.y = self.x @ torch.randn(features, 1, generator=gen) + 0.01 * torch.randn(size, 1, generator=gen)
        self.read_s = read_ms / 1000.0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if self.read_s:
            time.sleep(self.read_s)
        return self.x[i], self.y[i]


class PrefetchSetting:
    """The prefetch factor the next epoch's DataLoader uses, with undo to the original."""

    def __init__(self, factor: int) -> None:
        self.factor = factor
        self.original: int | None = None

    def set(self, factor: int) -> dict:
        factor = int(factor)
        if not 1 <= factor <= 64:
            raise ValueError(f"prefetch factor {factor} outside 1..64")
        if self.original is None:
            self.original = self.factor
        self.factor = factor
        return {"prefetch_factor": factor, "original": self.original}

    def restore(self, **_args) -> dict:
        if self.original is not None:
            self.factor, self.original = self.original, None
        return {"prefetch_factor": self.factor}

    def preview(self, factor: int) -> dict:
        return {"before": {"prefetch_factor": self.factor}, "after": {"prefetch_factor": int(factor)}}


def say(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", default="example")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--hook-dir", default=None, help="default: $REFLEXARC_HOOK_DIR or /run/reflexarc/hooks")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--samples", type=int, default=256, help="samples per epoch")
    ap.add_argument("--read-ms", type=float, default=1.0)
    ap.add_argument("--prefetch", type=int, default=2)
    args = ap.parse_args(argv)
    # SIGTERM ends the job through SystemExit, so the hook socket is removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    torch.manual_seed(0)
    torch.set_num_threads(1)

    prefetch = PrefetchSetting(args.prefetch)
    hooks = Hooks.start(job=args.job, rank=args.rank, hook_dir=args.hook_dir)
    hooks.handler("dataloader.prefetch", undo=prefetch.restore, preview=prefetch.preview)(prefetch.set)
    say(event="ready", socket=hooks.path, pid=hooks.pid)

    data = SlowReadDataset(args.samples, 32, args.read_ms)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.MSELoss()
    step, epoch, loss = 0, 0, torch.tensor(0.0)
    with hooks:
        while step < args.steps:
            loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=2,
                                prefetch_factor=prefetch.factor)
            say(event="epoch", epoch=epoch, step=step, prefetch_factor=loader.prefetch_factor,
                loss=round(loss.item(), 5))
            waited = time.perf_counter()
            for x, y in loader:
                start = time.perf_counter()
                opt.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                done = time.perf_counter()
                hooks.report(step_time_ms=(done - waited) * 1000.0, dataloader_batch_wait_ms=(start - waited) * 1000.0,
                             iteration=step)
                hooks.step_boundary()
                step += 1
                if step >= args.steps:
                    break
                waited = time.perf_counter()
            epoch += 1
    say(event="done", steps=step, epochs=epoch, loss=round(loss.item(), 5))
    return 0


if __name__ == "__main__":
    sys.exit(main())
