"""Alerts from a real controller run reach a real Alertmanager (v2 API), group
by node, job, rank, rule and severity, carry the evidence and where the audit
is, can be queried with ``amtool``, and are resolved when the rule clears.

The controller replays a slow phase of one rank's steps (500 ms, then back to
100 ms) under an ``alert-only`` policy; the alert must be there while the rule
fires and gone (resolved) once it has cleared. With an Alertmanager that
accepts connections and never answers, the alert is sent from its own thread:
the loop goes on, and SIGTERM ends the controller at once.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import require, wait_until

from reflexarc.simulations.testbed.alertmanager import BINARY, Alertmanager

RX = [sys.executable, "-m", "reflexarc.controller.cli"]
AMTOOL = "/usr/bin/amtool"
POLICY = """\
policies:
  - name: slow-steps
    mode: alert-only
    rules:
      - name: step-time
        by: [job, rank]
        when: {signal: step_time_ms, agg: max, window: 2s, op: ">", threshold: 300}
        for: 2s
        clear_for: 2s
        actions:
          - actuator: alert
            params: {severity: warning, summary: "steps slow on this rank"}
        rollback: never
"""


def _replay(path: Path) -> None:
    lines = []
    for i in range(40):                       # 0.5 s apart: 8 s slow, then 12 s healthy
        t = i * 0.5
        value = 500.0 if 2.0 <= t < 10.0 else 100.0
        lines.append(json.dumps({"t": t, "name": "step_time_ms", "labels": {"job": "llama", "rank": "1"},
                                 "value": value}))
    path.write_text("\n".join(lines) + "\n")


def _ours(am: Alertmanager) -> list[dict]:
    return [a for a in am.alerts() if a["labels"].get("alertname") == "reflexarc_slow_steps_step_time"]


def test_alert_reaches_alertmanager_groups_well_and_resolves_on_clear(tmp_path):
    require(Path(BINARY).exists(), f"Debian's prometheus-alertmanager at {BINARY} (scripts/bootstrap installs it)")
    require(Path(AMTOOL).exists(), f"amtool at {AMTOOL} (Debian's prometheus-alertmanager)")
    policy, replay, state, hooks = tmp_path / "p.yaml", tmp_path / "r.jsonl", tmp_path / "s", tmp_path / "h"
    policy.write_text(POLICY)
    _replay(replay)
    hooks.mkdir(mode=0o755)
    with Alertmanager() as am:
        proc = subprocess.Popen([*RX, "--state-dir", str(state), "--hook-dir", str(hooks), "--alertmanager-url", am.url,
                                 "run", "--no-probes", "--replay", str(replay), "--policy", str(policy), "--mode", "policy",
                                 "--interval", "0.5", "--duration", "30"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            firing = wait_until("the alert in Alertmanager", lambda: _ours(am), 25)[0]
            labels = firing["labels"]
            assert {k: labels.get(k) for k in ("job", "rank", "rule", "severity", "policy")} == {
                "job": "llama", "rank": "1", "rule": "step-time", "severity": "warning", "policy": "slow-steps"}
            assert labels["node"] == os.uname().nodename
            notes = firing["annotations"]
            assert notes["summary"] == "steps slow on this rank"
            assert "step_time_ms" in notes["description"] and "500" in notes["description"], notes
            assert notes["audit"] == str((state / "audit.jsonl").resolve())
            assert notes["report"].startswith("reflexarc report " + notes["audit"])
            # amtool finds it by its grouping labels
            q = subprocess.run([AMTOOL, f"--alertmanager.url={am.url}", "alert", "query", "-o", "json",
                                "rank=1", "job=llama", "severity=warning"], capture_output=True, text=True,
                               timeout=30)
            assert q.returncode == 0, q.stderr
            assert [a["labels"]["rule"] for a in json.loads(q.stdout)] == ["step-time"]
            # the rule clears once the steps are back: the alert is resolved
            wait_until("the alert to be resolved after the rule cleared", lambda: not _ours(am), 25)
        finally:
            out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    records = [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]
    actions = [r for r in records if r["kind"] == "action"]
    assert [a["outcome"] for a in actions if a["actuator"] == "alert"] == ["notified", "resolved"], actions


def test_sigterm_ends_the_run_at_once_while_alertmanager_hangs(tmp_path):
    policy, replay, state, hooks = tmp_path / "p.yaml", tmp_path / "r.jsonl", tmp_path / "s", tmp_path / "h"
    policy.write_text(POLICY)
    _replay(replay)
    hooks.mkdir(mode=0o755)
    listener = socket.create_server(("127.0.0.1", 0))     # accepts, reads nothing, never answers
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    proc = subprocess.Popen([*RX, "--state-dir", str(state), "--hook-dir", str(hooks), "--alertmanager-url", url,
                             "run", "--no-probes", "--replay", str(replay), "--policy", str(policy), "--mode", "policy",
                             "--interval", "0.5", "--duration", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until("the controller to send the alert", lambda: held, 25)
        wait_until("the loop to audit the alert", lambda: _alert_outcomes(state), 10)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        listener.close()
        for conn in held:
            conn.close()
    assert proc.returncode == 0, err
    # the delivery's deadline is 10 s, Alertmanager would hang for ever: the
    # controller neither waits on it in the loop nor at exit
    assert took < 4.0, f"SIGTERM took {took:.1f} s while Alertmanager hung"
    assert _alert_outcomes(state)[:1] == ["notified"]


def _alert_outcomes(state: Path) -> list[str]:
    path = state / "audit.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    records = [json.loads(line) for line in lines if line.endswith("}")]
    return [r["outcome"] for r in records if r.get("kind") == "action" and r.get("actuator") == "alert"]
