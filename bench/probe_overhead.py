"""Overhead of reflexarc's light probe tier on real workloads, measured A/B.

Three workloads run with the light tier off (A) and on (B), interleaved in one
run (A/B, B/A, A/B, ...) so drift in the machine's load hits both sides:

* fio: io_uring 4 KiB random reads by one thread (``--thread``, so every
  request is a submit and a complete tracepoint hit of a selected task), once
  from the page cache (CPU-bound: the highest event rate per unit of work) and
  once with O_DIRECT from the disk (completions in interrupt context);
* DataLoader: 2 workers (``pt_data_worker``) each item ``pread``-ing 4 KiB
  from a page-cached file, batches of 64 stacked into tensors.

The tier runs as it does in production, in its own process:
``python -m reflexarc.bpf.manager --watch 0 --comm pt_data_worker --comm fio``,
collecting every second. Reported per workload: throughput A vs B (median of
rounds, and the B/A ratio of each round), the controller's user-space CPU and
RSS, the time from launching the controller to every probe armed, and, from
one more tier-on pass with ``kernel.bpf_stats_enabled`` switched on (and then
restored), events/s handled by the BPF programs and their in-kernel cost (run
counts read from the controller's ``/proc/<pid>/fdinfo``).

Usage (root, from the repository)::

    .venv/bin/python bench/probe_overhead.py [--rounds 3] [--seconds 4]

Writes ``bench/results/probe_overhead.json`` and prints a Markdown table.
Overhead of the benchmark itself: ~2.5 minutes, a 256 MiB scratch file.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "probe_overhead.json"
FILE_BYTES = 256 << 20
STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")


# --- workloads ----------------------------------------------------------------
def warm(path: str) -> None:
    """Read the file into the page cache; this machine's DAMON reclaim (kdamond)
    evicts cold file pages within minutes, so every run re-warms."""
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass


def fio_iops(path: str, seconds: float, *extra: str) -> float:
    """io_uring random 4 KiB reads by one fio thread; returns IOPS."""
    out = subprocess.run(
        ["fio", "--name=overhead", "--thread", "--ioengine=io_uring", "--rw=randread", "--bs=4k",
         "--iodepth=16", f"--size={FILE_BYTES}", f"--filename={path}", f"--runtime={seconds}",
         "--time_based", "--output-format=json", *extra],
        check=True, capture_output=True, text=True).stdout
    return float(json.loads(out)["jobs"][0]["read"]["iops"])


def run_fio_cached(path: str, seconds: float) -> float:
    """From the page cache (fio would otherwise drop the file's pages first):
    CPU-bound, the highest event rate per second of work."""
    return fio_iops(path, seconds, "--invalidate=0")


def run_fio_direct(path: str, seconds: float) -> float:
    """O_DIRECT to the disk: completions in interrupt context."""
    return fio_iops(path, seconds, "--direct=1")


class PreadDataset:
    """Item i: 4 KiB at a pseudo-random offset of a page-cached file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = None

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int):
        import torch
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDONLY)
        offset = (i * 2654435761 % (FILE_BYTES // 4096)) * 4096
        return torch.frombuffer(bytearray(os.pread(self.fd, 4096, offset)), dtype=torch.uint8)


def run_dataloader(path: str, seconds: float) -> float:
    """Items per second through a 2-worker DataLoader, timed after the first batch."""
    import torch.utils.data as tud
    loader = tud.DataLoader(PreadDataset(path), batch_size=64, num_workers=2)
    it = iter(loader)
    next(it)
    items, began = 0, time.monotonic()
    while time.monotonic() - began < seconds:
        items += len(next(it))
    rate = items / (time.monotonic() - began)
    del it                                     # shuts the workers down
    return rate


WORKLOADS = {"fio io_uring, page cache": run_fio_cached, "fio io_uring, O_DIRECT": run_fio_direct,
             "DataLoader pread": run_dataloader}


# --- the controller process and what it costs -----------------------------------
def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def bpf_run_stats(pid: int) -> tuple[int, int]:
    """(run_cnt, run_time_ns) summed over the BPF programs the process holds."""
    seen, count, ns = set(), 0, 0
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            text = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        except OSError:
            continue
        info = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
        if "prog_id" in info and "run_cnt" in info and info["prog_id"] not in seen:
            seen.add(info["prog_id"])
            count += int(info["run_cnt"])
            ns += int(info["run_time_ns"])
    return count, ns


class Controller:
    """The light tier in its own process, as ``reflexarc`` runs it."""

    def __init__(self) -> None:
        began = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "reflexarc.bpf.manager", "--watch", "0", "--interval", "1",
             "--comm", "pt_data_worker", "--comm", "fio"],
            stdout=subprocess.PIPE, text=True)
        hello = json.loads(self.proc.stdout.readline())
        self.launch_to_armed_s = time.monotonic() - began
        self.armed_s = hello["armed_s"]
        self.status = hello["status"]
        self.signals = 0
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self.signals += len(json.loads(line)["samples"])

    def snapshot(self) -> dict:
        runs, ns = bpf_run_stats(self.proc.pid)
        return {"t": time.monotonic(), "cpu": cpu_seconds(self.proc.pid), "runs": runs, "ns": ns,
                "signals": self.signals, **memory_kib(self.proc.pid)}

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


