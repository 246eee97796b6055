"""Controller cost under DataLoader worker churn: job throughput with and without
``reflexarc run``, and the controller's CPU and RSS over a long run.

The job is ``tests/workloads/epoch_loader.py``: a default DataLoader (2 workers,
no ``persistent_workers``) that starts two new ``pt_data_worker`` processes every
~1.4 s epoch, each item a real ``pread`` plus ~0.7 ms of tensor work, a tiny SGD
step per batch, step signals reported through reflexarc's framework hooks. One
job runs for the whole benchmark, so the churn accumulates as on a node.

The controller is the real CLI, as a node runs it: ``reflexarc run`` (live bcc
probes, the shipped policies, default dry-run), with its own ``--state-dir``,
``--audit`` and kill-switch path in a temporary directory, ``--hook-dir`` at the
job's hook directory and, unless ``--no-metrics``, ``--metrics-port`` on loopback
(scraped once per sample, as Prometheus would).

Two measurements need two controller lifetimes, so there are two phases:

1. Throughput A/B. ``--pairs`` pairs of ``--window``-second job windows, ON/OFF,
   then OFF/ON, ... (each order equally often, so drift hits both sides). The
   controller is started for each ON window and stopped after it, because "off"
   must mean no probes attached: a stopped (SIGSTOPped) controller would leave
   its BPF programs running. Each window starts ``--settle`` seconds after the
   controller's probes are armed (its LLVM compile is not in the window) or after
   it exited. Reported: steps/s per window, the ON/OFF ratio of each pair, median,
   min and max. These controllers are young (tens of seconds), so this phase
   shows the cost of the probes and of a controller that has seen little churn.
2. Long run. One controller runs ``--long`` seconds beside the job, sampled every
   ``--sample`` seconds: its CPU (utime+stime from /proc/<pid>/stat, % of a
   core), RSS, the job's steps/s, the worker pids started so far, the machine's
   busy CPU and the rest of the machine's load (busy minus controller minus
   job), and from the metrics endpoint the rule targets the controller holds
   (its ``reflexarc_rule_targets`` gauge where it has one, else the distinct
   (policy, rule, target) of ``reflexarc_rule_state``), transitions and samples
   per source. The run is cut in thirds (180 s: minutes one, two, three);
   CPU and RSS of the last third over the second (the first is start-up) show
   whether the controller's cost grows with the churn. The first third is
   reported too: a controller whose tick has grown past its 1 s interval runs
   flat out, and its CPU stops growing while its targets keep growing (both
   are in the table). One more OFF window right after the long run gives the
   job's throughput without controller to compare the last third with: the
   cost of an aged controller.

Targets (the product's goals), printed met / not met: controller CPU and RSS
flat (last third <= 1.2x the second), job throughput with the controller within
2 % of without (A/B median ratio >= 0.98, and last third of the long run vs the
OFF window after it >= 0.98). The probes select every ``pt_data_worker`` on the
machine, so other DataLoaders running meanwhile add to the controller's work:
their pids are counted (``foreign_workers``, from a /proc scan every 0.25 s),
and the rest of the machine's load is in every window and sample, to judge the
noise.

Usage (root, from the repository)::

    .venv/bin/python bench/churn.py            # ~6.5 min; writes bench/results/churn.json
    .venv/bin/python bench/churn.py --quick    # ~45 s; writes $TMPDIR/reflexarc-churn-quick.json

Overhead of the benchmark itself: the job keeps both cores busy for the whole
run; the benchmark process scans /proc every 0.25 s (~1 % of a core, counted in
"other load").
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from provenance import code_version, interrupted

from reflexarc.bpf import catalog
from reflexarc.simulations.testbed.local_server import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORKLOAD = ROOT / "tests" / "workloads" / "epoch_loader.py"
RESULTS = HERE / "results" / "churn.json"
TICK = os.sysconf("SC_CLK_TCK")
WORKER_COMM = "pt_data_worker"
TARGET_FLAT = 1.2
TARGET_THROUGHPUT = 0.98


# --- /proc -----------------------------------------------------------------------
def proc_stat(pid: int) -> tuple[str, list[str]] | None:
    """(comm, fields after the comm) of /proc/<pid>/stat; None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.index("(") + 1:text.rindex(")")], text.rpartition(")")[2].split()


