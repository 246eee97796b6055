"""``reflexarc run --mode dry-run`` with the built-in policies on live signals:
a real PyTorch DataLoader starved by slow reads (real blocking read syscalls,
seen by the dataloader_io bcc probe) and the training loop's batch wait
(reported through the framework hooks). The audit log must record the would-be
action (the starvation policy's prefetch hook, planned against the live script)
and nothing may be applied."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from conftest import ROOT, require_bpf, spawn_cli
import pytest

pytestmark = [pytest.mark.kernel]


def test_dry_run_records_would_be_action_from_real_signals(tmp_path):
    require_bpf()
    hooks, state = tmp_path / "hooks", tmp_path / "state"
    hooks.mkdir()
    job = f"starved{os.getpid()}"
    audit = state / "audit.jsonl"
    ctl = spawn_cli("--state-dir", str(state), "--hook-dir", str(hooks), "run", "--mode", "dry-run", "--job", job,
                    "--interval", "1", "--duration", "300", "--kill-switch", str(tmp_path / "disable"),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    train = subprocess.Popen([sys.executable, str(ROOT / "tests" / "workloads" / "starved_loader.py"),
                              "--job", job, "--hook-dir", str(hooks), "--seconds", "290"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    planned = None
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and planned is None:
            time.sleep(1)
            assert ctl.poll() is None, ctl.stderr.read()
            assert train.poll() is None, train.stderr.read()
            if audit.exists():
                for line in audit.read_text().splitlines():
                    rec = json.loads(line)
                    if rec["kind"] == "action" and rec["outcome"] == "planned":
                        planned = rec
    finally:
        ctl.send_signal(signal.SIGTERM)
        train.send_signal(signal.SIGTERM)
        out, err = ctl.communicate(timeout=60)
        train.wait(timeout=60)
    if planned is None:
        evals = [r for r in map(json.loads, audit.read_text().splitlines())
                 if r["kind"] == "eval" and r["policy"] == "dataloader-starvation"] if audit.exists() else []
        last = [(v["condition"], v["value"]) for v in evals[-1]["values"]] if evals else "no evaluation"
        raise AssertionError(f"no would-be action recorded; last evaluation: {last}; controller: {err[-1500:]}")
    assert planned["policy"] == "dataloader-starvation" and planned["actuator"] == "framework_hook"
    assert planned["mode"] == "dry-run" and planned["target"] == f"job={job}"
    assert planned["change"]["after"], "the plan came from the live script"
    firing = [r for r in map(json.loads, audit.read_text().splitlines())
              if r["kind"] == "transition" and r["to"] == "firing" and r["policy"] == "dataloader-starvation"]
    ev = {e["signal"]: e for e in firing[0]["evidence"]}
    assert ev["dataloader_read_latency_us"]["value"] > 1000, "real read latency from the bcc probe"
    assert ev["dataloader_batch_wait_ms"]["value"] > 10, "real batch wait from the training loop"
    applied = [r for r in map(json.loads, audit.read_text().splitlines())
               if r["kind"] == "action" and r["outcome"] == "applied"]
    assert applied == [], "dry-run applies nothing"
    assert not (state / "journal.jsonl").exists() or "intent" not in (state / "journal.jsonl").read_text()
