"""Hot reload of the policies: a real ``reflexarc run`` process reloads on a
file change and on SIGHUP, refuses a broken set and keeps the running one,
reverts the change of a removed policy on a real process, and keeps the state
of rules that did not change; in process, the reloader's checks (trust,
metrics) and the swap's rules (adopt, what counts as the same rule).

The subprocess test needs no probes: signals come from ``--replay``; the
``affinity`` actuator re-pins a sleeping worker the test started (a fixture
sysfs with two NUMA nodes), and ``log`` actions show that a policy acts.
Every wait is for a condition, with a generous deadline.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, allowed, require, require_root, spawn_cli, two_node_sys

from reflexarc.actuators.base import Registry
from reflexarc.actuators.log import LogActuator
from reflexarc.controller.engine.audit import AuditLog
from reflexarc.controller.engine.bus import SignalBus
from reflexarc.controller.engine.clock import SimClock
from reflexarc.controller.engine.engine import Controller
from reflexarc.controller.engine.metrics import ControllerMetrics
from reflexarc.controller.policy.loader import load_policies
from reflexarc.controller.signals.producers import NodeFacts
from reflexarc.controller.runtime.reload import SIGHUP, PolicyFiles, Reloader

pytestmark = [pytest.mark.kernel]

DEADLINE = 90.0     # seconds for any one thing to happen; it normally takes one or two

WORKER = str(ROOT / "tests" / "workloads" / "idle_worker.py")

PIN = """\
policies:
  - name: pin
    selector: {{match: {{job: j}}, pids: [{worker}]}}
    rules:
      - name: pin-workers
        when: {{signal: step_time_ms, match: {{rank: "0"}}, agg: max, window: 2s, op: ">", threshold: 300}}
        actions:
          - actuator: affinity
            params: {{node: 1}}
        rollback: {{on: [shutdown]}}
"""

NOTE = """\
policies:
  - name: {name}
    selector: {{match: {{job: j}}}}
    rules:
      - name: slow-rank
        by: [rank]
        when: {{signal: step_time_ms, agg: max, window: 2s, op: ">", threshold: 300}}
        actions:
          - actuator: log
            params: {{message: "{name}: slow rank"}}
        rollback: {{on: [shutdown]}}
"""

HOLD = """\
policies:
  - name: hold
    selector: {match: {job: j}}
    rules:
      - name: long-wait
        when: {signal: step_time_ms, match: {rank: "0"}, agg: max, window: 2s, op: ">", threshold: 300}
        for: 1h
        actions:
          - actuator: log
            params: {message: "held for an hour"}
        rollback: {on: [shutdown]}
