"""A controller SIGKILLed between apply and verify: the next start reconciles the
journal and reverts the change (or adopts it when the rule says so).

Real processes and a real actuator: the ``sysctl`` actuator writes into a
fixture ``/proc/sys`` tree (``--proc-root``), so the test needs no root and
leaves the machine alone.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import run_cli, spawn_cli

POLICY = """\
policies:
  - name: crash-test
    mode: enforce
    selector: {{match: {{job: j}}}}
    rules:
      - name: slow-steps
        by: [rank]
        when: {{signal: step_time_ms, agg: max, window: 2s, op: ">", threshold: 300}}
        actions:
          - actuator: sysctl
            params: {{key: kernel.numa_balancing, value: "0"}}
        verify:
          when: {{signal: step_time_ms, agg: max, window: 2s, op: "<", threshold: 300}}
          timeout: 10m
        rollback: {{on: [verify-failed], on_restart: {on_restart}}}
"""


def setup(tmp: Path, on_restart: str):
    proc = tmp / "proc"
    knob = proc / "sys" / "kernel" / "numa_balancing"
    knob.parent.mkdir(parents=True)
    knob.write_text("1\n")
    (tmp / "policy.yaml").write_text(POLICY.format(on_restart=on_restart))
    with open(tmp / "signals.jsonl", "w") as f:
        for i in range(600):
            f.write(json.dumps({"t": i * 0.1, "name": "step_time_ms",
                                "labels": {"job": "j", "rank": "0"}, "value": 520}) + "\n")
    # its own hook directory: the test neither depends on nor creates the node's /run/reflexarc/hooks
    base = ["--state-dir", str(tmp / "state"), "--proc-root", str(proc), "--hook-dir", str(tmp / "hooks")]
    return knob, base


def start_and_kill(tmp: Path, base: list[str]) -> None:
    journal = tmp / "state" / "journal.jsonl"
    ctl = spawn_cli(*base, "run", "--no-probes", "--replay", str(tmp / "signals.jsonl"), "--policy",
                    str(tmp / "policy.yaml"), "--interval", "0.1", "--mode", "policy", "--kill-switch",
                    str(tmp / "disable"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if journal.exists() and '"applied"' in journal.read_text():
                break
            if ctl.poll() is not None:
                pytest.fail(f"controller exited early: {ctl.stderr.read()}")
            time.sleep(0.05)
        else:
            pytest.fail("the controller never applied the change")
        os.kill(ctl.pid, signal.SIGKILL)   # between apply and verify (verify waits up to 10 min)
    finally:
        ctl.wait(timeout=30)
    assert ctl.returncode == -signal.SIGKILL


def restart(tmp: Path, base: list[str]) -> subprocess.CompletedProcess:
    return run_cli(*base, "run", "--no-probes", "--duration", "0", "--policy", str(tmp / "policy.yaml"),
                   "--kill-switch", str(tmp / "disable"), timeout=60)


def test_killed_controller_change_is_reverted_on_restart(tmp_path, cli):
    knob, base = setup(tmp_path, "revert")
    start_and_kill(tmp_path, base)
    assert knob.read_text().strip() == "0", "the change was applied before the kill"
    r = restart(tmp_path, base)
    assert r.returncode == 0, r.stderr
    assert knob.read_text().strip() == "1"
    journal = cli(*base, "journal")
    assert journal.stdout.strip() == "", "nothing is left open in the journal"
    audit = [json.loads(x) for x in (tmp_path / "state" / "audit.jsonl").read_text().splitlines()]
    assert any(r["kind"] == "action" and r.get("note") == "reconciled at start" and r["outcome"] == "reverted"
               for r in audit)


def test_killed_controller_change_is_adopted_when_rule_says_so(tmp_path, cli):
    knob, base = setup(tmp_path, "adopt")
    start_and_kill(tmp_path, base)
    r = restart(tmp_path, base)
    assert r.returncode == 0, r.stderr
    assert knob.read_text().strip() == "0", "adopted: the change stays"
    listed = cli(*base, "journal").stdout
    assert "applied" in listed and "sysctl" in listed
    # the operator's lever still reverts it
    rb = cli(*base, "rollback", "--all")
    assert rb.returncode == 0, rb.stderr
    assert knob.read_text().strip() == "1"


def test_fault_injection_after_apply_then_rollback_all(tmp_path, cli):
    """The manual lever: ``act`` killed right after apply, ``rollback --all`` restores."""
    knob, base = setup(tmp_path, "revert")
    r = cli(*base, "act", "sysctl", "key=kernel.numa_balancing", "value=0", "--mode", "enforce",
            env={**os.environ, "REFLEXARC_FAULT_INJECT": "after-apply"})
    assert r.returncode == -signal.SIGKILL
    assert knob.read_text().strip() == "0"
    rb = cli(*base, "rollback", "--all")
    assert rb.returncode == 0, rb.stderr
    assert "reverted" in rb.stdout and "kernel.numa_balancing" in rb.stdout, rb.stdout   # says what it undid
    assert knob.read_text().strip() == "1"


def test_run_defaults_to_dry_run_even_for_an_enforce_policy(tmp_path, cli):
    knob, base = setup(tmp_path, "revert")
    r = cli(*base, "run", "--no-probes", "--replay", str(tmp_path / "signals.jsonl"), "--policy",
            str(tmp_path / "policy.yaml"), "--interval", "0.2", "--duration", "3", "--kill-switch",
            str(tmp_path / "disable"), timeout=60)
    assert r.returncode == 0, r.stderr
    assert knob.read_text().strip() == "1"
    audit = [json.loads(x) for x in (tmp_path / "state" / "audit.jsonl").read_text().splitlines()]
    assert [a["outcome"] for a in audit if a["kind"] == "action"] == ["planned"]


def test_metrics_endpoint_exports_rule_state_and_would_have_acted(tmp_path):
    """``run --metrics-port`` serves Prometheus text: the lifecycle state as an
    Enum and the would-have-acted counter of a dry-run."""
    import socket
    import urllib.request
    knob, base = setup(tmp_path, "revert")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctl = spawn_cli(*base, "run", "--no-probes", "--replay", str(tmp_path / "signals.jsonl"), "--policy",
                    str(tmp_path / "policy.yaml"), "--interval", "0.2", "--duration", "30", "--metrics-port",
                    str(port), "--kill-switch", str(tmp_path / "disable"), stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        text = ""
        while time.monotonic() < deadline and "reflexarc_would_have_acted_total{" not in text:
            time.sleep(0.3)
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                continue
    finally:
        ctl.send_signal(signal.SIGTERM)
        ctl.communicate(timeout=30)
    assert 'reflexarc_would_have_acted_total{actuator="sysctl",policy="crash-test",rule="slow-steps"} 1.0' in text
    assert ('reflexarc_rule_state{policy="crash-test",reflexarc_rule_state="remediated",rule="slow-steps",'
            'target="rank=0"} 1.0') in text
    assert knob.read_text().strip() == "1"
