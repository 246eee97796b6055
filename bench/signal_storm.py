"""SIGTERM under a signal storm, and the memory the storm costs: ``reflexarc run
--replay FILE --no-probes`` fed a 1.05 M-sample replay.

The replay (``write_storm``): 100 k distinct DataLoader pids (one training
process per 8, or per ``--pids-per-trainer``), each sending
``dataloader_read_latency_us`` (quantiles 0.5 and 0.99),
``dataloader_reads_total`` and ``numa_remote_ratio``, all due within
``--span`` seconds (~35 k samples/s); 1.4 % of the values NaN or +-inf, 0.1 %
impossible (a negative latency or count, a ratio outside [0, 1]) and 40
records with an impossible ``t`` (NaN, inf, 1e12, -1e12). Beside it, a job's
``step_time_ms`` of 520 ms every 0.1 s drives an enforcing policy (the
``sysctl`` actuator on a fixture ``/proc`` tree, rolled back on shutdown), so
each trial has a change to revert when SIGTERM comes. The shipped DataLoader
policies (``dataloader-numa``, ``dataloader-starvation``) run too, in their own
(dry-run) mode: they turn the training processes into rule-targets.

Each trial starts a fresh controller (own state directory, metrics on
loopback), waits until the change is applied, waits ``delay`` seconds more,
scrapes the metrics, sends SIGTERM and measures the time until the process has
exited (``waitpid``, polled every 2 ms), and its peak RSS (``VmHWM``, read
until it exits). Delays cover the storm's ramp (rule-targets being created),
its steady part and its end; the last trial waits until the whole replay was taken (samples
published + rejected + dropped = the file) to report the drop counts of the
full file. A trial passes when the controller exited 0, printed its summary,
wrote the audit's ``end`` record and the knob is back to its value.

Usage (from the repository; ~3 min here)::

    .venv/bin/python bench/signal_storm.py                # writes bench/results/signal_storm.json
    .venv/bin/python bench/signal_storm.py --tree /tmp/base --out /tmp/base.json
        # the same against another checkout (e.g. ``git archive HEAD | tar -x -C /tmp/base``)

Overhead of the benchmark itself: writing the replay (~157 MB, a few seconds),
one metrics scrape per trial and a 2 ms wait loop while the controller exits.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from reflexarc.core.outcomes import Outcome
from reflexarc.simulations.testbed.local_server import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "signal_storm.json"
JOB = "storm"
DELAYS = (0.0, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0)
PACKAGES = ("core", "controller", "bpf", "actuators", "simulations", "policies")
SHIPPED = ("dataloader-numa.yaml", "dataloader-starvation.yaml")      # the policies the storm's signals feed

STORM_POLICY = """\
policies:
  - name: storm-enforce
    mode: enforce
    selector: {match: {job: storm}}
    rules:
      - name: slow-steps
        by: [rank]
        when: {signal: step_time_ms, agg: max, window: 10m, op: ">", threshold: 300}
        actions:
          - actuator: sysctl
            params: {key: kernel.numa_balancing, value: "0"}
        rollback: {on: [shutdown]}
"""


# --- the replay ------------------------------------------------------------------
def _num(v: float) -> str:
    """A number as JSON as Python's ``json`` reads it (NaN, Infinity, -Infinity)."""
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "Infinity" if v > 0 else "-Infinity"
    return repr(v)