"""

BROKEN = NOTE.format(name="late").replace('op: ">"', 'op: ">>"')   # one error, at the operator


def put(path: Path, text: str) -> None:
    """Write a policy file the way an installer does: whole, renamed into place, 0644."""
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(text)
    tmp.chmod(0o644)
    os.replace(tmp, path)


def replay(path: Path) -> None:
    """Rank 0 slow from the start; one more slow rank every 4 s (each a new target
    of the ``slow-rank`` rules, so a policy's acting can be seen at any time)."""
    with open(path, "w") as f:
        for t in range(300):
            for rank in range(t // 4 + 1):
                f.write(json.dumps({"t": t, "name": "step_time_ms", "labels": {"job": "j", "rank": str(rank)},
                                    "value": 520}) + "\n")


class Run:
    """The controller process, its stderr (a file: read at any time) and its audit."""

    def __init__(self, tmp: Path, policy_dir: Path) -> None:
        self.tmp = tmp
        self.audit_path = tmp / "state" / "audit.jsonl"
        self.stderr_path = tmp / "stderr.log"
        hooks = tmp / "hooks"
        hooks.mkdir()
        hooks.chmod(0o755)
        self.stderr = open(self.stderr_path, "w")
        self.proc = spawn_cli("--state-dir", str(tmp / "state"), "--sys-root", str(two_node_sys(tmp / "sys")),
                              "--hook-dir", str(hooks),
                              "run", "--no-probes", "--replay", str(tmp / "signals.jsonl"), "--mode", "enforce",
                              "--policy", str(policy_dir), "--interval", "0.2", "--duration", "600",
                              "--kill-switch", str(tmp / "disable"), stdout=subprocess.PIPE, stderr=self.stderr)

    def text(self) -> str:
        return self.stderr_path.read_text()

    def records(self) -> list[dict]:
        if not self.audit_path.exists():
            return []
        lines = self.audit_path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]   # the last may be half-written

    def wait(self, what: str, check):
        """Poll ``check()`` until it returns something true; fail with ``what`` at the deadline."""
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            found = check()
            if found:
                return found
            if self.proc.poll() is not None:
                pytest.fail(f"the controller exited while waiting for {what}:\n{self.text()}")
            time.sleep(0.1)
        pytest.fail(f"timed out waiting for {what}:\n{self.text()[-4000:]}")

    def reload_record(self, after: int = 0, **want) -> tuple[int, dict] | None:
        for i, rec in enumerate(self.records()):
            if i >= after and rec["kind"] == "reload" and all(rec.get(k) == v for k, v in want.items()):
                return i, rec
        return None

    def action_after(self, index: int, policy: str) -> dict | None:
        return next((rec for rec in self.records()[index:] if rec["kind"] == "action"
                     and rec["policy"] == policy and rec["outcome"] == "notified"), None)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.communicate(timeout=DEADLINE)
        self.stderr.close()
        return self.text()


def held(run: Run) -> list[tuple]:
    """What the audit says of the ``hold`` rule's runs: a new run would go to pending again."""
    return [(r["kind"], r.get("to")) for r in run.records()
            if r.get("policy") == "hold" and r["kind"] in ("transition", "retire")]


def test_run_reloads_refuses_reverts_and_keeps_state(tmp_path):
    require_root()
    require(len(os.sched_getaffinity(0)) >= 2, "at least two CPUs")
    policy_dir = tmp_path / "policies"
    policy_dir.mkdir()
    policy_dir.chmod(0o755)
    replay(tmp_path / "signals.jsonl")
    worker = subprocess.Popen([sys.executable, WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    run = None
    try:
        assert worker.stdout.readline().strip() == "ready"
        before = allowed(worker.pid)
        put(policy_dir / "pin.yaml", PIN.format(worker=worker.pid))
        put(policy_dir / "note.yaml", NOTE.format(name="note"))
        put(policy_dir / "hold.yaml", HOLD)
        run = Run(tmp_path, policy_dir)
        run.wait("the worker re-pinned to node 1", lambda: allowed(worker.pid) == {"1"})
        run.wait("hold/long-wait pending", lambda: any(r["kind"] == "transition" and r["policy"] == "hold"
                                                       and r["to"] == "pending" for r in run.records()))

        # (a) a broken file: refused with its located error, counted in the audit; the old set acts on
        (policy_dir / "late.yaml").write_text(BROKEN)
        line = run.wait("the located error", lambda: next(
            (x for x in run.text().splitlines() if x.startswith(f"{policy_dir / 'late.yaml'}:7:")), None))
        assert ": error: 'op' '>>' is not valid; did you mean '>'?" in line
        run.wait("the refusal line", lambda: "reload refused (file change): 1 error(s) in policy files; "
                                             "keeping 3 policies" in run.text())
        refused, rec = run.reload_record(outcome="refused")
        assert rec["running"] == ["hold", "note", "pin"] and rec["errors"] == [line]
        run.wait("an action of the old policies after the refusal", lambda: run.action_after(refused, "note"))
        assert allowed(worker.pid) == {"1"}

        # (b) fixed: the new policy acts (e: the unchanged rule of another file keeps its pending state)
        put(policy_dir / "late.yaml", NOTE.format(name="late"))
        ok, rec = run.wait("the reload", lambda: run.reload_record(refused, outcome="ok"))
        assert rec["reason"] == "file change" and rec["added"] == ["late"]
        assert rec["removed"] == rec["changed"] == rec["ended_rules"] == []
        assert "hold/long-wait" in rec["kept_rules"] and "pin/pin-workers" in rec["kept_rules"]
        run.wait("its line", lambda: "policies reloaded (file change): added late; 3 rules kept their state; "
                                     "running 4 policies" in run.text())   # printed once the swap is done
        run.wait("an action of the new policy", lambda: run.action_after(ok, "late"))
        assert held(run) == [("transition", "pending")], "one run, pending since before the reload"

        # (d) SIGHUP reloads at once, with a change and without
        put(policy_dir / "extra.yaml", NOTE.format(name="extra"))
        os.kill(run.proc.pid, signal.SIGHUP)
        hup, rec = run.wait("the SIGHUP reload", lambda: run.reload_record(ok + 1, reason=SIGHUP))
        assert rec["added"] == ["extra"] and rec["outcome"] == "ok"
        os.kill(run.proc.pid, signal.SIGHUP)
        _, rec = run.wait("the second SIGHUP reload", lambda: run.reload_record(hup + 1, reason=SIGHUP))
        assert rec["added"] == rec["removed"] == rec["changed"] == []
        run.wait("its line", lambda: "policies reloaded (SIGHUP): nothing changed; running 5 policies" in run.text())

        # (c) the policy whose change is active is removed: its change is reverted
        (policy_dir / "pin.yaml").unlink()
        gone, rec = run.wait("the reload without pin", lambda: run.reload_record(hup + 1, removed=["pin"]))
        assert rec["ended_rules"] == ["pin/pin-workers"]
        run.wait("the worker's affinity restored", lambda: allowed(worker.pid) == before)
        run.wait("its line", lambda: "policies reloaded (file change): removed pin; their changes: 1 reverted; "
                                     "4 rules kept their state; running 4 policies" in run.text())
        pin = [r for r in run.records()[gone:] if r.get("policy") == "pin"]
        assert [(r["kind"], r.get("outcome"), r["note"]) for r in pin] == [
            ("action", "reverted", "rule removed at reload"), ("retire", None, "rule removed at reload")]
        assert allowed(worker.pid) == before
        assert held(run) == [("transition", "pending")], "still the same pending run, four reloads later"

        err = run.stop()
        assert run.proc.returncode == 0, err
        assert "Traceback" not in err
        assert run.records()[-1]["kind"] == "end"
    finally:
        if run is not None and run.proc.poll() is None:
            run.stop()
        worker.stdin.close()
        worker.wait(timeout=30)


# --- in process ---------------------------------------------------------------------
ENFORCED = """\
policies:
  - name: {name}
    mode: enforce
    selector: {{match: {{job: j}}}}
    rules:
      - name: slow
        by: [rank]
        when: {{signal: step_time_ms, agg: max, window: 10s, op: ">", threshold: 300}}
        for: {for_}
        actions:
          - actuator: log
            params: {{message: slow}}
        rollback: {{on: [shutdown]}}
"""


def controller(policy_dir: Path, clock: SimClock) -> Controller:
    registry = Registry()
    registry.register(LogActuator.spec, LogActuator)
    ctl = Controller(load_policies([str(policy_dir)]), SignalBus(), registry, clock, audit=AuditLog(None, clock),
                     metrics=ControllerMetrics())
    ctl.start("test")
    return ctl


def reloader(ctl: Controller, policy_dir: Path) -> Reloader:
    return Reloader(ctl, PolicyFiles([str(policy_dir)]), NodeFacts(), receiver=False)


def test_refused_reload_is_located_counted_and_keeps_the_running_set(tmp_path, capsys):
    policy_dir = tmp_path / "p"
    policy_dir.mkdir()
    put(policy_dir / "a.yaml", ENFORCED.format(name="a", for_="0s"))
    clock = SimClock()
    ctl = controller(policy_dir, clock)
    rl = reloader(ctl, policy_dir)
    metrics = ctl.metrics.registry
    put(policy_dir / "b.yaml", ENFORCED.format(name="b", for_="0s"))
    (policy_dir / "b.yaml").chmod(0o666)     # an enforcing policy others may write
    res = rl.reload(SIGHUP)
    assert not res.ok and res.running == 1 and [p.name for p in ctl.policies] == ["a"]
    err = capsys.readouterr().err.splitlines()
    assert err[:1] == [str(d) for d in res.diagnostics]
    assert err == [f"{policy_dir / 'b.yaml'}:2:5: error: policy b would enforce, but the file is writable by "
                   "group and others (mode 0666)",
                   "reload refused (SIGHUP): 1 error(s) in policy files; keeping 1 policy"]
    assert metrics.get_sample_value("reflexarc_policy_reloads_total", {"outcome": "error"}) == 1
    assert metrics.get_sample_value("reflexarc_policy_last_reload_ok") == 0
    assert ctl.audit.records[-1]["kind"] == "reload" and ctl.audit.records[-1]["outcome"] == "refused"

    (policy_dir / "b.yaml").chmod(0o644)
    res = rl.reload(SIGHUP)
    assert res.ok and res.swap.added == ("b",) and [p.name for p in ctl.policies] == ["a", "b"]
    assert metrics.get_sample_value("reflexarc_policy_reloads_total", {"outcome": "ok"}) == 1
    assert metrics.get_sample_value("reflexarc_policy_last_reload_ok") == 1

    for f in policy_dir.iterdir():
        f.unlink()
    res = rl.reload(SIGHUP)
    assert not res.ok and [p.name for p in ctl.policies] == ["a", "b"], "no policy at all is refused too"
    assert "keeping 2 policies" in capsys.readouterr().err


def test_the_same_rule_elsewhere_keeps_its_state_and_a_changed_one_starts_afresh(tmp_path, capsys):
    """Comments, another line, another file: the same rule, pending on; a changed
    threshold: a new rule, from ok."""
    policy_dir = tmp_path / "p"
    policy_dir.mkdir()
    put(policy_dir / "a.yaml", ENFORCED.format(name="a", for_="1h") + ENFORCED.format(name="b", for_="1h")
        .replace("policies:\n", ""))
    clock = SimClock()
    ctl = controller(policy_dir, clock)
    rl = reloader(ctl, policy_dir)
    for t in range(5):
        clock.set(float(t))
        ctl.bus.publish("step_time_ms", {"job": "j", "rank": "0"}, 520.0, t)
        ctl.tick()
    runs = dict(ctl.runs)
    assert {k: r.state for k, r in runs.items()} == {("a", "slow", "rank=0"): "pending",
                                                      ("b", "slow", "rank=0"): "pending"}
    (policy_dir / "a.yaml").unlink()
    put(policy_dir / "b.yaml", "# moved here, below a comment\n\n" + ENFORCED.format(name="b", for_="1h"))
    put(policy_dir / "c.yaml", ENFORCED.format(name="a", for_="1h").replace("threshold: 300", "threshold: 400"))
    res = rl.reload(SIGHUP)
    assert res.ok and res.swap.changed == ("a",) and res.swap.kept_rules == ("b/slow",)
    assert res.swap.ended_rules == ("a/slow",)
    assert ctl.runs[("b", "slow", "rank=0")] is runs[("b", "slow", "rank=0")]
    assert ctl.runs[("b", "slow", "rank=0")].state == "pending"
    assert ("a", "slow", "rank=0") not in ctl.runs
    clock.set(5.0)
    ctl.tick()
    assert ctl.runs[("a", "slow", "rank=0")] is not runs[("a", "slow", "rank=0")]
    assert ctl.runs[("a", "slow", "rank=0")].state == "pending"
    assert "policies reloaded (SIGHUP): changed a; 1 rule kept its state; running 2 policies" \
        in capsys.readouterr().err


def test_removed_rule_reverts_its_change_unless_it_adopts(tmp_path):
    from engine_fixtures import policy, registry
    for on_restart, rollback_on, after in (("revert", ("clear",), 0), ("adopt", ("shutdown",), 0),
                                           ("adopt", ("clear",), 1)):
        state, sent = {}, []
        clock = SimClock()
        ctl = Controller([policy(verify=False, on_restart=on_restart, rollback_on=rollback_on)], SignalBus(),
                         registry(state, sent), clock)
        ctl.start("test")
        for t in range(10):
            clock.set(float(t))
            ctl.bus.publish("step_time_ms", {"job": "j", "rank": "0"}, 300.0, t)
            ctl.tick()
        assert state == {"rank=0": 1} and ctl.active_count() == 1
        other = policy(verify=False)
        other.name = "other"
        swap = ctl.replace_policies([other], "test")
        assert swap.removed == ("test-policy",) and swap.added == ("other",)
        assert swap.ended_changes == ("adopted" if after else "reverted",)
        assert state == {"rank=0": after}, (on_restart, rollback_on)
        assert ctl.active_count() == 0 and not [k for k in ctl.runs if k[0] == "test-policy"]
        last = [r for r in ctl.audit.records if r["kind"] == "action"][-1]
        assert (last["outcome"], last["note"]) == ("adopted" if after else "reverted", "rule removed at reload")


def test_a_change_is_read_once_the_files_settle(tmp_path):
    policy_dir = tmp_path / "p"
    policy_dir.mkdir()
    put(policy_dir / "a.yaml", ENFORCED.format(name="a", for_="0s"))
    files = PolicyFiles([str(policy_dir)])
    (policy_dir / ".a.yaml.swp").write_text("an editor's")
    (policy_dir / "notes.txt").write_text("not a policy")
    assert not files.settled_change() and not files.settled_change(), "not policy files: no change"
    (policy_dir / "a.yaml").write_text(ENFORCED.format(name="a", for_="1s"))
    assert not files.settled_change(), "just written: wait one more poll"
    assert files.settled_change()
    files.mark_loaded()
    assert not files.settled_change()
    (policy_dir / "a.yaml").unlink()
    files.settled_change()
    assert files.settled_change(), "a removed file is a change"
