"""The rule engine's own cost: rule-target evaluations per second, the share
spent in ``transitions``, and the audit volume of an idle node.

Policies are built in code: R rules x 10 targets, each rule grouped by
``rank`` with two conditions over 30 s windows (``max(step_time_ms)`` and
``p99(dataloader_batch_wait_ms)``, thresholds differing per rule), fed 1 Hz
samples of both signals for 10 ranks in simulated time. After a warm-up that
fills the windows, the controller's ``tick`` is timed with the process's CPU
clock (one core), apart from publishing:

* ``idle``: nothing breaches, the steady state of a healthy node;
* ``busy``: every minute a different tenth of the targets breaches for 20 s
  (pending -> firing -> acting -> remediated -> cooldown ...), so the
  state machines work; the time inside ``transitions`` is measured by timing
  ``Machine._process`` (every trigger goes through it).

Audit volume: 100 rules x 10 targets idle for one simulated hour after the
warm-up, with the live-run audit settings (``evals="sampled"``, the CLI's
default ``--audit-sample``), bytes written in that hour.

Usage (from the repository)::

    .venv/bin/python bench/engine.py [--quick]

Writes ``bench/results/engine.json`` and prints a Markdown table. Takes
about 3 minutes (``--quick``: ~20 s, for proving the harness).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from engine_policies import TARGETS, feed, policies, registry
from transitions.core import Machine

from reflexarc.controller.engine.audit import AuditLog
from reflexarc.controller.engine.bus import SignalBus
from reflexarc.controller.engine.clock import SimClock
from reflexarc.controller.engine.engine import Controller

RESULTS = Path(__file__).resolve().parent / "results" / "engine.json"
WARMUP = 60
AUDIT_SAMPLE = 1200.0     # the CLI's default --audit-sample


class TransitionTimer:
    """Accumulates the time spent inside ``transitions`` triggers."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._orig = Machine._process

    def __enter__(self):
        timer, orig = self, self._orig

        def timed(machine, trigger):
            t0 = time.process_time()
            try:
                return orig(machine, trigger)
            finally:
                timer.seconds += time.process_time() - t0
                timer.calls += 1
        Machine._process = timed
        return self

    def __exit__(self, *exc) -> None:
        Machine._process = self._orig


def build(rules: int, audit_path: Path | None = None):
    """The controller on simulated time; with ``audit_path``, auditing as live runs do."""
    clock = SimClock()
    bus = SignalBus()
    audit = (AuditLog(audit_path, clock, evals="sampled", sample_every=AUDIT_SAMPLE) if audit_path
             else AuditLog(None, clock))
    ctl = Controller(policies(rules), bus, registry(), clock, audit=audit, real_sleep=False)
    ctl.start("bench")
    return clock, bus, ctl


def throughput(rules: int, ticks: int, busy: bool) -> dict:
    clock, bus, ctl = build(rules)
    ctl.audit.keep_in_memory = False
    for t in range(WARMUP):
        clock.set(float(t))
        feed(bus, t, busy)
        ctl.tick()
    spent = 0.0
    with TransitionTimer() as tt:
        for t in range(WARMUP, WARMUP + ticks):
            clock.set(float(t))
            feed(bus, t, busy)
            t0 = time.process_time()
            ctl.tick()
            spent += time.process_time() - t0
    evaluations = rules * TARGETS * ticks
    return {"rules": rules, "targets": TARGETS, "ticks": ticks, "mode": "busy" if busy else "idle",
            "runs": len(ctl.runs), "evaluations": evaluations, "tick_cpu_s": round(spent, 4),
            "evaluations_per_s": round(evaluations / spent), "ms_per_tick": round(1000 * spent / ticks, 3),
            "transitions": tt.calls, "transitions_share": round(tt.seconds / spent, 4) if spent else 0.0}


def audit_volume(rules: int, seconds: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "audit.jsonl"
        clock, bus, ctl = build(rules, path)
        for t in range(WARMUP):
            clock.set(float(t))
            feed(bus, t, False)
            ctl.tick()
        before = path.stat().st_size
        for t in range(WARMUP, WARMUP + seconds):
            clock.set(float(t))
            feed(bus, t, False)
            ctl.tick()
        written = path.stat().st_size - before
        ctl.audit.close()
    return {"rules": rules, "targets": TARGETS, "rule_targets": rules * TARGETS, "simulated_s": seconds,
            "sample_every_s": AUDIT_SAMPLE, "bytes": written,
            "bytes_per_hour": round(written * 3600 / seconds)}


def summarise(raw: dict[str, list[dict]]) -> list[dict]:
    """One row per configuration: medians over the rounds, with min and max."""
    table = []
    for runs in raw.values():
        rates = [r["evaluations_per_s"] for r in runs]
        table.append({**runs[0], "evaluations_per_s": round(statistics.median(rates)),
                      "evaluations_per_s_min": min(rates), "evaluations_per_s_max": max(rates),
                      "ms_per_tick": statistics.median(r["ms_per_tick"] for r in runs),
                      "transitions_share": statistics.median(r["transitions_share"] for r in runs)})
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a short run that proves the harness works")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per configuration")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    sizes = {10: 300, 100: 60, 1000: 8} if not args.quick else {10: 30, 100: 10, 1000: 2}
    raw: dict[str, list[dict]] = {}
    for _ in range(rounds):                       # interleaved: every size once per round
        for rules, ticks in sizes.items():
            for busy in (False, True):
                raw.setdefault(f"{rules}:{'busy' if busy else 'idle'}", []).append(throughput(rules, ticks, busy))
    table = summarise(raw)
    audit = audit_volume(100, 600 if args.quick else 3600)
    target = next(r for r in table if r["rules"] == 100 and r["mode"] == "idle")
    result = {
        "machine": {"kernel": platform.release(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "loadavg": os.getloadavg()},
        "quick": args.quick, "rounds": rounds, "throughput": table, "raw": raw, "audit_idle": audit,
        "targets": {"evaluations_per_s_at_100x10": 50000, "audit_bytes_per_hour_idle_1000": 2 << 20},
        "met": {"evaluations_per_s_at_100x10": target["evaluations_per_s"] >= 50000,
                "audit_bytes_per_hour_idle_1000": audit["bytes_per_hour"] < (2 << 20)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"machine: {result['machine']}")
    print("| rules x targets | mode | rule-target evaluations/s (median, min-max) | ms per tick | "
          "transitions | share in transitions |")
    print("|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r['rules']} x {r['targets']} | {r['mode']} | {r['evaluations_per_s']:,} "
              f"({r['evaluations_per_s_min']:,}-{r['evaluations_per_s_max']:,}) | {r['ms_per_tick']} | "
              f"{r['transitions']} | {100 * r['transitions_share']:.1f} % |")
    print(f"audit, idle, {audit['rule_targets']} rule-targets: {audit['bytes_per_hour']:,} bytes/hour "
          f"(sampled every {AUDIT_SAMPLE:g} s)")
    print(f"targets met: {result['met']}")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
