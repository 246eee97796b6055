"""The testbed's training job: real data-parallel PyTorch (gloo, DDP, CPU) whose
DataLoader reads every item over HTTP from the object store.

One process per rank, started inside the rank's namespace. The model is an MLP
autoencoder 256 -> 2048 -> 256 (1.05 M float32 parameters, 4.2 MB of gradients,
one DDP bucket), so each step's all-reduce crosses the switch's bottleneck; the
compute is a few milliseconds. Each item (``--item-kb`` KiB, one HTTP GET on a
fresh connection) becomes a 256-feature tensor (the mean of its bytes in rows
of 256) after a decode costing ``--decode-ms`` of the worker's CPU (default 0).
The DataLoader is PyTorch's default kind (``--workers`` 2,
``--prefetch`` 2, no persistent workers): every ``--epoch-steps`` steps a new
iterator forks new ``pt_data_worker`` processes. With ``--checkpoint-every N``
every N steps rank 0 writes a checkpoint of ``--checkpoint-mb`` MiB into
``--checkpoint-dir`` and fsyncs it while the other ranks wait for it at a
barrier, as a synchronous ``torch.save`` on rank 0 pauses a data-parallel job:
the long step of a real job's natural jitter.

Framework hooks (``reflexarc.actuators.hooks``, job ``--job`` or the
launcher's from the environment, socket in ``--hook-dir``; none with
``--no-hooks``, an unmodified job): every step reports ``step_time_ms``,
``dataloader_batch_wait_ms`` and ``step_pre_collective_ms`` (from the batch
wait to the moment DDP's communication hook receives the gradient bucket) and
reaches a step boundary. The handler
``dataloader.prefetch(prefetch_factor=, num_workers=)`` (with preview and an
undo restoring the settings it replaced) rebuilds the DataLoader iterator at
the next step, mid-epoch, with the new settings.

Stdout, one JSON object per line: ``{"event": "ready", ...}``; per step
``{"event": "step", "ts": wall clock, "rank", "step", "step_ms", "wait_ms", "pre_collective_ms",
"workers", "prefetch"}`` (``step_ms`` from the end of the previous step,
waiting included); after each checkpoint ``{"event": "checkpoint", "ts", "rank",
"step", "ms"}``; ``{"event": "done", ...}``. The ranks agree every step
(a one-float all-reduce) on whether to stop, so ``--duration``, ``--steps`` and
SIGTERM to any rank end them all after the same step.

Example::

    ip netns exec rxtb42r0 env GLOO_SOCKET_IFNAME=rxtb42e0 python -m reflexarc.simulations.testbed.job \\
        --rank 0 --world 2 --master 10.77.0.2:29500 --iface rxtb42e0 --store http://10.77.1.2:80 \\
        --hook-dir /tmp/hooks --job tb --duration 60

Overhead: it is the load. Per step on this 2-core host: ~170 ms of all-reduce
over 200 mbit, a few ms of compute, 16 HTTP GETs per rank in the workers.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import json
import os
import signal
import sys
import tempfile
import threading
import time
from datetime import timedelta
from urllib.parse import urlsplit

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

from reflexarc.actuators.hooks import Hooks
from reflexarc.actuators.loader_settings import LoaderSettings

FEATURES, HIDDEN = 256, 2048


def say(**fields) -> None:
    print(json.dumps({"ts": time.time(), **fields}), flush=True)


class StoreItems(Dataset):
    """``count`` samples of this rank's share of the store, starting at sample ``first``."""

    def __init__(self, url: str, items: int, item_bytes: int, rank: int, world: int, first: int, count: int,
                 decode_ms: float = 0.0) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port or 80
        self.items, self.item_bytes, self.rank, self.world = items, item_bytes, rank, world
        self.first, self.count, self.decode_ms = first, count, decode_ms

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, k: int) -> torch.Tensor:
        i = ((self.first + k) * self.world + self.rank) % self.items
        # A blocking socket: the wait for the store is spent in recvfrom, which the
        # dataloader_io probe times (with a timeout, Python waits in poll() first).
        conn = http.client.HTTPConnection(self.host, self.port)
        try:
            conn.request("GET", f"/item/{i}")
            reply = conn.getresponse()
            body = reply.read()
        finally:
            conn.close()
        if reply.status != 200 or len(body) != self.item_bytes:
            raise OSError(f"item {i}: HTTP {reply.status}, {len(body)} of {self.item_bytes} bytes")
        decode(body, self.decode_ms)
        return torch.frombuffer(bytearray(body), dtype=torch.uint8).view(-1, FEATURES).float().mean(0) / 255.0


def decode(body: bytes, cpu_ms: float) -> None:
    """What a real pipeline's decode and augmentation cost: hash the item until
    this thread has spent ``cpu_ms`` of CPU time (so a worker that shares its CPU
    takes longer in wall time, as a JPEG decode does)."""
    if cpu_ms <= 0:
        return
    end = time.thread_time() + cpu_ms / 1000.0
    while time.thread_time() < end:
        hashlib.sha256(body).digest()