def cpu_seconds(fields: list[str], children: bool = False) -> float:
    """utime+stime (and, with ``children``, cutime+cstime of reaped children)."""
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (all but idle and iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / TICK


def scan_workers(job_pid: int) -> tuple[float, set[int]]:
    """CPU seconds of the job's live children (its DataLoader workers), and the
    pids of other processes named ``pt_data_worker``."""
    total, foreign = 0.0, set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = proc_stat(int(entry))
        if st is None:
            continue
        comm, fields = st
        if int(fields[1]) == job_pid:
            total += cpu_seconds(fields)
        elif comm == WORKER_COMM:
            foreign.add(int(entry))
    return total, foreign


# --- the job -----------------------------------------------------------------------
class Job:
    """The epoch workload, in its own process group, its progress lines read as they come."""

    def __init__(self, hook_dir: str, job: str) -> None:
        self.stderr = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKLOAD), "--hook-dir", hook_dir, "--job", job, "--interval", "0.25"],
            stdout=subprocess.PIPE, stderr=self.stderr, text=True, start_new_session=True)
        self.pid = self.proc.pid
        self.lines: list[tuple[float, dict]] = []       # (monotonic time received, record)
        self.foreign: dict[int, float] = {}             # other DataLoaders' workers: pid -> first seen
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._watch, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            rec = json.loads(line)
            with self._lock:
                self.lines.append((time.monotonic(), rec))

    def _watch(self) -> None:
        """Every 0.25 s: note other processes' DataLoader workers (the controller
        watches them too); they live ~1 s or more, so few are missed."""
        while not self._stopped.wait(0.25):
            _, foreign = scan_workers(self.pid)
            now = time.monotonic()
            for pid in foreign:
                self.foreign.setdefault(pid, now)

    def foreign_started(self, t0: float, t1: float) -> int:
        return sum(t0 <= t <= t1 for t in list(self.foreign.values()))

    def latest(self) -> dict:
        with self._lock:
            return self.lines[-1][1] if self.lines else {}

    def wait_epochs(self, epochs: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.latest().get("epochs", 0) < epochs:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stderr.seek(0)
                raise RuntimeError(f"workload did not reach epoch {epochs}: {self.stderr.read()[-2000:]}")
            time.sleep(0.1)

    def rate(self, t0: float, t1: float) -> dict:
        """Steps/s and items/s between the first progress record received after
        ``t0`` and the last one received before ``t1``, on the job's own clock."""
        with self._lock:
            inside = [r for t, r in self.lines if t0 <= t <= t1 and "steps" in r]
        if len(inside) < 2 or inside[-1]["elapsed"] <= inside[0]["elapsed"]:
            raise RuntimeError(f"no progress from the workload between {t0:.1f} and {t1:.1f}")
        a, b = inside[0], inside[-1]
        dt = b["elapsed"] - a["elapsed"]
        return {"steps_per_s": (b["steps"] - a["steps"]) / dt, "items_per_s": (b["items"] - a["items"]) / dt,
                "epochs": b["epochs"] - a["epochs"], "workers_started": b["workers"] - a["workers"],
                "workers_total": b["workers"], "foreign_workers_started": self.foreign_started(t0, t1)}

    def cpu(self) -> float:
        """Cumulative CPU seconds of the job: itself, its reaped and its live workers."""
        st = proc_stat(self.pid)
        return (cpu_seconds(st[1], children=True) if st else 0.0) + scan_workers(self.pid)[0]

    def stop(self) -> None:
        self._stopped.set()
        stop_group(self.proc, 20)
        self.stderr.close()


def stop_group(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM the process group, then SIGKILL it if it has not exited in ``timeout`` s."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)      # stragglers of the group too
    except ProcessLookupError:
        pass
    proc.wait()


# --- the controller ----------------------------------------------------------------
def reflexarc_command() -> list[str]:
    script = Path(sys.executable).with_name("reflexarc")
    return [str(script)] if script.exists() else [sys.executable, "-m", "reflexarc.controller.cli"]


class Controller:
    """``reflexarc -v run`` in its own process group; ready once it logged the
    status of every light probe (``reflexarc.probes`` lines on stderr)."""

    def __init__(self, tmp: Path, label: str, hook_dir: str, job: str, metrics: bool) -> None:
        state = tmp / f"state-{label}"
        self.port = free_port() if metrics else None
        cmd = reflexarc_command() + ["-v", "--state-dir", str(state), "--hook-dir", hook_dir, "run",
                                     "--job", job, "--interval", "1", "--audit", str(state / "audit.jsonl"),
                                     "--kill-switch", str(tmp / "disable")]
        if self.port:
            cmd += ["--metrics-port", str(self.port)]
        self.launched = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.pid = self.proc.pid
        self.stderr: list[str] = []
        self.probes: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + 60
        try:
            while not self.ready.wait(0.1):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("controller did not start: " + "".join(self.stderr[-20:]))
        except BaseException:                  # also Ctrl-C while it starts
            stop_group(self.proc, 10)
            raise
        self.launch_to_ready_s = time.monotonic() - self.launched

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.stderr = (self.stderr + [line])[-200:]
            if " reflexarc.probes " in line:
                self.probes.append(line.split(" reflexarc.probes INFO ", 1)[-1].strip())
                if len(self.probes) >= len(catalog.names(catalog.LIGHT)):
                    self.ready.set()

    def snapshot(self) -> dict:
        st = proc_stat(self.pid)
        if st is None or self.proc.poll() is not None:
            raise RuntimeError("controller exited: " + "".join(self.stderr[-20:]))
        return {"cpu_s": cpu_seconds(st[1]), "rss_mib": rss_mib(self.pid)}

    def metrics(self) -> dict | None:
        """Rule targets (the ``reflexarc_rule_targets`` gauge where the controller
        exports it, else the distinct label sets of ``reflexarc_rule_state``),
        transitions and samples per source, from the metrics endpoint."""
        if not self.port:
            return None
        from prometheus_client.parser import text_string_to_metric_families
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            text = r.read().decode()
        targets, gauge, transitions, samples = set(), None, 0.0, {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "reflexarc_rule_state":
                    targets.add((s.labels["policy"], s.labels["rule"], s.labels["target"]))
                elif s.name == "reflexarc_rule_targets":
                    gauge = int(s.value)
                elif s.name == "reflexarc_transitions_total":
                    transitions += s.value
                elif s.name == "reflexarc_signal_samples_total":
                    samples[s.labels["source"]] = s.value
        per_rule: dict[str, int] = {}
        for policy, rule, _ in targets:
            per_rule[f"{policy}/{rule}"] = per_rule.get(f"{policy}/{rule}", 0) + 1
        return {"rule_targets": len(targets) if gauge is None else gauge, "rule_targets_gauge": gauge,
                "rule_state_series": len(targets), "rule_targets_per_rule": per_rule,
                "transitions": transitions, "signal_samples": samples}

    def stop(self) -> dict:
        """SIGTERM (the controller shuts down cleanly) and its summary line."""
        out = ""
        if self.proc.poll() is None:
            os.killpg(self.pid, signal.SIGTERM)
            try:
                out, _ = self.proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        stop_group(self.proc, 0)
        lines = [line for line in (out or "").splitlines() if line.startswith("{")]
        return json.loads(lines[0]) if lines else {"exit": self.proc.returncode}


# --- the phases --------------------------------------------------------------------
class Meter:
    """CPU of the controller, the job and the machine between two points in time."""

    def __init__(self, job: Job, controller: Controller | None) -> None:
        self.job, self.controller = job, controller
        self.t, self.mark = time.monotonic(), self._read()

    def _read(self) -> dict:
        ctl = self.controller.snapshot() if self.controller else {"cpu_s": 0.0, "rss_mib": None}
        return {**ctl, "job_cpu_s": self.job.cpu(), "busy_s": machine_busy_s()}

    def lap(self) -> dict:
        t, now = time.monotonic(), self._read()
        dt = t - self.t
        pct = {k: 100 * (now[k] - self.mark[k]) / dt for k in ("cpu_s", "job_cpu_s", "busy_s")}
        self.t, self.mark = t, now
        return {"t0": t - dt, "t1": t, "controller_cpu_pct": pct["cpu_s"], "controller_rss_mib": now["rss_mib"],
                "job_cpu_pct": pct["job_cpu_s"], "machine_busy_pct": pct["busy_s"],
                "other_load_pct": pct["busy_s"] - pct["cpu_s"] - pct["job_cpu_s"]}


def window(job: Job, controller: Controller | None, seconds: float, settle: float) -> dict:
    time.sleep(settle)
    meter = Meter(job, controller)
    time.sleep(seconds)
    lap = meter.lap()
    row = {**lap, **job.rate(lap["t0"], lap["t1"])}
    if controller:
        row["metrics"] = controller.metrics()
    return row


def ab_phase(job: Job, tmp: Path, args, hook_dir: str, name: str) -> list[dict]:
    rows = []
    for pair in range(args.pairs):
        for mode in (("on", "off") if pair % 2 == 0 else ("off", "on")):
            ctl = Controller(tmp, f"ab{len(rows)}", hook_dir, name, not args.no_metrics) if mode == "on" else None
            try:
                row = {"pair": pair, "mode": mode, **window(job, ctl, args.window, args.settle)}
            finally:
                summary = ctl.stop() if ctl else None
            if ctl:
                row.update(launch_to_ready_s=ctl.launch_to_ready_s, controller_summary=summary)
            rows.append(row)
            say(f"pair {pair} {mode:3s}: {row['steps_per_s']:6.1f} steps/s, controller "
                f"{row['controller_cpu_pct']:5.1f} %, other load {row['other_load_pct']:5.1f} %")
    return rows


def long_phase(job: Job, tmp: Path, args, hook_dir: str, name: str) -> dict:
    ctl = Controller(tmp, "long", hook_dir, name, not args.no_metrics)
    samples = []
    try:
        began = time.monotonic()
        meter = Meter(job, ctl)
        for k in range(max(1, round(args.long / args.sample))):
            time.sleep(max(0.0, began + (k + 1) * args.sample - time.monotonic()))
            lap = meter.lap()
            row = {"t": lap["t1"] - began, **lap, **job.rate(lap["t0"], lap["t1"]), "metrics": ctl.metrics()}
            samples.append(row)
            m = row["metrics"] or {}
            say(f"long {row['t']:5.0f} s: controller {row['controller_cpu_pct']:5.1f} % "
                f"{row['controller_rss_mib']:5.0f} MiB, job {row['steps_per_s']:6.1f} steps/s, "
                f"workers {row['workers_total']} (+{row['foreign_workers_started']} foreign), "
                f"targets {m.get('rule_targets', '-')}, "
                f"other load {row['other_load_pct']:5.1f} %")
    finally:
        summary = ctl.stop()
    return {"launch_to_ready_s": ctl.launch_to_ready_s, "probes": ctl.probes, "samples": samples,
            "controller_summary": summary}


# --- summary -------------------------------------------------------------------------
def thirds(samples: list[dict], value) -> tuple[float, float, float]:
    """Mean of ``value(sample)`` over each third of the long run."""
    n = len(samples)
    parts = (samples[:n // 3], samples[n // 3:2 * n // 3], samples[2 * n // 3:])
    return tuple(statistics.fmean(value(s) for s in part) if part else float("nan") for part in parts)


def summarise(ab: list[dict], long: dict, after: dict) -> dict:
    pairs = []
    for p in sorted({r["pair"] for r in ab}):
        on = next(r for r in ab if r["pair"] == p and r["mode"] == "on")
        off = next(r for r in ab if r["pair"] == p and r["mode"] == "off")
        pairs.append(on["steps_per_s"] / off["steps_per_s"])
    samples = long["samples"]
    cpu1, cpu2, cpu3 = thirds(samples, lambda r: r["controller_cpu_pct"])
    _, rss2, rss3 = thirds(samples, lambda r: r["controller_rss_mib"])
    _, job2, job3 = thirds(samples, lambda r: r["steps_per_s"])
    first_m, last_m = samples[0].get("metrics") or {}, samples[-1].get("metrics") or {}
    targets = (thirds(samples, lambda r: r["metrics"]["rule_targets"]) if first_m else (None, None, None))
    s = {
        "ab_steps_per_s_on": statistics.median(r["steps_per_s"] for r in ab if r["mode"] == "on"),
        "ab_steps_per_s_off": statistics.median(r["steps_per_s"] for r in ab if r["mode"] == "off"),
        "ab_ratio_median": statistics.median(pairs), "ab_ratio_min": min(pairs), "ab_ratio_max": max(pairs),
        "ab_pair_ratios": pairs,
        "ab_controller_cpu_pct_median": statistics.median(r["controller_cpu_pct"] for r in ab if r["mode"] == "on"),
        "long_seconds": samples[-1]["t"],
        "cpu_pct_first_sample": samples[0]["controller_cpu_pct"], "cpu_pct_first_third": cpu1,
        "cpu_pct_second_third": cpu2, "cpu_pct_last_third": cpu3, "cpu_last_over_second": cpu3 / max(cpu2, 1e-9),
        "rss_mib_second_third": rss2, "rss_mib_last_third": rss3, "rss_last_over_second": rss3 / rss2,
        "job_steps_per_s_second_third": job2, "job_steps_per_s_last_third": job3,
        "job_steps_per_s_off_after": after["steps_per_s"],
        "aged_ratio_last_third_over_off": job3 / after["steps_per_s"],
        "workers_total": after["workers_total"],
        "workers_during_long_run": sum(r["workers_started"] for r in samples),
        "foreign_workers_during_long_run": sum(r["foreign_workers_started"] for r in samples),
        "rule_targets_first_sample": first_m.get("rule_targets"),
        "rule_targets_second_third": targets[1], "rule_targets_last_third": targets[2],
        "rule_targets_end": last_m.get("rule_targets"),
        "rule_targets_per_rule_end": last_m.get("rule_targets_per_rule"),
        "other_load_pct_median": statistics.median(r["other_load_pct"] for r in ab + samples + [after]),
        "other_load_pct_max": max(r["other_load_pct"] for r in ab + samples + [after]),
    }
    s["targets"] = {
        f"controller CPU flat (last third <= {TARGET_FLAT}x second)": s["cpu_last_over_second"] <= TARGET_FLAT,
        f"controller RSS flat (last third <= {TARGET_FLAT}x second)": s["rss_last_over_second"] <= TARGET_FLAT,
        "job throughput within 2 % (A/B median)": s["ab_ratio_median"] >= TARGET_THROUGHPUT,
        "job throughput within 2 % (long run's last third vs OFF after)":
            s["aged_ratio_last_third_over_off"] >= TARGET_THROUGHPUT,
    }
    return s


def table(result: dict) -> str:
    s = result["summary"]
    rows = [
        ("job steps/s, controller on / off (A/B medians)", f"{s['ab_steps_per_s_on']:.1f} / {s['ab_steps_per_s_off']:.1f}"),
        ("A/B ratio on/off: median (min-max)",
         f"{s['ab_ratio_median']:.3f} ({s['ab_ratio_min']:.3f}-{s['ab_ratio_max']:.3f})"),
        ("controller CPU in A/B windows (median, % of a core)", f"{s['ab_controller_cpu_pct_median']:.1f}"),
        (f"long run ({s['long_seconds']:.0f} s): controller CPU first sample; first / second / last third (%)",
         f"{s['cpu_pct_first_sample']:.1f}; {s['cpu_pct_first_third']:.1f} / {s['cpu_pct_second_third']:.1f} / "
         f"{s['cpu_pct_last_third']:.1f} (last/second {s['cpu_last_over_second']:.2f}x)"),
        ("long run: controller RSS second / last third (MiB)",
         f"{s['rss_mib_second_third']:.0f} / {s['rss_mib_last_third']:.0f} = {s['rss_last_over_second']:.2f}x"),
        ("long run: job steps/s second / last third; OFF after",
         f"{s['job_steps_per_s_second_third']:.1f} / {s['job_steps_per_s_last_third']:.1f}; "
         f"{s['job_steps_per_s_off_after']:.1f} (ratio {s['aged_ratio_last_third_over_off']:.3f})"),
        ("job's worker pids: whole run / during the long run", f"{s['workers_total']} / {s['workers_during_long_run']}"),
        ("other DataLoaders' worker pids: whole run / during the long run",
         f"{result['foreign_workers']} / {s['foreign_workers_during_long_run']}"),
        ("rule targets (metrics): first sample / second third / last third / end",
         "-" if s["rule_targets_end"] is None else
         f"{s['rule_targets_first_sample']} / {s['rule_targets_second_third']:.0f} / "
         f"{s['rule_targets_last_third']:.0f} / {s['rule_targets_end']}"),
        ("other load on the machine: median / max (% of a core)",
         f"{s['other_load_pct_median']:.1f} / {s['other_load_pct_max']:.1f}"),
    ]
    out = ["| metric | value |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows]
    out += ["", "Targets:"] + [f"- {name}: {'met' if ok else 'NOT met'}" for name, ok in s["targets"].items()]
    return "\n".join(out)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="~45 s proof run: 1 pair of 5 s windows, a 15 s long run sampled every 2.5 s")
    ap.add_argument("--pairs", type=int, help="A/B pairs (default 3)")
    ap.add_argument("--window", type=float, help="seconds per A/B window (default 25)")
    ap.add_argument("--long", type=float, help="seconds of the long controller run (default 180)")
    ap.add_argument("--sample", type=float, help="seconds per long-run sample (default 10)")
    ap.add_argument("--settle", type=float, help="seconds between a controller start/stop and a window (default 2)")
    ap.add_argument("--warmup", type=float, help="seconds of job before the first window (default 5)")
    ap.add_argument("--no-metrics", action="store_true", help="run the controller without --metrics-port")
    ap.add_argument("--out", help="results file (default bench/results/churn.json; "
                                  "--quick: $TMPDIR/reflexarc-churn-quick.json)")
    args = ap.parse_args()
    defaults = ({"pairs": 1, "window": 5.0, "long": 15.0, "sample": 2.5, "settle": 1.0, "warmup": 2.0} if args.quick
                else {"pairs": 3, "window": 25.0, "long": 180.0, "sample": 10.0, "settle": 2.0, "warmup": 5.0})
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    out = Path(args.out) if args.out else (Path(tempfile.gettempdir()) / "reflexarc-churn-quick.json"
                                           if args.quick else RESULTS)
    if os.geteuid() != 0:
        say("needs root (BPF)")
        return 2
    signal.signal(signal.SIGTERM, interrupted)

    load_at_start, began = os.getloadavg(), time.time()
    name = f"churn{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="rx-churn-") as tmp_dir:
        tmp = Path(tmp_dir)
        hook_dir = tmp / "hooks"
        hook_dir.mkdir()
        job = Job(str(hook_dir), name)
        try:
            job.wait_epochs(1)
            time.sleep(args.warmup)
            ab = ab_phase(job, tmp, args, str(hook_dir), name)
            long = long_phase(job, tmp, args, str(hook_dir), name)
            after = window(job, None, args.window, args.settle)
            say(f"off after: {after['steps_per_s']:6.1f} steps/s")
        except KeyboardInterrupt:
            say("interrupted: every process stopped, nothing written")
            return 130
        finally:
            job.stop()
    result = {
        "machine": {"kernel": platform.release(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "torch": importlib.metadata.version("torch"), "loadavg_at_start": load_at_start,
                    "loadavg_at_end": os.getloadavg()},
        "parameters": {**{k: getattr(args, k) for k in ("quick", "pairs", "window", "long", "sample", "settle",
                                                        "warmup")},
                       "metrics": not args.no_metrics, "workload": str(WORKLOAD.relative_to(ROOT)),
                       "controller": "reflexarc -v --state-dir TMP --hook-dir TMP/hooks run --job JOB --interval 1 "
                                     "--audit TMP/audit.jsonl --kill-switch TMP/disable [--metrics-port PORT]"},
        "code": code_version(),
        "started": datetime.datetime.fromtimestamp(began, datetime.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": time.time() - began,
        "foreign_workers": len(job.foreign),
        "ab_windows": ab, "long_run": long, "off_after": after,
    }
    result["summary"] = summarise(ab, long, after)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(f"\n(wrote {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
