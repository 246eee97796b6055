"""A small PyTorch CPU training job wired to reflexarc's framework hooks.

Trains an MLP on a synthetic regression set whose samples cost a simulated storage
read (``--read-ms`` of sleep per sample in the DataLoader workers). It registers
``dataloader.prefetch``: the handler sets the DataLoader's ``prefetch_factor``
and ``num_workers`` for the next epoch (each epoch builds a new DataLoader), as
the shipped ``dataloader-starvation`` policy asks; its preview reports the
current and requested settings, and its undo restores what the job started with. Every step reports ``step_time_ms`` and
``dataloader_batch_wait_ms`` and reaches a step boundary, where queued calls run.

It prints one JSON line per epoch (``{"event": "epoch", "epoch": 3,
"prefetch_factor": 4, "num_workers": 8, ...}`` read back from the DataLoader actually built) and one
at the end.

Example::

    python examples/train_with_hooks.py --job llama --rank 0 --steps 400
    # as a user who is not root, once root made the job's directory (docs/hooks.md):
    #   install -d -o alice -m 0700 /run/reflexarc/hooks/llama
    # elsewhere, as root or the same user:
    #   FrameworkHookActuator().plan(Target({"job": "llama"}),
    #                                {"handler": "dataloader.prefetch",
    #                                 "args": {"prefetch_factor": 8, "num_workers": 8}})

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

from reflexarc.actuators.hooks import HookDirError, Hooks
from reflexarc.actuators.loader_settings import LoaderSettings


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
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    # SIGTERM ends the job through SystemExit, so the hook socket is removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    torch.manual_seed(0)
    torch.set_num_threads(1)

    settings = LoaderSettings(args.prefetch, args.workers)
    try:
        hooks = Hooks.start(job=args.job, rank=args.rank, hook_dir=args.hook_dir)
    except HookDirError as exc:          # not root and no job directory: say what to create
        print(f"error: {exc}", file=sys.stderr)
        return 1
    hooks.handler("dataloader.prefetch", undo=settings.restore, preview=settings.preview)(settings.set)
    say(event="ready", socket=hooks.path, pid=hooks.pid)

    data = SlowReadDataset(args.samples, 32, args.read_ms)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.MSELoss()
    step, epoch, loss = 0, 0, torch.tensor(0.0)
    with hooks:
        while step < args.steps:
            current, _ = settings.take()          # what the hook last set, for this epoch
            loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, **current)
            say(event="epoch", epoch=epoch, step=step, prefetch_factor=loader.prefetch_factor,
                num_workers=loader.num_workers, loss=round(loss.item(), 5))
            waited = time.perf_counter()
            for x, y in loader:
                start = time.perf_counter()
                opt.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                done = time.perf_counter()
                # one process, no collective: the whole step runs before it
                hooks.report(step_time_ms=(done - waited) * 1000.0, dataloader_batch_wait_ms=(start - waited) * 1000.0,
                             step_pre_collective_ms=(done - waited) * 1000.0, iteration=step)
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
