"""Alerts from a real controller run reach a real Alertmanager (v2 API), group
by node, job, rank, rule and severity, carry the evidence and where the audit
is, can be queried with ``amtool``, and are resolved when the rule clears.

The controller replays a slow phase of one rank's steps (500 ms, then back to
100 ms) under an ``alert-only`` policy; the alert must be there while the rule
fires and gone (resolved) once it has cleared. With an Alertmanager that
accepts connections and never answers, the alert is sent from its own thread:
the loop goes on, and SIGTERM ends the controller within the sender's
deadline. Stopped (SIGTERM) while two rules fire, the controller resolves
their alerts before it exits, unless the rules keep them
(``rollback: {alerts: keep}``); the loader and the schema agree on that field.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jsonschema
import pytest
import yaml
from conftest import ROOT, require, spawn_cli, wait_until

from reflexarc.actuators.alert import DEADLINE
from reflexarc.controller.policy.loader import validate_paths
from reflexarc.simulations.testbed.alertmanager import BINARY, Alertmanager

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


@pytest.mark.slow
def test_alert_reaches_alertmanager_groups_well_and_resolves_on_clear(tmp_path):
    require(Path(BINARY).exists(), f"Debian's prometheus-alertmanager at {BINARY} (scripts/bootstrap installs it)")
    require(Path(AMTOOL).exists(), f"amtool at {AMTOOL} (Debian's prometheus-alertmanager)")
    policy, replay, state, hooks = tmp_path / "p.yaml", tmp_path / "r.jsonl", tmp_path / "s", tmp_path / "h"
    policy.write_text(POLICY)
    _replay(replay)
    hooks.mkdir(mode=0o755)
    with Alertmanager() as am:
        proc = spawn_cli("--state-dir", str(state), "--hook-dir", str(hooks), "--alertmanager-url", am.url, "run",
                         "--no-probes", "--replay", str(replay), "--policy", str(policy), "--mode", "policy",
                         "--interval", "0.5", "--duration", "30", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
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


@pytest.mark.slow
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
    proc = spawn_cli("--state-dir", str(state), "--hook-dir", str(hooks), "--alertmanager-url", url, "run",
                     "--no-probes", "--replay", str(replay), "--policy", str(policy), "--mode", "policy",
                     "--interval", "0.5", "--duration", "60", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
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
    # Alertmanager would hang for ever: the loop never waits on it, and the stop
    # waits for the resolution STOP_DELIVERY at most (a bound on a hang, not a timing)
    assert took < DEADLINE, f"SIGTERM took {took:.1f} s while Alertmanager hung"
    assert _alert_outcomes(state) == ["notified", "resolved"]
    assert "not delivered" in err, err


def _alert_outcomes(state: Path) -> list[str]:
    path = state / "audit.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    records = [json.loads(line) for line in lines if line.endswith("}")]
    return [r["outcome"] for r in records if r.get("kind") == "action" and r.get("actuator") == "alert"]


TWO_RULES = """\
policies:
  - name: {name}
    mode: enforce
    rules:
      - name: steps-slow
        by: [job, rank]
        when: {{signal: step_time_ms, agg: max, window: 2s, op: ">", threshold: 300}}
        actions:
          - actuator: alert
            params: {{severity: warning}}{rollback}
      - name: steps-very-slow
        by: [job, rank]
        when: {{signal: step_time_ms, agg: max, window: 2s, op: ">", threshold: 400}}
        actions:
          - actuator: alert
            params: {{severity: critical}}{rollback}
