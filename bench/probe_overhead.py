"""Overhead of reflexarc's light and deep probe tiers on real workloads, A/B.

Light tier. Four workloads run with it off (A) and on (B), interleaved in one
run (A/B, B/A, A/B, ...) so drift in the machine's load hits both sides:

* fio: io_uring 4 KiB random reads by one thread (``--thread``, so every
  request is a submit and a complete tracepoint hit of a selected task), once
  from the page cache (CPU-bound: the highest event rate per unit of work) and
  once with O_DIRECT from the disk (completions in interrupt context);
* DataLoader pread: 2 workers (``pt_data_worker``) each item ``pread``-ing
  4 KiB from a page-cached file, batches of 64 stacked into tensors (an I/O
  microloop: the most events per unit of work a loader can make);
* training loader: the same 2-worker DataLoader as an image pipeline loads a
  training job: each item preads 4-64 KiB, decodes it to 3x256x256 uint8 and
  augments it (random resized crop to 224, flip, normalise to float), ~1 ms of
  CPU, batches of 32. Its on/off ratio is the overhead a loaded training
  workload sees.

The tier runs as it does in production, in its own process:
``python -m reflexarc.bpf.manager --watch 0 --comm pt_data_worker --comm fio``,
collecting every second. Reported per workload: throughput A vs B (median of
rounds, and the B/A ratio of each round); CPU time per operation A vs B, which
other load on the machine disturbs less than throughput (fio's own accounting
of its thread; for loaders the workers' and the main process's CPU); the
controller's user-space CPU and RSS; the time from launching the controller to
every probe armed; and, from one more tier-on pass with
``kernel.bpf_stats_enabled`` switched on (and then restored), events/s handled
by the BPF programs, their in-kernel cost (run counts read from the
controller's ``/proc/<pid>/fdinfo``) and that cost per operation: a direct
estimate where the A/B difference is smaller than the machine's noise.

Deep tier (``deep_overhead.py``), with the light tier off: the ``rdma_qp``
probe's uprobes on the post/poll functions of the tests' stand-in verbs
library, A/B interleaved: post/poll pairs per second, µs added per pair,
``probe.events_per_s``, attach and detach time.

Usage (root, from the repository)::

    .venv/bin/python bench/probe_overhead.py [--rounds 4] [--seconds 4] [--deep-seconds 2]

Writes ``bench/results/probe_overhead.json`` and prints Markdown tables.
Overhead of the benchmark itself: ~3.5 minutes on 2 cores, a 256 MiB scratch
file, a gcc build of the stand-in library.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from deep_overhead import markdown_deep, run_deep_rounds, summarise_deep

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


def fio_iops(path: str, seconds: float, *extra: str) -> dict[str, float]:
    """io_uring random 4 KiB reads by one fio thread: IOPS and the thread's CPU
    time per read as fio measures it (interrupt-context work is not in it)."""
    out = subprocess.run(
        ["fio", "--name=overhead", "--thread", "--ioengine=io_uring", "--rw=randread", "--bs=4k",
         "--iodepth=16", f"--size={FILE_BYTES}", f"--filename={path}", f"--runtime={seconds}",
         "--time_based", "--output-format=json", *extra],
        check=True, capture_output=True, text=True).stdout
    job = json.loads(out)["jobs"][0]
    cpu_s = (job["usr_cpu"] + job["sys_cpu"]) / 100 * job["job_runtime"] / 1e3
    return {"throughput": float(job["read"]["iops"]),
            "cpu_us_per_op": 1e6 * cpu_s / max(job["read"]["total_ios"], 1)}


def run_fio_cached(path: str, seconds: float) -> dict[str, float]:
    """From the page cache (fio would otherwise drop the file's pages first):
    CPU-bound, the highest event rate per second of work."""
    return fio_iops(path, seconds, "--invalidate=0")


def run_fio_direct(path: str, seconds: float) -> dict[str, float]:
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


class TrainingDataset(PreadDataset):
    """Item i as in an image-classification input pipeline: an encoded image
    of 4-64 KiB pread from the page-cached file, "decoded" to a 3x256x256
    uint8 tensor (its bytes tiled: a stand-in for JPEG decoding), then
    augmented as torchvision v2 does on uint8 tensors: RandomResizedCrop to
    224x224 (bilinear, antialiased), a random horizontal flip, conversion to
    float normalised with the ImageNet mean/std; the label is i % 1000.
    Seeded by i, so A and B do the same work (~1 ms of CPU per item)."""

    SOURCE, OUT = 256, 224
    MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
    STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)

    def __getitem__(self, i: int):
        import torch
        import torch.nn.functional as F
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDONLY)
        rng = random.Random(i)
        size = rng.randint(1, 16) * 4096
        offset = rng.randrange((FILE_BYTES - size) // 4096 + 1) * 4096
        encoded = torch.frombuffer(bytearray(os.pread(self.fd, size, offset)), dtype=torch.uint8)
        pixels = 3 * self.SOURCE * self.SOURCE
        image = encoded.repeat(pixels // size + 1)[:pixels].view(3, self.SOURCE, self.SOURCE)
        side = rng.randint(self.SOURCE * 5 // 8, self.SOURCE)
        top, left = rng.randint(0, self.SOURCE - side), rng.randint(0, self.SOURCE - side)
        crop = image[:, top:top + side, left:left + side].unsqueeze(0)
        out = F.interpolate(crop, size=(self.OUT, self.OUT), mode="bilinear", align_corners=False,
                            antialias=True)[0]
        if rng.random() < 0.5:
            out = out.flip(2)
        mean = torch.tensor(self.MEAN).view(3, 1, 1)
        std = torch.tensor(self.STD).view(3, 1, 1)
        return (out.float() - mean) / std, i % 1000


def worker_cpu_seconds() -> float:
    """CPU time of this process's DataLoader workers (children named
    ``pt_data_worker``; the controller is a child too, and is left out)."""
    total, me = 0.0, os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        comm, fields = text[text.index("(") + 1:text.rindex(")")], text.rpartition(")")[2].split()
        if comm == "pt_data_worker" and int(fields[1]) == me:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def loader_rate(dataset, batch_size: int, seconds: float) -> dict[str, float]:
    """Items per second through a 2-worker DataLoader, timed after the first
    batch, and the CPU time per item of the workers and the main process
    together (less sensitive than throughput to other load on the machine)."""
    import torch.utils.data as tud
    loader = tud.DataLoader(dataset, batch_size=batch_size, num_workers=2)
    it = iter(loader)
    next(it)
    items, began = 0, time.monotonic()
    cpu_before = worker_cpu_seconds() + time.process_time()
    while time.monotonic() - began < seconds:
        next(it)
        items += batch_size                    # the dataset never runs short
    cpu = worker_cpu_seconds() + time.process_time() - cpu_before
    rate = items / (time.monotonic() - began)
    del it                                     # shuts the workers down
    return {"throughput": rate, "cpu_us_per_op": 1e6 * cpu / items}


def run_dataloader(path: str, seconds: float) -> dict[str, float]:
    return loader_rate(PreadDataset(path), 64, seconds)


def run_training_loader(path: str, seconds: float) -> dict[str, float]:
    """The loaded training-input workload: decode + augment, batches of 32."""
    return loader_rate(TrainingDataset(path), 32, seconds)


def training_item_ms(path: str, items: int = 200) -> float:
    """CPU time of one training item in one thread, as a worker runs it."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                   # as in DataLoader workers
    dataset = TrainingDataset(path)
    try:
        dataset[0]
        began = time.process_time()
        for i in range(items):
            dataset[i]
        return 1e3 * (time.process_time() - began) / items
    finally:
        torch.set_num_threads(threads)
        if dataset.fd is not None:
            os.close(dataset.fd)


