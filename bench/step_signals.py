"""Accuracy of the batch_wait probe's step signals against the job's own
measurements, second by second.

The job is ``tests/workloads/sleepy_trainer.py``, an unmodified training
script (it never imports reflexarc) that prints, for every step, its step time
(end of the previous step to the end of this one), its batch wait (the time in
``next(iterator)``) and when its batch was in hand (``got``,
CLOCK_MONOTONIC). The probe runs in this process and is collected once a
second; each collect's window (previous collect, this collect], on the same
monotonic clock, is compared with the job's steps: the step time with the steps
that ended in the window (the probe closes a step when the loop asks for the
next batch, as the job's own step time does, and counts it when that batch is
read; a hook would report it at the step's end), the wait with the steps
whose batch arrived in it (the probe counts a wait when the training process
reads the batch's header, just before the job has it in hand). Two scenarios,
one endless epoch each:

- ``baseline``: fast items (``--item-ms 1``), 20 ms of accelerator time per
  step: the loader keeps up, the wait is ~0;
- ``starved``: slow items (``--item-ms 40``, 4 per batch, 2 workers), 5 ms
  steps: the loop waits ~70 ms for every batch.

Per scenario and signal: the windows compared, the job's and the probe's mean,
and the median and p90 of the per-window absolute error in % of the job's
value. A wait near zero has no meaningful relative error: the baseline's wait
is reported as its absolute error, also in % of the step time. Windows with
fewer than ``MIN_STEPS`` steps, and the first ``WARMUP_S`` seconds (worker
start), are left out. Target: median <= 5 %, p90 <= 15 %.

The job's batch wait includes, besides the wait, the unpickling of the batch
(torch passes each tensor's shared memory as a file descriptor, over a Unix
socket, while the batch is unpickled: ~0.3-1 ms a batch here) and the Python
around the queue; the probe's is the time from the first poll of the data
queue to the header read, so it reads slightly lower.

The testbed (``--parts testbed``): the 2-rank gloo job of
``reflexarc.simulations.testbed`` (DDP over a 200 mbit bottleneck, every item
fetched over HTTP from the object store), started unmodified (torchrun's
environment, ``--no-hooks``): each rank prints per step ``ts`` (wall clock at
the step's end), ``step_ms`` and ``wait_ms``. The probe runs as the controller
runs it (``ProbeManager``, ``batch_wait`` only, collected every second, the
selection refreshed every ``REFRESH_S``); a sample is the rank's whose
training process (``trainer``) is that rank's pid. A step ended at ``ts`` and
its batch arrived at ``ts - (step_ms - wait_ms)``, which place it in a window,
as ``t`` and ``got`` do above. Phases, each ``--testbed-seconds`` long: ``baseline``, then faults
``a`` (bulk upload sharing the bottleneck), ``b`` (store latency 50 ms per
request) and ``d`` (store serving one request at a time, 20 ms each), each
measured from ``--settle`` s after its onset and followed by ``--recover`` s
without fault. Windows of 1 s, and of ``--slow-window`` s (consecutive
collects merged, the probe's step times weighted by the steps each covers,
``BatchWait.steps_served``, and its waits by its batch counts) for steps
that take a large part of a second. The wait is compared per rank (a fault
slows one rank's loader; the other waits in the all-reduce), each window's
error in % of the job's wait or, where that wait is below 10 % of the step
time, in % of the step time. No per-step comparison: the probe reports
per interval, not per step.

Example::

    python bench/step_signals.py                 # ~5 min: local ~100 s, testbed ~3 min
    python bench/step_signals.py --seconds 20    # shorter local scenarios
    python bench/step_signals.py --parts testbed # keeps the local rows of --out

Writes ``bench/results/step_signals.json`` (``--out``) and prints a table.
Overhead: one bcc compile per part; the workload runs one scenario at a time;
the testbed's job is 2 ranks, 4 workers, the store and a switch namespace.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

from reflexarc.bpf.batch_wait import BatchWait
from reflexarc.bpf.probe import OK, Selection

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "tests" / "workloads" / "sleepy_trainer.py"
SCENARIOS = {
    "baseline": ["--item-ms", "1", "--step-ms", "20", "--batch", "4"],
    "starved": ["--item-ms", "40", "--step-ms", "5", "--batch", "4"],
}
WARMUP_S = 3.0
MIN_STEPS = 3
TARGET = {"median_pct": 5.0, "p90_pct": 15.0}


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of ``values``, linear between order statistics."""
    s = sorted(values)
    if not s:
        return float("nan")
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


