"""A signal storm against a live controller, through ``bench/signal_storm.py``'s
generator and trial: ``reflexarc run --replay`` of a storm (distinct DataLoader
pids, NaN/inf and impossible values, impossible timestamps) beside an enforcing
policy whose change must be reverted when SIGTERM comes.

Per trial (one per delay after the change was applied, then one that waits
until the whole replay was taken): the time from SIGTERM to exit, the peak
RSS, and whether the controller exited 0, printed its summary, wrote the
audit's end record and reverted its change. The last trial's metrics say
where every sample went: published, rejected (by signal and reason) or
dropped (by signal and reason); they must add up to the replay.

Example::

    figures = run_storm(Path("/tmp/s"), samples=150_000, pids=15_000, span=8.0, delays=(0.5,))
    figures["shutdown_worst_s"], figures["dropped"], figures["accounted"] == figures["samples"]

Overhead: the replay file (~150 bytes a sample) and one controller per trial,
for about the replay's span each.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import signal_storm  # noqa: E402
from reliability.counts import record_sigterm  # noqa: E402


def run_storm(tmp: Path, samples: int, pids: int, span: float, delays: tuple) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    storm = tmp / "storm.jsonl"
    written = signal_storm.write_storm(storm, samples, pids, span)
    (tmp / "storm.yaml").write_text(signal_storm.STORM_POLICY)
    cmd = signal_storm.command(None, tmp / "shim")
    policies = [ROOT / "policies" / name for name in signal_storm.SHIPPED]
    trials = []
    for n, delay in enumerate([*delays, None]):
        trials.append(signal_storm.trial(tmp, storm, delay, cmd, policies, n, samples))
        if "sigterm_to_exit_s" in trials[-1]:
            when = "after the whole replay" if delay is None else f"{delay} s after the change"
            record_sigterm(f"storm, SIGTERM {when}",
                           None if "killed_after_s" in trials[-1] else trials[-1]["sigterm_to_exit_s"])
    done = [t for t in trials if "sigterm_to_exit_s" in t]
    full = next((t for t in trials if t["delay_s"] is None), {})
    metrics = full.get("metrics", {})
    dropped = dict(metrics.get("dropped", {}))
    shown = ("exit_code", "summary", "audit_end", "knob_reverted")
    return {
        "samples": samples, "pids": pids, "span_s": span, "replay": written,
        "trials": len(trials), "trials_ok": sum(bool(t.get("ok")) for t in trials),
        "shutdown_worst_s": max((t["sigterm_to_exit_s"] for t in done), default=None),
        "shutdown_s": [t.get("sigterm_to_exit_s") for t in trials],
        "peak_rss_worst_mib": max((t["peak_rss_mib"] for t in done), default=None),
        "published": sum(metrics.get("published", {}).values()),
        "rejected": sum(metrics.get("rejected", {}).values()),
        "dropped": sum(dropped.values()),
        "dropped_by_reason": dropped,
        "accounted": signal_storm.taken(metrics) if metrics else 0,
        "failures": [f"delay {t['delay_s']}: {t.get('error') or {k: t.get(k) for k in shown}}"
                     for t in trials if not t.get("ok")],
        "trial_details": trials,
        "seconds": round(time.monotonic() - began, 1),
    }