TRAINING = "training loader (decode+augment)"
WORKLOADS = {"fio io_uring, page cache": run_fio_cached, "fio io_uring, O_DIRECT": run_fio_direct,
             "DataLoader pread": run_dataloader, TRAINING: run_training_loader}


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
                    row = {"round": r, "mode": mode, "workload": workload, **fn(path, seconds)}
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
    reads are included, so the cost is an upper bound), and that time per
    operation of the workload, absolute and as a share of the operation's CPU:
    a direct estimate of the overhead where A/B noise hides it."""
    before_sysctl = STATS_SYSCTL.read_text().strip()
    STATS_SYSCTL.write_text("1")
    out = {}
    controller = Controller()
    try:
        for workload, fn in WORKLOADS.items():
            warm(path)
            before = controller.snapshot()
            measured = fn(path, seconds)
            after = controller.snapshot()
            dt, events = after["t"] - before["t"], after["runs"] - before["runs"]
            kernel_s_per_s = (after["ns"] - before["ns"]) / 1e9 / dt
            kernel_us_per_op = 1e6 * kernel_s_per_s / measured["throughput"]
            out[workload] = {
                "events_per_s": events / dt,
                "kernel_ns_per_event": (after["ns"] - before["ns"]) / events if events else 0.0,
                "kernel_cpu_pct": 100 * kernel_s_per_s,
                "kernel_us_per_op": kernel_us_per_op,
                "kernel_share_of_op_cpu_pct": 100 * kernel_us_per_op / measured["cpu_us_per_op"],
            }
    finally:
        controller.stop()
        STATS_SYSCTL.write_text(before_sysctl)
    return out


def summarise(runs: list[dict], events: dict[str, dict]) -> dict:
    summary = {}
    for workload in WORKLOADS:
        a = [x for x in runs if x["workload"] == workload and x["mode"] == "A"]
        b = [x for x in runs if x["workload"] == workload and x["mode"] == "B"]
        off, on = (statistics.median(x["throughput"] for x in side) for side in (a, b))
        cpu_off, cpu_on = (statistics.median(x["cpu_us_per_op"] for x in side) for side in (a, b))
        summary[workload] = {
            "throughput_off": off,
            "throughput_on": on,
            "ratio_on_off": on / off,
            "added_us_per_op": 1e6 * (1 / on - 1 / off),
            "round_ratios": [bx["throughput"] / ax["throughput"] for ax, bx in zip(a, b)],
            "cpu_us_per_op_off": cpu_off,
            "cpu_us_per_op_on": cpu_on,
            "cpu_ratio_on_off": cpu_on / cpu_off,
            "cpu_round_ratios": [bx["cpu_us_per_op"] / ax["cpu_us_per_op"] for ax, bx in zip(a, b)],
            **{key: statistics.median(x[key] for x in b)
               for key in ("controller_cpu_pct", "signals_per_s", "controller_rss_mib",
                           "controller_peak_rss_mib", "launch_to_armed_s", "start_to_armed_s")},
            **events[workload],
        }
    return {"summary": summary, "runs": runs}


def ratios(values: list[float]) -> str:
    return " ".join(f"{v:.3f}" for v in values)


def markdown(result: dict) -> str:
    rows = [
        ("throughput, tier off (/s)", "throughput_off", "{:,.0f}"),
        ("throughput, tier on (/s)", "throughput_on", "{:,.0f}"),
        ("ratio on/off (median)", "ratio_on_off", "{:.3f}"),
        ("ratio on/off per round", "round_ratios", None),
        ("time added per operation (us)", "added_us_per_op", "{:.2f}"),
        ("CPU per operation, tier off (us)", "cpu_us_per_op_off", "{:.2f}"),
        ("CPU per operation, tier on (us)", "cpu_us_per_op_on", "{:.2f}"),
        ("CPU ratio on/off (median)", "cpu_ratio_on_off", "{:.3f}"),
        ("CPU ratio on/off per round", "cpu_round_ratios", None),
        ("BPF events handled (/s)", "events_per_s", "{:,.0f}"),
        ("in-kernel cost (ns/event, upper bound)", "kernel_ns_per_event", "{:.0f}"),
        ("in-kernel CPU (% of a core)", "kernel_cpu_pct", "{:.2f}"),
        ("in-kernel time per operation (us)", "kernel_us_per_op", "{:.2f}"),
        ("in-kernel time, % of CPU per operation", "kernel_share_of_op_cpu_pct", "{:.2f}"),
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
        cells = [ratios(result["summary"][n][key]) if fmt is None
                 else fmt.format(result["summary"][n][key]) for n in names]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    t = result["summary"][TRAINING]
    out += ["", f"Loaded training workload ({TRAINING}, {result['training_item_cpu_ms']:.2f} ms of "
            f"CPU per item in one thread), light tier on/off: "
            f"throughput {t['ratio_on_off']:.3f} (rounds: {ratios(t['round_ratios'])}), "
            f"CPU per item {t['cpu_ratio_on_off']:.3f} (rounds: {ratios(t['cpu_round_ratios'])}); "
            f"BPF in-kernel time per item {t['kernel_us_per_op']:.1f} us = "
            f"{t['kernel_share_of_op_cpu_pct']:.2f} % of the item's CPU"]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4,
                    help="A/B rounds (even: each order AB, BA equally often)")
    ap.add_argument("--seconds", type=float, default=4.0, help="per light-tier workload run")
    ap.add_argument("--deep-seconds", type=float, default=2.0, help="per deep-tier run")
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
        warm(path)
        item_ms = training_item_ms(path)
        runs = run_rounds(args.rounds, args.seconds, path)
        result = summarise(runs, run_event_pass(args.seconds, path))
        result["training_item_cpu_ms"] = item_ms
        deep_runs = run_deep_rounds(args.rounds, args.deep_seconds, tmp)
        result["deep_tier"] = {"summary": summarise_deep(deep_runs), "runs": deep_runs}
    result["machine"] = {"kernel": platform.release(), "cpus": os.cpu_count(),
                         "loadavg_at_start": load_at_start, "python": platform.python_version()}
    result["config"] = {"rounds": args.rounds, "seconds": args.seconds,
                        "deep_seconds": args.deep_seconds, "started": began,
                        "wall_s": time.time() - began}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    print()
    print(markdown_deep(result["deep_tier"]["summary"]))
    print(f"\n(wrote {RESULTS.relative_to(HERE.parent)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