def write_storm(path: Path, samples: int = 1_050_000, pids: int = 100_000, span: float = 30.0,
                pids_per_trainer: int = 8, non_finite: float = 0.014, out_of_range: float = 0.001,
                bad_t: int = 40, seed: int = 7) -> dict:
    """Writes the replay; returns how many records of each kind it holds."""
    rng = random.Random(seed)
    steps = [(i * 0.1, "step_time_ms", f'{{"job": "{JOB}", "rank": "0"}}', 520.0) for i in range(int(span / 0.1))]
    recs = []
    counts = {"samples": samples, "pids": pids, "pids_per_trainer": pids_per_trainer, "non_finite": 0,
              "out_of_range": 0, "bad_t": bad_t}
    for i in range(samples - len(steps) - bad_t):
        pid = 100_000 + i % pids
        trainer = 100_000 + (i % pids) // pids_per_trainer * pids_per_trainer
        kind = i % 4
        labels = f'{{"job": "{JOB}", "pid": "{pid}", "trainer": "{trainer}"'
        if kind < 2:
            name, labels, value = ("dataloader_read_latency_us", labels + f', "quantile": "{("0.5", "0.99")[kind]}"}}',
                                   rng.lognormvariate(5.0, 1.0))
        elif kind == 2:
            name, labels, value = "dataloader_reads_total", labels + "}", float(i // 4)
        else:
            name, labels, value = "numa_remote_ratio", labels + "}", rng.random()
        roll = rng.random()
        if roll < non_finite:
            value = rng.choice((float("nan"), float("inf"), float("-inf")))
            counts["non_finite"] += 1
        elif roll < non_finite + out_of_range:
            value = 1.5 if name == "numa_remote_ratio" else -value - 1.0
            counts["out_of_range"] += 1
        recs.append((rng.random() * span, name, labels, value))
    recs += steps
    recs.sort(key=lambda r: r[0])
    for k in range(bad_t):                  # impossible times, anywhere in the file
        t = (float("nan"), float("inf"), 1e12, -1e12)[k % 4]
        recs.insert(rng.randrange(len(recs)), (t, "dataloader_read_latency_us",
                                               f'{{"job": "{JOB}", "pid": "1", "trainer": "1", "quantile": "0.5"}}',
                                               100.0))
    with open(path, "w") as f:
        f.writelines(f'{{"t": {_num(t)}, "name": "{n}", "labels": {lab}, "value": {_num(v)}}}\n'
                     for t, n, lab, v in recs)
    return counts


# --- one controller ----------------------------------------------------------------
def command(tree: Path | None, shim: Path) -> list[str]:
    """The CLI of this checkout, or of ``tree`` through a package directory of links."""
    if tree is None:
        return [sys.executable, "-m", "reflexarc.controller.cli"]
    pkg = shim / "reflexarc"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").touch()
    for name in PACKAGES:
        if not (pkg / name).exists():
            (pkg / name).symlink_to(tree.resolve() / name)
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(shim)!r}); "
                                  "from reflexarc.controller.cli.main import main; sys.exit(main())"]


def scrape(port: int) -> dict:
    """Samples published per source, rejected and dropped per (signal, reason),
    series on the bus and rule-targets: what the storm cost."""
    from prometheus_client.parser import text_string_to_metric_families
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError as exc:
        return {"error": str(exc)}
    out: dict = {"published": {}, "rejected": {}, "dropped": {}}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "reflexarc_signal_samples_total":
                out["published"][s.labels["source"]] = int(s.value)
            elif s.name == "reflexarc_samples_rejected_total":
                out["rejected"][f"{s.labels['signal']}/{s.labels['reason']}"] = int(s.value)
            elif s.name == "reflexarc_samples_dropped_total":
                out["dropped"][f"{s.labels['signal']}/{s.labels['reason']}"] = int(s.value)
            elif s.name == "reflexarc_bus_series":
                out["bus_series"] = int(s.value)
            elif s.name == "reflexarc_rule_targets":
                out["rule_targets"] = int(s.value)
    return out


def taken(metrics: dict) -> int:
    return (sum(metrics.get("published", {}).values()) + sum(metrics.get("rejected", {}).values())
            + sum(v for k, v in metrics.get("dropped", {}).items() if not k.endswith("/series_full")))


def trial(tmp: Path, storm: Path, delay: float | None, cmd: list[str], policies: list[Path], n: int,
          samples: int) -> dict:
    """One controller, SIGTERM ``delay`` s after its change was applied (None: once
    the whole replay was taken)."""
    run = tmp / f"trial{n}"
    knob = run / "proc" / "sys" / "kernel" / "numa_balancing"
    knob.parent.mkdir(parents=True)
    knob.write_text("1\n")
    hooks = run / "hooks"
    hooks.mkdir(mode=0o755)
    port = free_port()
    out, err = open(run / "stdout", "w+"), open(run / "stderr", "w+")
    proc = subprocess.Popen(cmd + ["--state-dir", str(run / "state"), "--proc-root", str(run / "proc"),
                                   "--hook-dir", str(hooks), "run", "--no-probes", "--replay", str(storm),
                                   "--policy", str(tmp / "storm.yaml"),
                                   *[arg for path in policies for arg in ("--policy", str(path))],
                                   "--mode", "policy", "--interval", "1", "--duration", "3600",
                                   "--metrics-port", str(port), "--kill-switch", str(run / "disable")],
                            stdout=out, stderr=err, cwd=run)
    began = time.monotonic()
    result: dict = {"delay_s": delay}
    while knob.read_text().strip() != "0":
        if proc.poll() is not None or time.monotonic() - began > 600:
            proc.kill()
            proc.wait()
            err.seek(0)
            return {**result, "error": f"the change was never applied: {err.read()[-1500:]}"}
        time.sleep(0.02)
    result["applied_after_start_s"] = round(time.monotonic() - began, 3)
    if delay is None:
        while taken(metrics := scrape(port)) < samples and time.monotonic() - began < 1800:
            time.sleep(1.0)
    else:
        time.sleep(delay)
        metrics = scrape(port)
    result["metrics"] = metrics
    rss, peak = memory_mib(proc.pid)
    result["rss_at_sigterm_mib"] = rss
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    status = None
    while time.monotonic() - sent < 120:
        pid, status = os.waitpid(proc.pid, os.WNOHANG)
        if pid:
            break
        peak = max(peak, memory_mib(proc.pid)[1])
        time.sleep(0.002)
    else:
        proc.kill()
        _, status = os.waitpid(proc.pid, 0)
        result["killed_after_s"] = 120
    proc.returncode = os.waitstatus_to_exitcode(status)
    result["sigterm_to_exit_s"] = round(time.monotonic() - sent, 3)
    result["signal_at_s"] = round(sent - began, 3)
    result["exit_code"] = proc.returncode
    result["peak_rss_mib"] = peak
    out.seek(0)
    lines = out.read().splitlines()
    summary = json.loads(lines[0]) if lines and lines[0].startswith("{") else None
    audit = run / "state" / "audit.jsonl"
    records = [json.loads(x) for x in audit.read_text().splitlines()] if audit.exists() else []
    result["summary"] = summary
    result["audit_end"] = any(r["kind"] == "end" for r in records)
    result["knob_reverted"] = knob.read_text().strip() == "1"
    result["ok"] = (proc.returncode == 0 and summary is not None and summary.get(Outcome.REVERTED) == 1
                    and result["audit_end"] and result["knob_reverted"])
    return result


