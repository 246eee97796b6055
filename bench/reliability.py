"""The reliability suite at full counts (``make soak``): runs
``tests/test_reliability.py`` with ``REFLEXARC_SOAK=1`` (50 SIGKILL trials per
actuator, 10,000 fuzzed policy files, the whole bad-input table, hook spoofing,
every journal damage case, a 1.05 M-sample signal storm, a full state disk,
descriptors held by another user, a taken metrics port, planted links, silent
hook sockets, clock steps, journals of other versions, five minutes of
DataLoader workers replaced 50 times a second under the real probes), gathers
each part's figures, writes ``bench/results/reliability.json`` and prints a
table. Every scenario that ends a controller with SIGTERM records how long it
took to exit (``reliability.counts.record_sigterm``): ``sigterm_to_exit``
holds each scenario's times, the worst of them, and the scenarios over
``SIGTERM_BOUND_S`` (the bound a node's service manager is promised) or that
never exited.

The suite asserts the outcomes (no leak, no traceback, no hang, nothing
forged trusted, every change reverted, every sample accounted for); times and
memory are only recorded. The exit code is pytest's: a leak or a traceback
fails the soak, and the results file still says what was found.

Usage (from the repository, as root; ~25-35 min on a 2-core node)::

    .venv/bin/python bench/reliability.py                 # writes bench/results/reliability.json
    .venv/bin/python bench/reliability.py --quick --out /tmp/r.json    # CI's shortened counts

Runs at ``nice 10`` unless ``--no-nice``: the machine may be shared.
Overhead of the bench itself: one pytest child; merging the parts' JSON.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "reliability.json"
SUITE = "tests/test_reliability.py"
sys.path.insert(0, str(ROOT / "tests"))
from reliability.counts import SIGTERM_FILE, counts_for  # noqa: E402

from reflexarc.core.outcomes import Outcome  # noqa: E402

ACTUATORS = ("affinity", "dscp", "framework_hook", "deep_tracing")
SIGTERM_BOUND_S = 2.0


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = next((int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal:")), 0)
    return {"kernel": platform.release(), "cpu": cpu, "cpus": os.cpu_count(), "memory_gib": round(mem / 2**20, 1),
            "python": platform.python_version(), "loadavg_at_start": os.getloadavg()}


def _load(out: Path, name: str) -> dict | None:
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def gather(out: Path) -> dict:
    """The parts' figures, without the per-case records (kept in the part's own file)."""
    result: dict = {"sigkill": {}}
    for act in ACTUATORS:
        part = _load(out, f"crash-{act}")
        if part:
            part.pop("records", None)
            part["calibration"] = [{k: c.get(k) for k in ("driver", "apply_s", "applied", "leaks")}
                                   for c in part.get("calibration", [])]
            result["sigkill"][act] = part
    crash = result["sigkill"].values()
    result["sigkill_total"] = {"trials": sum(p["trials"] for p in crash), "leaks": sum(p["leaks"] for p in crash),
                               "killed": sum(p["killed"] for p in crash)}
    fuzz = _load(out, "fuzz")
    if fuzz:
        fuzz["traceback_details"] = fuzz.get("traceback_details", [])[:10]
        result["fuzz"] = fuzz
    cli = _load(out, "cli")
    if cli:
        cli.pop("results", None)
        result["cli"] = cli
    for name, key in (("spoof", "hook_spoofing"), ("journal", "journal_damage")):
        part = _load(out, name)
        if part:
            part.pop("records", None)
            result[key] = part
    for name, key in (("full-disk", "full_disk"), ("fd-exhaustion", "fd_exhaustion"), ("port-taken", "port_taken"),
                      ("planted", "planted"), ("silent-hooks", "silent_hooks")):
        part = _load(out, name)
        if part:
            part["records"] = [{k: v for k, v in r.items() if k not in ("problems",)}
                               for r in part.get("records", [])]
            result[key] = part
    storm = _load(out, "storm")
    if storm:
        storm["trial_details"] = [{k: t.get(k) for k in ("delay_s", "signal_at_s", "sigterm_to_exit_s", "peak_rss_mib",
                                                         "exit_code", "ok")} for t in storm.get("trial_details", [])]
        result["signal_storm"] = storm
    churn = _load(out, "churn")
    if churn:
        churn["failures"] = churn.get("failures", [])[:20]
        result["worker_churn"] = churn
    sigterm = sigterm_figures(out / SIGTERM_FILE)
    if sigterm:
        result["sigterm_to_exit"] = sigterm
    return result


def sigterm_figures(path: Path) -> dict | None:
    """Each scenario's SIGTERM-to-exit times (None: it never exited), the worst
    time and its scenario, and the scenarios over ``SIGTERM_BOUND_S`` or hung."""
    if not path.exists():
        return None
    by: dict[str, list] = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        by.setdefault(rec["scenario"], []).append(rec["seconds"])
    timed = [(s, name) for name, times in by.items() for s in times if s is not None]
    worst = max(timed, default=(None, None))
    return {"bound_s": SIGTERM_BOUND_S, "max_s": worst[0], "max_scenario": worst[1],
            "trials": sum(len(t) for t in by.values()),
            "over_bound": sorted(name for name, times in by.items()
                                 if any(s is not None and s > SIGTERM_BOUND_S for s in times)),
            "never_exited": sorted(name for name, times in by.items() if None in times),
            "by_scenario": {name: {"max_s": max((s for s in times if s is not None), default=None), "s": times}
                            for name, times in sorted(by.items())}}


def _fmt(v, unit: str = "") -> str:
    return "-" if v is None else f"{v}{unit}"


def table(r: dict) -> str:
    rows = [("part", "cases", "outcome", "worst (recorded, not asserted)")]
    for act, p in r.get("sigkill", {}).items():
        rows.append((f"SIGKILL + restart: {act}", str(p["trials"]),
                     f"{p['leaks']} leaks, {p['killed']} killed, {p['live_at_kill']} live at the kill, "
                     f"{p['journal_at_kill'].get(Outcome.APPLIED, 0)} journaled applied, {p['restarts_killed']} restarts "
                     f"killed too, {len(p['errors'])} errors",
                     f"trial {_fmt(p.get('worst_trial_s'), ' s')}"))
    f = r.get("fuzz")
    if f:
        rows.append(("fuzzed policy files", str(f["cases"]),
                     f"{f['tracebacks']} tracebacks ({f['outcomes']['loaded']} loaded, "
                     f"{f['outcomes']['located-error']} located errors)",
                     f"{f['worst_cpu_s']} s CPU / {f['worst_time_s']} s wall, peak RSS {f['worst_peak_rss_mib']} MiB "
                     f"(+{f['worst_rss_growth_mib']} MiB)"))
    c = r.get("cli")
    if c:
        rows.append(("bad CLI input, 11 verbs", str(c["cases"]),
                     f"{len(c['failures'])} failures ({c['tracebacks']} tracebacks or internal errors, "
                     f"{c['hangs']} hangs)",
                     f"{c['worst_case_s']} s"))
    s = r.get("hook_spoofing")
    if s:
        rows.append(("hook sockets forged by nobody", str(s["forged"]),
                     f"{s['trusted']} trusted ({s['refused_by_kernel']} refused by the kernel, {s['rejected']} "
                     f"rejected and counted), {len(s['problems'])} problems", "-"))
    j = r.get("journal_damage")
    if j:
        rows.append(("damaged journal, then rollback", str(j["cases"]),
                     f"{j[Outcome.REVERTED]} reverted, {len(j['failures'])} failures", "-"))
    st = r.get("signal_storm")
    if st:
        rows.append((f"signal storm ({st['samples']:,} samples)", str(st["trials"]),
                     f"{st['trials_ok']} clean shutdowns; {st['dropped']:,} dropped, {st['rejected']:,} rejected, "
                     f"{st['accounted']:,} of {st['samples']:,} accounted",
                     f"SIGTERM to exit {_fmt(st['shutdown_worst_s'], ' s')}, peak RSS "
                     f"{_fmt(st['peak_rss_worst_mib'], ' MiB')}"))
    for key, what in (("full_disk", "state disk full under enforce"), ("fd_exhaustion", "descriptors held by nobody"),
                      ("port_taken", "metrics port taken at restart")):
        p = r.get(key)
        if p:
            rows.append((what, str(p["trials"]), f"{p['leaks']} leaks, {len(p['failures'])} failures",
                         f"SIGTERM to exit {_fmt(max(p['exit_s'], default=None), ' s')}"))
    p = r.get("planted")
    if p:
        rows.append(("links planted in the state dir", str(len(p["cases"])), f"{len(p['failures'])} failures", "-"))
    p = r.get("silent_hooks")
    if p:
        rows.append(("30 silent hook sockets", "1", f"{len(p['failures'])} failures",
                     f"poll {_fmt(max(p['poll_s'], default=None), ' s')}, SIGTERM to exit {_fmt(p['exit_s'], ' s')}"))
    p = r.get("worker_churn")
    if p and "started" in p:
        rows.append((f"worker churn ({p['rate_per_s']}/s sustained of {p['rate_asked_per_s']:g}/s asked)",
                     str(p["started"]),
                     f"{len(p['failures'])} failures (series of exited workers left), {p['series_limit']} samples "
                     f"refused at the cap; worker pids on the bus <= {p['worker_pids_on_bus_max']} "
                     f"({p['live_max']} live)",
                     f"poll {_fmt(p['poll_s_max'], ' s')}, {p['cpu_s']} s CPU"))
    p = r.get("sigterm_to_exit")
    if p:
        rows.append(("SIGTERM to exit, every scenario", str(p["trials"]),
                     f"over {p['bound_s']:g} s: {len(p['over_bound'])} scenarios, never exited: "
                     f"{len(p['never_exited'])}", f"{_fmt(p['max_s'], ' s')} ({p['max_scenario']})"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="CI's shortened counts instead of the full ones")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--no-nice", action="store_true", help="do not lower this run's priority")
    ap.add_argument("-k", help="only the suite's tests matching this pytest expression")
    args = ap.parse_args(argv)
    if not args.no_nice:
        os.nice(10)
    began = time.monotonic()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    info = machine()
    with tempfile.TemporaryDirectory(prefix="reflexarc-reliability-") as tmp:
        env = {**os.environ, "REFLEXARC_RELIABILITY_OUT": tmp}
        if args.quick:
            env.pop("REFLEXARC_SOAK", None)
        else:
            env["REFLEXARC_SOAK"] = "1"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", SUITE, *(["-k", args.k] if args.k
                                                                                         else [])]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        tail: list[str] = []
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            tail = (tail + [line.rstrip()])[-5:]
        code = proc.wait()
        parts = gather(Path(tmp))
    info["loadavg_at_end"] = os.getloadavg()
    result = {"machine": info, "started": started, "duration_s": round(time.monotonic() - began, 1),
              "counts": dataclasses.asdict(counts_for(not args.quick)),
              "pytest": {"exit": code, "summary": tail[-1] if tail else ""},
              **parts}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print()
    print(table(result))
    print(f"\n{'soak' if not args.quick else 'quick run'}: {result['duration_s']} s on {info['cpus']} CPUs "
          f"({info['cpu']}), kernel {info['kernel']}; pytest exit {code}")
    print(f"results: {args.out}")
    return code


if __name__ == "__main__":
    sys.exit(main())