# --- the run -------------------------------------------------------------------
def run_rounds(rounds: int, seconds: float, path: str) -> list[dict]:
    """Throughput A/B, interleaved; BPF run statistics stay off (they cost time)."""
    runs: list[dict] = []
    for r in range(rounds):
        for mode in (("A", "B") if r % 2 == 0 else ("B", "A")):
            controller = Controller() if mode == "B" else None
            try:
                for workload, fn in WORKLOADS.items():
                    warm(path)
                    before = controller.snapshot() if controller else None
                    row = {"round": r, "mode": mode, "workload": workload, "throughput": fn(path, seconds)}
                    if controller:
                        after = controller.snapshot()
                        dt = after["t"] - before["t"]
                        row.update({
                            "controller_cpu_pct": 100 * (after["cpu"] - before["cpu"]) / dt,
                            "signals_per_s": (after["signals"] - before["signals"]) / dt,
                            "controller_rss_mib": after["VmRSS"] / 1024,
                            "controller_peak_rss_mib": after["VmHWM"] / 1024,
                            "launch_to_armed_s": controller.launch_to_armed_s,
                            "start_to_armed_s": controller.armed_s,
                            "probe_status": controller.status,
                        })
                    runs.append(row)
                    print(f"round {r} {mode} {workload}: {row['throughput']:,.0f}/s", file=sys.stderr, flush=True)
            finally:
                if controller:
                    controller.stop()
    return runs


def run_event_pass(seconds: float, path: str) -> dict[str, dict]:
    """One more tier-on run per workload with ``kernel.bpf_stats_enabled``: BPF
    program runs per second and their in-kernel time (the statistics' own clock
    reads are included, so the cost is an upper bound)."""
    before_sysctl = STATS_SYSCTL.read_text().strip()
    STATS_SYSCTL.write_text("1")
    out = {}
    controller = Controller()
    try:
        for workload, fn in WORKLOADS.items():
            warm(path)
            before = controller.snapshot()
            fn(path, seconds)
            after = controller.snapshot()
            dt, events = after["t"] - before["t"], after["runs"] - before["runs"]
            out[workload] = {
                "events_per_s": events / dt,
                "kernel_ns_per_event": (after["ns"] - before["ns"]) / events if events else 0.0,
                "kernel_cpu_pct": 100 * (after["ns"] - before["ns"]) / 1e9 / dt,
            }
    finally:
        controller.stop()
        STATS_SYSCTL.write_text(before_sysctl)
    return out


def summarise(runs: list[dict], events: dict[str, dict]) -> dict:
    summary = {}
    for workload in WORKLOADS:
        a = [x["throughput"] for x in runs if x["workload"] == workload and x["mode"] == "A"]
        b = [x for x in runs if x["workload"] == workload and x["mode"] == "B"]
        on = statistics.median(x["throughput"] for x in b)
        summary[workload] = {
            "throughput_off": statistics.median(a),
            "throughput_on": on,
            "ratio_on_off": on / statistics.median(a),
            "added_us_per_op": 1e6 * (1 / on - 1 / statistics.median(a)),
            "round_ratios": [bx["throughput"] / ax for ax, bx in zip(a, b)],
            **{key: statistics.median(x[key] for x in b)
               for key in ("controller_cpu_pct", "signals_per_s", "controller_rss_mib",
                           "controller_peak_rss_mib", "launch_to_armed_s", "start_to_armed_s")},
            **events[workload],
        }
    return {"summary": summary, "runs": runs}


def markdown(result: dict) -> str:
    rows = [
        ("throughput, tier off (/s)", "throughput_off", "{:,.0f}"),
        ("throughput, tier on (/s)", "throughput_on", "{:,.0f}"),
        ("ratio on/off (median)", "ratio_on_off", "{:.3f}"),
        ("ratio on/off per round", "round_ratios", None),
        ("time added per operation (us)", "added_us_per_op", "{:.2f}"),
        ("BPF events handled (/s)", "events_per_s", "{:,.0f}"),
        ("in-kernel cost (ns/event, upper bound)", "kernel_ns_per_event", "{:.0f}"),
        ("in-kernel CPU (% of a core)", "kernel_cpu_pct", "{:.2f}"),
        ("controller CPU (% of a core)", "controller_cpu_pct", "{:.2f}"),
        ("signals emitted (/s)", "signals_per_s", "{:.1f}"),
        ("controller RSS (MiB)", "controller_rss_mib", "{:.0f}"),
        ("controller peak RSS (MiB)", "controller_peak_rss_mib", "{:.0f}"),
        ("launch to all probes armed (s)", "launch_to_armed_s", "{:.2f}"),
        ("start() to all probes armed (s)", "start_to_armed_s", "{:.2f}"),
    ]
    names = list(result["summary"])
    out = ["| metric | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label, key, fmt in rows:
        cells = [" ".join(f"{v:.2f}" for v in result["summary"][n][key]) if fmt is None
                 else fmt.format(result["summary"][n][key]) for n in names]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (BPF)", file=sys.stderr)
        return 2

    load_at_start = os.getloadavg()
    began = time.time()
    with tempfile.TemporaryDirectory(prefix="rx-overhead-") as tmp:
        path = os.path.join(tmp, "data")
        with open(path, "wb") as f:
            for _ in range(FILE_BYTES >> 20):
                f.write(os.urandom(1 << 20))
        runs = run_rounds(args.rounds, args.seconds, path)
        result = summarise(runs, run_event_pass(args.seconds, path))
    result["machine"] = {"kernel": platform.release(), "cpus": os.cpu_count(),
                         "loadavg_at_start": load_at_start, "python": platform.python_version()}
    result["config"] = {"rounds": args.rounds, "seconds": args.seconds, "started": began,
                        "wall_s": time.time() - began}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    print(f"\n(wrote {RESULTS.relative_to(HERE.parent)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