class Feed:
    """Batches for each step; a new DataLoader iterator (new workers) at every
    epoch start and whenever the settings change."""

    def __init__(self, args: argparse.Namespace, settings: LoaderSettings) -> None:
        self.args, self.settings = args, settings
        self.workers, self.prefetch = args.workers, args.prefetch
        self._it = None
        self._end = 0

    def next(self, step: int) -> torch.Tensor:
        current, changed = self.settings.take()
        if self._it is None or step >= self._end or changed:
            self._rebuild(step, current)
        return next(self._it)

    def _rebuild(self, step: int, current: dict) -> None:
        a = self.args
        end = (step // a.epoch_steps + 1) * a.epoch_steps
        data = StoreItems(a.store, a.items, a.item_kb * 1024, a.rank, a.world, step * a.batch, (end - step) * a.batch,
                          a.decode_ms)
        loader = DataLoader(data, batch_size=a.batch, num_workers=current["num_workers"],
                            prefetch_factor=current["prefetch_factor"])
        old, self._it = self._it, iter(loader)     # the new workers start before the old ones are shut down
        self._end, self.workers, self.prefetch = end, loader.num_workers, loader.prefetch_factor
        del old


def checkpoint(args: argparse.Namespace, directory: str) -> float:
    """Rank 0 writes ``--checkpoint-mb`` MiB and fsyncs them, the others wait at
    the barrier; every rank prints how long the pause took."""
    began = time.perf_counter()
    if args.rank == 0:
        chunk = os.urandom(1 << 20)
        path = os.path.join(directory, "checkpoint.bin")
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for _ in range(args.checkpoint_mb):
                os.write(fd, chunk)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(path + ".tmp", path)
    dist.barrier()
    return (time.perf_counter() - began) * 1000.0


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True, help="rank 0's address:port for the rendezvous")
    ap.add_argument("--iface", required=True, help="this rank's interface (GLOO_SOCKET_IFNAME)")
    ap.add_argument("--store", required=True, help="the object store's URL, e.g. http://10.77.1.2:80")
    ap.add_argument("--items", type=int, default=256, help="items in the store")
    ap.add_argument("--item-kb", type=int, default=64)
    ap.add_argument("--job", default=None, help="the job its hooks serve (default: the launcher's job, "
                                                "from its environment)")
    ap.add_argument("--hook-dir", default=None, help="default: $REFLEXARC_HOOK_DIR or /run/reflexarc/hooks")
    ap.add_argument("--no-hooks", action="store_true",
                    help="an unmodified job: serve no framework hooks, report nothing")
    ap.add_argument("--decode-ms", type=float, default=0.0, help="CPU time each item's decode costs a worker")
    ap.add_argument("--compute-ms", type=float, default=0.0,
                    help="time each step spends off the CPU after its update, standing in for an accelerator's "
                         "kernels (a job without a collective is otherwise bound by its loader)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--epoch-steps", type=int, default=100)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--prefetch", type=int, default=2)
    ap.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: none)")
    ap.add_argument("--checkpoint-mb", type=int, default=512, help="MiB rank 0 writes per checkpoint")
    ap.add_argument("--checkpoint-dir", default=None, help="where rank 0 writes it (default: a temporary directory)")
    end = ap.add_mutually_exclusive_group()
    end.add_argument("--steps", type=int, default=None)
    end.add_argument("--duration", type=float, default=None, help="seconds")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    os.environ["GLOO_SOCKET_IFNAME"] = args.iface
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=args.rank, world_size=args.world,
                            timeout=timedelta(seconds=60))
    model = DistributedDataParallel(nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, FEATURES)))
    entered = [0.0]                           # when the step's gradients were ready for the all-reduce

    def timed_allreduce(state, bucket):
        entered[0] = time.perf_counter()
        return allreduce_hook(state, bucket)
    model.register_comm_hook(None, timed_allreduce)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    settings = LoaderSettings(args.prefetch, args.workers)
    feed = Feed(args, settings)
    hooks = None if args.no_hooks else Hooks.start(job=args.job, rank=args.rank, hook_dir=args.hook_dir)
    if hooks is not None:
        hooks.handler("dataloader.prefetch", undo=settings.restore, preview=settings.preview)(settings.set)
    say(event="ready", rank=args.rank, pid=os.getpid(), socket=hooks.path if hooks else None,
        parameters=sum(p.numel() for p in model.parameters()))
    deadline = time.monotonic() + args.duration if args.duration else float("inf")
    step, last = 0, time.perf_counter()
    with hooks or contextlib.nullcontext(), contextlib.ExitStack() as stack:
        checkpoints = args.checkpoint_dir
        if args.checkpoint_every and args.rank == 0 and checkpoints is None:
            checkpoints = stack.enter_context(tempfile.TemporaryDirectory(prefix="reflexarc-checkpoint-"))
        while True:
            waited = time.perf_counter()
            x = feed.next(step)
            got = time.perf_counter()
            opt.zero_grad()
            loss = loss_fn(model(x), x)
            loss.backward()                   # DDP all-reduces the gradients here
            opt.step()
            if args.compute_ms:
                time.sleep(args.compute_ms / 1000.0)
            step += 1
            want = (args.steps is not None and step >= args.steps) or time.monotonic() >= deadline or stopping.is_set()
            stop = torch.tensor([float(want)])
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            now = time.perf_counter()
            step_ms, wait_ms, last = (now - last) * 1000.0, (got - waited) * 1000.0, now
            pre_ms = (entered[0] - waited) * 1000.0
            if hooks is not None:
                hooks.report(step_time_ms=step_ms, dataloader_batch_wait_ms=wait_ms, step_pre_collective_ms=pre_ms,
                             iteration=step)
                hooks.step_boundary()
            say(event="step", rank=args.rank, step=step, step_ms=round(step_ms, 2), wait_ms=round(wait_ms, 2),
                pre_collective_ms=round(pre_ms, 2),
                workers=feed.workers, prefetch=feed.prefetch, loss=round(loss.item(), 6))
            if stop.item() > 0:
                break
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                say(event="checkpoint", rank=args.rank, step=step, ms=round(checkpoint(args, checkpoints), 1))
    say(event="done", rank=args.rank, steps=step)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
