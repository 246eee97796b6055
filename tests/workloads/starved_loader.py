"""A training loop starved by slow DataLoader reads, wired to reflexarc's hooks.

Each batch needs ``--batch`` items whose reads take ``--read-ms`` each (real
blocking reads, see ``slow_reads.py``); the step itself is quick, so the loop
waits for batches: the wait is all the time between the end of one step's
compute and the arrival of the next batch. Every step reports ``dataloader_batch_wait_ms`` and
``step_time_ms`` through the hooks and reaches a step boundary. The handler
``dataloader.prefetch`` is registered (its preview describes the change) so the
starvation policy can plan it.

Usage: starved_loader.py --job NAME --hook-dir DIR --seconds N
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from reflexarc.actuators.hooks import Hooks  # noqa: E402
from slow_reads import PipeDelayDataset, make_index  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", required=True)
    ap.add_argument("--hook-dir", required=True)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--read-ms", type=float, default=4.0)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    prefetch = {"factor": 2}
    with Hooks.start(job=args.job, rank=0, hook_dir=args.hook_dir) as hooks:
        @hooks.handler("dataloader.prefetch", undo=lambda **kw: prefetch.update(factor=2),
                       preview=lambda **kw: {"before": {"prefetch_factor": prefetch["factor"]},
                                             "after": {"prefetch_factor": kw.get("prefetch_factor", 2)}})
        def raise_prefetch(prefetch_factor: int = 2, **_):
            prefetch["factor"] = prefetch_factor
            return {"prefetch_factor": prefetch_factor}

        index = make_index(os.path.join(tempfile.mkdtemp(), "index.bin"))
        ds = PipeDelayDataset(10**6, args.read_ms / 1000.0, index)
        loader = DataLoader(ds, batch_size=args.batch, num_workers=2, prefetch_factor=2)
        print("ready", flush=True)
        deadline = time.monotonic() + args.seconds
        it = iter(loader)
        step = 0
        done = time.monotonic()
        while time.monotonic() < deadline:
            batch = next(it)
            arrived = time.monotonic()
            torch.as_tensor(batch).float().sum()
            step += 1
            hooks.report(iteration=step, dataloader_batch_wait_ms=(arrived - done) * 1000.0,
                         step_time_ms=(time.monotonic() - done) * 1000.0)
            hooks.step_boundary()
            done = time.monotonic()
    return 0


if __name__ == "__main__":
    sys.exit(main())