def memory_mib(pid: int) -> tuple[float, float]:
    """RSS and peak RSS (VmHWM, since the controller's exec) of a live process;
    zeros once it is a zombie."""
    fields = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            fields[key] = value
    except OSError:
        pass
    return tuple(round(int(fields.get(k, "0 kB").split()[0]) / 1024, 1) for k in ("VmRSS", "VmHWM"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=1_050_000)
    ap.add_argument("--pids", type=int, default=100_000)
    ap.add_argument("--span", type=float, default=30.0, help="seconds the replay's records are due within")
    ap.add_argument("--pids-per-trainer", type=int, default=8, help="DataLoader pids of one training process")
    ap.add_argument("--delays", type=float, nargs="*", default=list(DELAYS),
                    help="seconds after the change was applied to send SIGTERM, one trial each")
    ap.add_argument("--no-full", action="store_true", help="skip the trial that takes the whole replay")
    ap.add_argument("--tree", type=Path, help="measure the CLI of this checkout instead")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="reflexarc-storm-") as tmp_name:
        tmp = Path(tmp_name)
        storm = tmp / "storm.jsonl"
        written = write_storm(storm, args.samples, args.pids, args.span, args.pids_per_trainer)
        (tmp / "storm.yaml").write_text(STORM_POLICY)
        cmd = command(args.tree, tmp / "shim")
        policies = [(args.tree or ROOT) / "policies" / name for name in SHIPPED]
        delays: list[float | None] = list(args.delays) + ([] if args.no_full else [None])
        trials = []
        for n, delay in enumerate(delays):
            trials.append(trial(tmp, storm, delay, cmd, policies, n, args.samples))
            t = trials[-1]
            print(f"delay {delay if delay is not None else 'full replay'}: SIGTERM at {t.get('signal_at_s')} s -> "
                  f"exit {t.get('sigterm_to_exit_s')} s, code {t.get('exit_code')}, "
                  f"peak RSS {t.get('peak_rss_mib')} MiB, ok {t.get('ok')}"
                  + (f" ({t['error']})" if "error" in t else ""), flush=True)
    done = [t for t in trials if "sigterm_to_exit_s" in t]
    result = {
        "machine": {"kernel": platform.release(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "loadavg": os.getloadavg()},
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "tree": str(args.tree or ROOT), "replay": {**written, "span_s": args.span},
        "trials": trials,
        "summary": {
            "sigterm_to_exit_worst_s": max((t["sigterm_to_exit_s"] for t in done), default=None),
            "peak_rss_worst_mib": max((t["peak_rss_mib"] for t in done), default=None),
            "all_ok": all(t.get("ok") for t in trials),
            "full_replay": next((t["metrics"] for t in trials if t["delay_s"] is None and "metrics" in t), None),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    s = result["summary"]
    print(f"worst SIGTERM to exit: {s['sigterm_to_exit_worst_s']} s; worst peak RSS: {s['peak_rss_worst_mib']} MiB; "
          f"all trials ok: {s['all_ok']}")
    print(f"results: {args.out}")
    return 0 if s["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
