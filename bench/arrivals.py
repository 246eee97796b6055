"""What taking the step signals as they arrive costs the controller: ``reflexarc
run`` beside one churning DataLoader job, with ``--arrivals 0`` (only the 1 s
tick) and with ``--arrivals 0.2`` (the default), side by side in one run.

The job is ``tests/workloads/epoch_loader.py`` (two new workers every ~1.4 s
epoch, ~130 steps/s, its step signals reported through the framework hooks),
one job for the whole run. Each setting gets ``--rounds`` controller
lifetimes, alternated (0, 0.2, 0, 0.2, ...), each measured over ``--window``
seconds after ``--settle`` seconds (its probes compiled and attached). The
controller is the real CLI in default dry-run with the shipped policies, its
own state directory and the job's hook directory. Reported per setting: the
controller's CPU (utime + stime from /proc/<pid>/stat, % of a core) per
window, the median, and the ratio of the medians.

Usage (root, from the repository)::

    .venv/bin/python bench/arrivals.py             # ~4 min; writes bench/results/arrivals.json

Overhead of the benchmark itself: one /proc read per window.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "reflexarc.controller.cli"]
SETTINGS = (0.0, 0.2)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def window(hook_dir: str, arrivals: float, settle: float, seconds: float) -> float:
    """One controller lifetime; its CPU over ``seconds`` after ``settle``, % of a core."""
    with tempfile.TemporaryDirectory(prefix="reflexarc-arrivals-") as state:
        proc = subprocess.Popen([*CLI, "--state-dir", state, "--hook-dir", hook_dir, "run", "--interval", "1",
                                 "--arrivals", str(arrivals), "--kill-switch", f"{state}/off"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        try:
            time.sleep(settle)
            if proc.poll() is not None:
                raise SystemExit(f"the controller exited ({proc.returncode}) with --arrivals {arrivals}")
            c0, t0 = cpu_seconds(proc.pid), time.monotonic()
            time.sleep(seconds)
            c1, t1 = cpu_seconds(proc.pid), time.monotonic()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    return 100.0 * (c1 - c0) / (t1 - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="controller lifetimes per setting (default %(default)s)")
    ap.add_argument("--window", type=float, default=30.0, help="seconds measured per lifetime")
    ap.add_argument("--settle", type=float, default=15.0, help="seconds after a start not measured")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "arrivals.json"))
    args = ap.parse_args(argv)
    hook_dir = tempfile.mkdtemp(prefix="reflexarc-arrivals-hooks-")
    os.chmod(hook_dir, 0o755)
    job = subprocess.Popen([sys.executable, str(ROOT / "tests" / "workloads" / "epoch_loader.py"), "--duration",
                            str(args.rounds * 2 * (args.window + args.settle + 10) + 30), "--hook-dir", hook_dir,
                            "--job", "churn", "--interval", "5"], stdout=subprocess.DEVNULL, cwd=ROOT)
    started = time.time()
    cpu: dict[float, list[float]] = {a: [] for a in SETTINGS}
    try:
        time.sleep(8)
        for r in range(args.rounds):
            for a in SETTINGS:
                cpu[a].append(round(window(hook_dir, a, args.settle, args.window), 3))
                print(f"round {r + 1}: --arrivals {a:g}: controller {cpu[a][-1]:.2f} % of a core", flush=True)
    finally:
        job.terminate()
        job.wait(timeout=30)
    medians = {a: statistics.median(v) for a, v in cpu.items()}
    doc = {"method": __doc__.split("\n\n")[1].replace("\n", " "),
           "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "loadavg_at_end": os.getloadavg()},
           "started": datetime.fromtimestamp(started).isoformat(timespec="seconds"),
           "window_s": args.window, "settle_s": args.settle,
           "controller_cpu_pct": {f"arrivals_{a:g}": v for a, v in cpu.items()},
           "median_pct": {f"arrivals_{a:g}": round(m, 3) for a, m in medians.items()},
           "ratio_0.2_over_0": round(medians[0.2] / medians[0.0], 3) if medians[0.0] else None}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"median: --arrivals 0 {medians[0.0]:.2f} %, --arrivals 0.2 {medians[0.2]:.2f} % of a core "
          f"({doc['ratio_0.2_over_0']}x); wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