class Job:
    """The workload as a subprocess, its JSON lines read by a thread."""

    def __init__(self, args: list[str], seconds: float) -> None:
        self.proc = subprocess.Popen([sys.executable, str(WORKLOAD), *args, "--duration", str(seconds)],
                                     stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
        self.lines: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                pass

    @property
    def pid(self) -> int | None:
        return next((e["pid"] for e in list(self.lines) if e.get("event") == "ready"), None)

    def steps(self) -> list[dict]:
        return [e for e in list(self.lines) if e.get("event") == "step"]

    def wait(self) -> None:
        self.proc.wait(timeout=120)
        self._reader.join(timeout=10)


def run_scenario(probe: BatchWait, name: str, seconds: float) -> dict:
    log(f"{name}: {' '.join(SCENARIOS[name])}, {seconds:.0f} s")
    probe.collect(time.time())                      # start the scenario with empty maps
    job = Job(SCENARIOS[name], seconds)
    windows = []                                    # (start, end, {signal: value}) on the monotonic clock
    last = time.monotonic()
    while job.proc.poll() is None:
        time.sleep(max(0.0, last + 1.0 - time.monotonic()))
        now = time.monotonic()
        samples = probe.collect(time.time())
        pid = job.pid
        values = {n: v for n, labels, v in samples if pid is not None and labels.get("pid") == str(pid)}
        windows.append((last, now, values))
        last = now
    job.wait()
    steps = job.steps()
    if not steps:
        raise SystemExit(f"{name}: the job printed no steps")
    began = steps[0]["got"]
    rows = []
    for start, end, values in windows:
        if start < began + WARMUP_S:
            continue
        inside = [s for s in steps if start < s["t"] <= end and s["step_ms"] is not None]   # ended in it
        fed = [s for s in steps if start < s["got"] <= end]                                   # batch arrived in it
        if len(inside) < MIN_STEPS or not fed or "step_time_ms" not in values:
            continue
        rows.append({"start": round(start, 3), "end": round(end, 3), "steps": len(inside),
                     "job_step_ms": statistics.fmean(s["step_ms"] for s in inside),
                     "job_wait_ms": statistics.fmean(s["wait_ms"] for s in fed),
                     "probe_step_ms": values["step_time_ms"],
                     "probe_wait_ms": values.get("dataloader_batch_wait_ms")})
    return {"args": SCENARIOS[name], "seconds": seconds, "job_steps": len(steps), "windows": rows,
            "summary": summarise(name, rows)}


def summarise(name: str, rows: list[dict], wait_absolute: bool | None = None) -> dict:
    """Per signal: windows, means, median/p90 error. The wait's error is absolute
    (ms, and % of the step) for ``wait_absolute`` (default: the baseline)."""
    if wait_absolute is None:
        wait_absolute = name == "baseline"
    out = {}
    for signal, job_key, probe_key in (("step_time_ms", "job_step_ms", "probe_step_ms"),
                                       ("dataloader_batch_wait_ms", "job_wait_ms", "probe_wait_ms")):
        pairs = [(r[job_key], r[probe_key]) for r in rows if r[probe_key] is not None]
        if not pairs:
            continue
        entry = {"windows": len(pairs), "job_mean": statistics.fmean(j for j, _ in pairs),
                 "probe_mean": statistics.fmean(p for _, p in pairs)}
        if wait_absolute and signal == "dataloader_batch_wait_ms":
            abs_ms = [abs(p - j) for j, p in pairs]
            of_step = [100.0 * abs(r[probe_key] - r[job_key]) / r["job_step_ms"] for r in rows
                       if r[probe_key] is not None]
            entry.update(median_abs_ms=statistics.median(abs_ms), p90_abs_ms=pct(abs_ms, 0.9),
                         median_pct_of_step=statistics.median(of_step), p90_pct_of_step=pct(of_step, 0.9))
            entry["meets_target"] = (entry["median_pct_of_step"] <= TARGET["median_pct"]
                                     and entry["p90_pct_of_step"] <= TARGET["p90_pct"])
        else:
            errs = [100.0 * abs(p - j) / j for j, p in pairs if j > 0]
            entry.update(median_pct=statistics.median(errs), p90_pct=pct(errs, 0.9))
            entry["meets_target"] = (entry["median_pct"] <= TARGET["median_pct"]
                                     and entry["p90_pct"] <= TARGET["p90_pct"])
        out[signal] = entry
    return out


# --- the testbed: a 2-rank gloo job, unmodified, under faults -------------------------------
TESTBED_FAULTS = {"a": "bulk upload on the bottleneck", "b": "store latency 50 ms per request",
                  "d": "store serving one request at a time, 20 ms each"}
REFRESH_S = 5.0          # the controller's selection refresh
TESTBED_WARMUP_S = 5.0   # collects after the job's first steps, not compared
WAIT_NEAR_ZERO = 0.10    # a job wait below this share of its step time is compared in ms


def make_fault(tb, key: str):
    from reflexarc.simulations.testbed.faults import BulkUpload, StoreLatency, StoreSerial
    return {"a": lambda: BulkUpload(tb), "b": lambda: StoreLatency(tb, 50),
            "d": lambda: StoreSerial(tb, 20)}[key]()


class Sampler:
    """The probe manager collected once a second; each collect's window
    (previous collect, this collect] in wall-clock time, with per rank the
    probe's values and its batches in that window."""

    def __init__(self, mgr, ranks: dict[int, int]) -> None:
        self.mgr, self.ranks = mgr, ranks          # ranks: {training process pid: rank}
        self.windows: list[tuple[float, float, dict[int, dict]]] = []
        self.rank_labels: dict[int, str] = {}      # rank -> the rank label job discovery gave its samples
        self.last = time.time()
        self._totals: dict[int, float] = {}
        self._refresh = time.monotonic() + REFRESH_S

    def tick(self) -> None:
        time.sleep(max(0.0, self.last + 1.0 - time.time()))
        now = time.time()
        samples = self.mgr.collect(now)
        served = self.mgr.probe("batch_wait").steps_served
        per: dict[int, dict] = {}
        for pid, rank in self.ranks.items():
            per.setdefault(rank, {})["served"] = served.get(pid, 0)
        for name, labels, value in samples:
            pid = labels.get("trainer") or labels.get("pid")
            rank = self.ranks.get(int(pid)) if pid and str(pid).isdigit() else None
            if rank is None:
                continue
            if "rank" in labels:
                self.rank_labels[rank] = labels["rank"]
            if name == "dataloader_batches_total":
                prev = self._totals.get(rank)
                self._totals[rank] = value
                per.setdefault(rank, {})["batches"] = None if prev is None else value - prev
            else:
                per.setdefault(rank, {})[name] = value
        self.windows.append((self.last, now, per))
        self.last = now
        if time.monotonic() >= self._refresh:          # after the collect: not inside a window's edge
            self.mgr.refresh_selection()
            self._refresh = time.monotonic() + REFRESH_S

    def run_until(self, t: float) -> None:
        while time.time() < t:
            self.tick()


def arrived(step: dict) -> float:
    """Wall-clock time the step's batch was in hand: its end less what followed the wait."""
    return step["ts"] - (step["step_ms"] - step["wait_ms"]) / 1000.0


def weighted(vals: list[dict], key: str, by: str) -> float | None:
    """The mean of ``key`` over the collects with some ``by`` (``batches``: the
    batches taken, for the wait; ``served``: the steps the step time covers),
    weighted by it."""
    pairs = [(v[key], v[by]) for v in vals if v.get(by) and key in v]
    total = sum(n for _, n in pairs)
    return sum(x * n for x, n in pairs) / total if total else None


def testbed_rows(windows, steps: dict[int, list[dict]], t0: float, t1: float, merge: int) -> list[dict]:
    """Per rank, the windows inside [t0, t1] (``merge`` consecutive collects each)
    with at least ``MIN_STEPS`` of the job's steps and a probe value."""
    from reflexarc.simulations.testbed.topology import EPOCH_STEPS as epoch_steps
    inside = [w for w in windows if w[0] >= t0 and w[1] <= t1]
    rows = []
    for rank, rank_steps in steps.items():
        for i in range(0, len(inside) - merge + 1, merge):
            group = inside[i:i + merge]
            start, end = group[0][0], group[-1][1]
            vals = [w[2].get(rank, {}) for w in group]
            if merge == 1:
                probe_step, probe_wait = vals[0].get("step_time_ms"), vals[0].get("dataloader_batch_wait_ms")
            else:                       # the probe's means over the merged window, by batch counts
                if any(v.get("batches") is None for v in vals):
                    continue
                batches = sum(v["batches"] for v in vals)
                if not batches:
                    continue
                probe_step = weighted(vals, "step_time_ms", "served")
                probe_wait = weighted(vals, "dataloader_batch_wait_ms", "batches")
            job = [s for s in rank_steps if start < s["ts"] <= end]          # steps that ended in the window
            fed = [s for s in rank_steps if start < arrived(s) <= end]       # steps whose batch arrived in it
            if len(job) < MIN_STEPS or not fed or probe_step is None:
                continue
            rows.append({"rank": rank, "start": round(start, 3), "end": round(end, 3), "steps": len(job),
                         # a new DataLoader iterator (new workers, a new data queue) began this step
                         "epoch_start": any(s["step"] % epoch_steps == 1 for s in job),
                         "probe_batches": sum(v.get("batches") or 0 for v in vals),
                         "job_step_ms": statistics.fmean(s["step_ms"] for s in job),
                         "job_wait_ms": statistics.fmean(s["wait_ms"] for s in fed),
                         "probe_step_ms": probe_step, "probe_wait_ms": probe_wait})
    return rows


def wait_summary(rows: list[dict]) -> dict:
    """The wait's error per window in % of the job's wait, or, where that wait is
    below ``WAIT_NEAR_ZERO`` of the window's step time (no meaningful relative
    error), in % of the step time; also the absolute errors (ms)."""
    pairs = [r for r in rows if r["probe_wait_ms"] is not None]
    if not pairs:
        return {}
    errs, small = [], 0
    for r in pairs:
        j, p = r["job_wait_ms"], r["probe_wait_ms"]
        if j >= WAIT_NEAR_ZERO * r["job_step_ms"]:
            errs.append(100.0 * abs(p - j) / j)
        else:
            errs.append(100.0 * abs(p - j) / r["job_step_ms"])
            small += 1
    abs_ms = [abs(r["probe_wait_ms"] - r["job_wait_ms"]) for r in pairs]
    entry = {"windows": len(pairs), "windows_of_step": small,
             "job_mean": statistics.fmean(r["job_wait_ms"] for r in pairs),
             "probe_mean": statistics.fmean(r["probe_wait_ms"] for r in pairs),
             "median_pct": statistics.median(errs), "p90_pct": pct(errs, 0.9),
             "median_abs_ms": statistics.median(abs_ms), "p90_abs_ms": pct(abs_ms, 0.9)}
    entry["meets_target"] = entry["median_pct"] <= TARGET["median_pct"] and entry["p90_pct"] <= TARGET["p90_pct"]
    return entry


def testbed_summary(name: str, rows: list[dict]) -> dict:
    """The step time over both ranks (a synchronous job: one step time); the wait
    per rank (``wait_summary``), since a fault slows one rank's loader while the
    other waits in the all-reduce instead."""
    if not rows:
        return {}
    out = {"step_time_ms": summarise(name, rows, wait_absolute=False)["step_time_ms"], "by_rank": {}}
    for rank in sorted({r["rank"] for r in rows}):
        mine = [r for r in rows if r["rank"] == rank]
        entry = {"step_time_ms": summarise(name, mine, wait_absolute=False)["step_time_ms"]}
        wait = wait_summary(mine)
        if wait:
            entry["dataloader_batch_wait_ms"] = out[f"dataloader_batch_wait_ms r{rank}"] = wait
        out["by_rank"][str(rank)] = entry
    steady = [r for r in rows if r.get("epoch_start") is False]
    if steady and len(steady) < len(rows) and all("epoch_start" in r for r in rows):
        # the same, without the windows of an epoch start
        out["without_epoch_start"] = {k: v for k, v in testbed_summary(name, steady).items()
                                      if k != "without_epoch_start"}
    return out


def resummarise(res: dict) -> dict:
    """The testbed's summaries again, from the windows stored in ``res``."""
    for name, entry in res["scenarios"].items():
        for label in ("1s", f"{res['slow_window_s']}s"):
            entry[label]["summary"] = testbed_summary(name, entry[label]["windows"])
    return res


def run_testbed(seconds: float, settle: float, recover: float, faults: list[str], slow_window: int) -> dict:
    from reflexarc.bpf.manager import ProbeManager
    from reflexarc.simulations.testbed.topology import Testbed

    phases: dict[str, tuple[float, float]] = {}
    onsets: dict[str, float] = {}
    with Testbed(ranks=2) as tb:
        log(f"testbed {tb.prefix}: starting the job (2 ranks, unmodified)")
        job = tb.start_job(duration=None, hooks=False)
        try:
            # the training processes: the pids the ranks printed (``ip netns exec`` execs, so job.ranks[i].pid too)
            ranks = {line["pid"]: line["rank"] for r in job.ranks for line in r.lines()
                     if line.get("event") == "ready"}
            if sorted(ranks.values()) != [r.rank for r in job.ranks]:
                raise SystemExit(f"testbed: ready lines {ranks} do not name every rank")
            if set(ranks) != set(job.pids):
                log(f"testbed: ready pids {sorted(ranks)} differ from the launched {job.pids}; using the former")
            mgr = ProbeManager(Selection(comms=("pt_data_worker",)), probes=["batch_wait"])
            status = mgr.start()["batch_wait"]
            if status.state != OK:
                raise SystemExit(f"batch_wait probe: {status}")
            try:
                deadline = time.time() + 60
                while not all(job.steps(rank=r.rank) for r in job.ranks):
                    if time.time() > deadline:
                        raise SystemExit("testbed: no step from every rank within 60 s")
                    time.sleep(0.5)
                sampler = Sampler(mgr, ranks)
                sampler.run_until(time.time() + TESTBED_WARMUP_S)
                log(f"testbed baseline: {seconds:.0f} s")
                t0 = time.time()
                sampler.run_until(t0 + seconds)
                phases["baseline"] = (t0, time.time())
                for key in faults:
                    fault = make_fault(tb, key)
                    log(f"testbed fault {key} ({TESTBED_FAULTS[key]}): {settle:.0f} s settle + {seconds:.0f} s")
                    onsets[key] = fault.start()
                    try:
                        sampler.run_until(onsets[key] + settle)
                        t0 = time.time()
                        sampler.run_until(t0 + seconds)
                        phases[key] = (t0, time.time())
                    finally:
                        fault.stop()
                    sampler.run_until(time.time() + recover)
            finally:
                mgr.stop()
            steps = {r.rank: job.steps(rank=r.rank) for r in job.ranks}
        finally:
            job.stop()
    out = {"job": "simulations/testbed/job.py, 2 ranks, gloo, unmodified (torchrun environment, --no-hooks)",
           "seconds": seconds, "settle_s": settle, "recover_s": recover, "slow_window_s": slow_window,
           "rank_pids": {str(rank): pid for pid, rank in ranks.items()},
           "rank_labels": {str(k): v for k, v in sampler.rank_labels.items()},
           "job_steps": {str(k): len(v) for k, v in steps.items()}, "scenarios": {}}
    for name, (t0, t1) in phases.items():
        entry = {"fault": TESTBED_FAULTS.get(name), "onset": onsets.get(name), "from": t0, "to": t1,
                 "job_steps": sum(1 for v in steps.values() for s in v if t0 < s["ts"] <= t1)}
        for label, merge in (("1s", 1), (f"{slow_window}s", slow_window)):
            rows = testbed_rows(sampler.windows, steps, t0, t1, merge)
            entry[label] = {"summary": testbed_summary(name, rows), "windows": rows}
        out["scenarios"][name] = entry
    return out


def testbed_table(res: dict) -> str:
    lines = [f"{'testbed':<9} {'window':>6} {'signal':<27} {'windows':>7} {'job ms':>8} {'probe ms':>9} "
             f"{'median err':>18} {'p90 err':>18} {'target':>6}"]
    for name, entry in res["scenarios"].items():
        for label in ("1s", f"{res['slow_window_s']}s"):
            summary = entry[label]["summary"]
            if not summary:
                lines.append(f"{name:<9} {label:>6} (no window with {MIN_STEPS} steps)")
            for signal, e in summary.items():
                if signal in ("by_rank", "without_epoch_start"):
                    continue
                med, p90 = f"{e['median_pct']:.1f} %", f"{e['p90_pct']:.1f} %"
                if "median_abs_ms" in e:
                    med += f" ({e['median_abs_ms']:.1f} ms)"
                    p90 += f" ({e['p90_abs_ms']:.1f} ms)"
                lines.append(f"{name:<9} {label:>6} {signal:<27} {e['windows']:>7} {e['job_mean']:>8.2f} "
                             f"{e['probe_mean']:>9.2f} {med:>18} {p90:>18} {'met' if e['meets_target'] else 'MISS':>6}")
    lines.append("(step time: both ranks' windows. wait: per rank; a window's error in % of the job's wait, or "
                 "in % of the step time where the job's wait is below 10 % of it; in parentheses in ms)")
    return "\n".join(lines)


def table(results: dict) -> str:
    lines = [f"{'scenario':<9} {'signal':<25} {'windows':>7} {'job ms':>8} {'probe ms':>9} "
             f"{'median err':>11} {'p90 err':>9}"]
    for name, res in results.items():
        for signal, e in res["summary"].items():
            if "median_pct" in e:
                med, p90 = f"{e['median_pct']:.1f} %", f"{e['p90_pct']:.1f} %"
            else:
                med = f"{e['median_abs_ms']:.2f} ms"
                p90 = f"{e['p90_abs_ms']:.2f} ms"
            lines.append(f"{name:<9} {signal:<25} {e['windows']:>7} {e['job_mean']:>8.2f} "
                         f"{e['probe_mean']:>9.2f} {med:>11} {p90:>9}")
    base = results.get("baseline", {}).get("summary", {}).get("dataloader_batch_wait_ms")
    if base:
        lines.append(f"(baseline wait: the error is {base['median_pct_of_step']:.1f} % of the step time at the "
                     f"median, {base['p90_pct_of_step']:.1f} % at p90)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=45.0, help="seconds per local scenario")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated: baseline,starved")
    ap.add_argument("--parts", default="local,testbed", help="comma-separated: local,testbed; a part left "
                                                              "out keeps its results from --out")
    ap.add_argument("--testbed-seconds", type=float, default=30.0, help="seconds measured per testbed phase")
    ap.add_argument("--settle", type=float, default=4.0, help="seconds after a fault's onset not measured")
    ap.add_argument("--recover", type=float, default=4.0, help="seconds without fault between testbed phases")
    ap.add_argument("--faults", default=",".join(TESTBED_FAULTS), help="comma-separated testbed faults: a,b,d")
    ap.add_argument("--slow-window", type=int, default=5, help="seconds of the testbed's longer windows")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "step_signals.json"))
    ap.add_argument("--resummarise", action="store_true",
                    help="measure nothing: recompute the testbed's summaries from the windows in --out")
    args = ap.parse_args(argv)
    parts = args.parts.split(",")
    if args.resummarise:
        doc = json.loads(Path(args.out).read_text())
        doc["testbed"] = resummarise(doc["testbed"])
        paragraphs = __doc__.split("\n\n")
        doc["method"] = paragraphs[1:4] + paragraphs[5:6]
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(table(doc["scenarios"]))
        print(testbed_table(doc["testbed"]))
        return 0
    try:
        previous = json.loads(Path(args.out).read_text())
    except (OSError, ValueError):
        previous = {}

    results = previous.get("scenarios", {}) if "local" not in parts else {}
    if "local" in parts:
        probe = BatchWait(Selection(comms=("pt_data_worker",)))
        status = probe.start()
        if status.state != OK:
            raise SystemExit(f"batch_wait probe: {status}")
        try:
            for name in args.scenarios.split(","):
                results[name] = run_scenario(probe, name, args.seconds)
        finally:
            probe.stop()
    testbed = previous.get("testbed") if "testbed" not in parts else None
    if "testbed" in parts:
        testbed = run_testbed(args.testbed_seconds, args.settle, args.recover, args.faults.split(","),
                              args.slow_window)
    load = os.getloadavg()
    paragraphs = __doc__.split("\n\n")
    doc = {"method": paragraphs[1:4] + paragraphs[5:6], "target": TARGET,
           "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "loadavg": load},
           "date": datetime.now().isoformat(timespec="seconds"), "parts_run": parts,
           "scenarios": results, "testbed": testbed}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(table(results))
    if testbed:
        print(testbed_table(testbed))
    print(f"(load average {load[0]:.2f}; written to {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