"""


@pytest.mark.slow
@pytest.mark.parametrize("keep", [False, True], ids=["resolved-at-stop", "kept-at-stop"])
def test_sigterm_resolves_the_alerts_it_fired_unless_the_rules_keep_them(tmp_path, keep):
    require(Path(BINARY).exists(), f"Debian's prometheus-alertmanager at {BINARY} (scripts/bootstrap installs it)")
    name = "stop-keeps" if keep else "stop-resolves"
    policy, replay, state, hooks = tmp_path / "p.yaml", tmp_path / "r.jsonl", tmp_path / "s", tmp_path / "h"
    policy.write_text(TWO_RULES.format(name=name, rollback="\n        rollback: {alerts: keep}" if keep else ""))
    replay.write_text("".join(json.dumps({"t": i * 0.5, "name": "step_time_ms", "value": 500.0,
                                          "labels": {"job": "llama", "rank": "1"}}) + "\n" for i in range(120)))
    hooks.mkdir(mode=0o755)
    alertnames = {f"reflexarc_{name.replace('-', '_')}_{rule}" for rule in ("steps_slow", "steps_very_slow")}

    def ours(am: Alertmanager) -> set[str]:
        return {a["labels"]["alertname"] for a in am.alerts()} & alertnames

    with Alertmanager() as am:
        proc = spawn_cli("--state-dir", str(state), "--hook-dir", str(hooks), "--alertmanager-url", am.url, "run",
                         "--no-probes", "--replay", str(replay), "--policy", str(policy), "--mode", "policy",
                         "--interval", "0.5", "--duration", "120", "--kill-switch", str(tmp_path / "disable"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            wait_until("both rules' alerts in Alertmanager", lambda: ours(am) == alertnames, 40)
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, err
        # the process has exited: what Alertmanager shows now is what the stop left
        assert ours(am) == (alertnames if keep else set()), am.alerts()
    summary = json.loads(out.splitlines()[0])
    assert summary["actions"] == ({"notified": 2} if keep else {"notified": 2, "resolved": 2}), summary
    records = [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]
    resolved = sorted(r["rule"] for r in records if r["kind"] == "action" and r["outcome"] == "resolved")
    assert resolved == ([] if keep else ["steps-slow", "steps-very-slow"])


SLOW_REPLY_S = 0.5     # slow, but within the stop's wait for deliveries (STOP_DELIVERY)


def test_the_stop_waits_for_a_slow_receiver_to_take_the_resolution(tmp_path):
    """A receiver that answers each POST after 0.5 s: the resolution sent at stop
    is answered while the controller still waits for it (its connection is
    still open when the answer is due), not cut off by the process's exit."""
    delivered: list[dict] = []

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(SLOW_REPLY_S)
            self.connection.setblocking(False)
            try:
                gone = self.connection.recv(1, socket.MSG_PEEK) == b""   # the sender closed: it gave up
            except BlockingIOError:
                gone = False                                            # still waiting for the answer
            self.connection.setblocking(True)
            if not gone:
                delivered.extend(body)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    policy, replay, state, hooks = tmp_path / "p.yaml", tmp_path / "r.jsonl", tmp_path / "s", tmp_path / "h"
    policy.write_text(TWO_RULES.format(name="slow-receiver", rollback=""))
    replay.write_text("".join(json.dumps({"t": i * 0.5, "name": "step_time_ms", "value": 350.0,
                                          "labels": {"job": "llama", "rank": "1"}}) + "\n" for i in range(120)))
    hooks.mkdir(mode=0o755)
    proc = spawn_cli("--state-dir", str(state), "--hook-dir", str(hooks), "--alertmanager-url",
                     f"http://127.0.0.1:{server.server_address[1]}", "run", "--no-probes", "--replay", str(replay),
                     "--policy", str(policy), "--mode", "policy", "--interval", "0.5", "--duration", "120",
                     "--kill-switch", str(tmp_path / "disable"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until("the firing alert at the receiver", lambda: delivered, 40)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        server.shutdown()
        server.server_close()
    assert proc.returncode == 0, err
    assert [("endsAt" in a, a["labels"]["rule"]) for a in delivered] == [(False, "steps-slow"), (True, "steps-slow")]


ALERT_ACTION = [{"actuator": "alert", "params": {"severity": "warning"}}]
SYSCTL_ACTION = [{"actuator": "sysctl", "params": {"key": "kernel.numa_balancing", "value": "0"}}]


@pytest.mark.parametrize("actions, rollback, accepted", [
    (ALERT_ACTION, None, "resolve"),
    (ALERT_ACTION, {"alerts": "keep"}, "keep"),
    (ALERT_ACTION, {"never": True, "alerts": "keep"}, "keep"),
    (ALERT_ACTION, {"on": ["clear"], "alerts": "resolve"}, "resolve"),
    (ALERT_ACTION, {"alerts": "maybe"}, None),
    (ALERT_ACTION, {"never": False, "alerts": "keep"}, None),
    (SYSCTL_ACTION, {"on": ["clear", "shutdown"], "alerts": "keep"}, "keep"),
    (SYSCTL_ACTION, {"alerts": "keep"}, None),            # the change would have nothing to undo it
])
def test_loader_and_schema_agree_on_keeping_alerts_at_stop(tmp_path, actions, rollback, accepted):
    rule = {"name": "r", "actions": actions,
            "when": {"signal": "step_time_ms", "agg": "max", "window": "2s", "op": ">", "threshold": 300}}
    if rollback is not None:
        rule["rollback"] = rollback
    document = {"policies": [{"name": "p", "rules": [rule]}]}
    validator = jsonschema.Draft202012Validator(json.loads((ROOT / "policies" / "schema.json").read_text()))
    assert validator.is_valid(document) is (accepted is not None)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(document))
    policies, diagnostics = validate_paths([str(path)])
    if accepted is None:
        assert policies == [] and [d for d in diagnostics if d.severity == "error"]
    else:
        assert [p.rules[0].rollback.alerts for p in policies] == [accepted], [str(d) for d in diagnostics]
