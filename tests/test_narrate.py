"""The controller tells what it does on stderr, without ``-v``: one line per
transition and per action (time, policy/rule, target, what changed, the
evidence in a few words), lines for node events, nothing for per-tick
evaluations, as text or JSON (``--log-format json``), and no ``transitions``
library noise under ``-v``. The testbed's loop prints what each policy did
beside its table.

The live case runs ``reflexarc run`` on replayed step times under an enforcing
policy whose ``sysctl`` action writes into a fixture ``/proc/sys`` tree
(``--proc-root``): it applies, verifies, clears and reverts, and stderr must
carry one line for each transition and action the audit recorded, in order.
"""
from __future__ import annotations

import io
import json
import logging
import re
import subprocess
from pathlib import Path

import pytest
from conftest import run_cli

from reflexarc.controller.engine.audit import AuditLog
from reflexarc.controller.engine.clock import SimClock
from reflexarc.controller.runtime.narrate import JsonFormatter, Narrator, configure_logging, describe, evidence_text
from reflexarc.simulations.testbed.closed_loop import format_actions


STEP_SLOW = {"condition": 'max(step_time_ms{}[30s]) > 1.5x baseline', "signal": "step_time_ms", "agg": "max",
             "window": 30.0, "op": ">", "value": 374.2, "threshold": 274.5, "baseline": 183.0, "ok": True}
LOADER_OK = {"condition": 'p99(dataloader_read_latency_us{}[30s]) > 3000', "signal": "dataloader_read_latency_us",
             "agg": "p99", "window": 30.0, "op": ">", "value": 812.0, "threshold": 3000.0, "baseline": None,
             "ok": False}


def transition(**fields) -> dict:
    rec = {"ts": 1_700_000_000.0, "kind": "transition", "policy": "slow-steps", "rule": "step-time",
           "target": "job=llama,pid=4242,rank=1", "target_labels": {"job": "llama", "rank": "1", "pid": "4242"},
           "mode": "enforce", "from": "ok", "to": "pending", "trigger": "breach", "evidence": [STEP_SLOW], "note": ""}
    return {**rec, **fields}


def test_a_transition_reads_as_target_change_and_evidence():
    assert describe(transition()) == ("slow-steps/step-time job=llama rank=1: ok -> pending: "
                                      "step_time_ms 374 > 1.5x baseline 183")
    # a condition that does not hold shows the negated operator; only the holding ones when some hold
    calm = transition(**{"from": "pending", "to": "ok", "evidence": [dict(STEP_SLOW, value=150.0, ok=False),
                                                                       LOADER_OK]})
    assert describe(calm).endswith("pending -> ok: step_time_ms 150 <= 1.5x baseline 183, "
                                   "dataloader_read_latency_us 812 <= 3000")
    assert describe(transition(evidence=[STEP_SLOW, LOADER_OK])).endswith("ok -> pending: step_time_ms 374 > "
                                                                         "1.5x baseline 183")
    noted = transition(**{"from": "verifying", "to": "recovering", "note": "not verified within 60s"})
    assert "verifying -> recovering (not verified within 60s): " in describe(noted)


def test_the_target_is_its_job_rank_and_pod_else_its_key():
    assert describe(transition(target_labels={"pod": "llama-0", "job": "llama"})).startswith(
        "slow-steps/step-time job=llama pod=llama-0: ")
    assert describe(transition(target="pid=812", target_labels={"pid": "812"})).startswith(
        "slow-steps/step-time pid=812: ")


def test_actions_and_node_events_each_have_a_line():
    action = {"ts": 1.0, "kind": "action", "policy": "numa", "rule": "repin", "target": "trainer=4100",
              "target_labels": {"trainer": "4100"}, "mode": "enforce", "step": 0, "actuator": "affinity",
              "outcome": "applied", "change": {"summary": "pinned 9 threads to node 0"}, "journal_id": "j1",
              "error": None}
    assert describe(action) == "numa/repin trainer=4100: affinity applied: pinned 9 threads to node 0"
    failed = dict(action, outcome="failed", error="EPERM", change=None)
    assert describe(failed) == "numa/repin trainer=4100: affinity failed; error: EPERM"
    reconciled = dict(action, policy="", rule="", outcome="reverted", note="reconciled at start")
    assert describe(reconciled) is None      # run printed it before the audit opened: not told twice
    reverted = dict(reconciled, note="rolled back by an operator (uid 0, pid 7)")
    assert describe(reverted) == ("journal j1 trainer=4100: affinity reverted: pinned 9 threads to node 0 "
                                  "(rolled back by an operator (uid 0, pid 7))")
    assert describe({"ts": 1.0, "kind": "pause", "reason": "upgrade", "by": {"uid": 0, "pid": 7},
                     "duration": 600.0}) == "reflexarc enforcement paused for 600 s by uid 0 (pid 7): upgrade"
    assert describe({"ts": 1.0, "kind": "kill_switch", "engaged": True, "path": "/run/x"}).startswith(
        "reflexarc kill switch engaged (/run/x): no change is made")
    limit = {"ts": 1.0, "kind": "limit", "policy": "numa", "rule": "repin", "target": "trainer=4100",
             "reason": "kill_switch"}
    assert "kill switch is engaged" in describe(limit)
    assert describe({"ts": 1.0, "kind": "reload", "reason": "SIGHUP", "outcome": "ok", "added": ["b"],
                     "removed": [], "changed": ["a"]}) == "reflexarc policies reloaded (SIGHUP): added b; changed a"
    assert "refused" in describe({"ts": 1.0, "kind": "reload", "reason": "file changed", "outcome": "refused",
                                  "errors": ["p.yaml:3:5: error: bad"], "running": ["a"]})
    # a kind without words of its own is told as its fields, never dropped
    assert describe({"ts": 1.0, "kind": "maintenance", "reason": "operator", "until": 60}) == \
        "reflexarc: maintenance: reason=operator, until=60"
    # per-tick evaluations and target bookkeeping are not told
    assert describe({"ts": 1.0, "kind": "eval", "policy": "p", "rule": "r", "values": []}) is None
    assert describe({"ts": 1.0, "kind": "retire", "policy": "p", "rule": "r", "target": "pid=1"}) is None


def test_evidence_without_data_or_baseline_says_so():
    assert evidence_text(dict(LOADER_OK, value=None)) == "dataloader_read_latency_us no data"
    assert evidence_text(dict(STEP_SLOW, baseline=None, threshold=None, ok=False)) == \
        "step_time_ms 374 (no baseline yet)"


def test_the_audit_tells_its_listeners_and_a_failing_one_stops_nothing(caplog):
    text, events = io.StringIO(), io.StringIO()
    seen = []

    def broken(rec: dict) -> None:
        raise RuntimeError("listener bug")

    audit = AuditLog(None, SimClock(), listeners=[broken, Narrator("text", text), Narrator("json", events),
                                                  seen.append])
    audit.write("transition", **{k: v for k, v in transition().items() if k not in ("ts", "kind")})
    audit.write("eval", policy="slow-steps", rule="step-time", target="job=llama", state="ok", result=False,
                values=[])
    assert [r["kind"] for r in seen] == ["transition", "eval"]
    assert audit.listener_errors == 2 and len(caplog.records) == 1   # logged once, then counted
    (line,) = text.getvalue().splitlines()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d slow-steps/step-time job=llama rank=1: ok -> pending: "
                        r"step_time_ms 374 > 1\.5x baseline 183", line), line
    (event,) = [json.loads(x) for x in events.getvalue().splitlines()]
    assert {k: event[k] for k in ("kind", "level", "policy", "rule", "from", "to", "labels")} == {
        "kind": "transition", "level": "INFO", "policy": "slow-steps", "rule": "step-time", "from": "ok",
        "to": "pending", "labels": {"job": "llama", "rank": "1", "pid": "4242"}}
    assert event["msg"] == line.split(" ", 2)[2] and event["ts"].endswith("Z")


def test_log_records_in_json_and_library_noise_only_at_vv():
    record = logging.LogRecord("reflexarc.audit", logging.ERROR, __file__, 1, "audit %s failed", ("x",), None)
    out = json.loads(JsonFormatter().format(record))
    assert {k: out[k] for k in ("level", "logger", "msg")} == {"level": "ERROR", "logger": "reflexarc.audit",
                                                               "msg": "audit x failed"}
    root, library = logging.getLogger(), logging.getLogger("transitions")
    before = root.level, list(root.handlers), library.level
    try:
        configure_logging(1)
        assert library.level == logging.WARNING              # -v: "Finished processing state ..." stays out
        configure_logging(2)
        assert library.level == logging.NOTSET               # -vv: as the root logger says
    finally:
        root.setLevel(before[0])
        root.handlers[:] = before[1]
        library.setLevel(before[2])


def test_the_loop_summary_names_each_policy_and_what_it_did():
    results = [{"fault": "a", "name": "bulk upload on the bottleneck", "policy": "nccl-congestion-dscp",
                "onset": 100.0, "actions": [{"ts": 106.55, "actuator": "dscp", "outcome": "applied", "error": None,
                                             "target": "*", "summary": "dscp CS1 (8) on r0:e0 for tcp ports 443-443"}]},
               {"fault": "e", "name": "no fault", "policy": None, "onset": 5.0, "actions": []}]
    assert format_actions(results).splitlines() == [
        "a nccl-congestion-dscp: dscp applied +6.5 s: dscp CS1 (8) on r0:e0 for tcp ports 443-443",
        "e no fault: no action"]


POLICY = """\
policies:
  - name: numa-off
    mode: enforce
    selector: {match: {job: j}}
    rules:
      - name: slow-steps
        by: [job, rank]
        when: {signal: step_time_ms, agg: max, window: 1s, op: ">", threshold: 300}
        actions:
          - actuator: sysctl
            params: {key: kernel.numa_balancing, value: "0"}
        verify:
          when: {signal: step_time_ms, agg: max, window: 1s, op: "<", threshold: 300}
          timeout: 30s
        clear_for: 1s
        rollback: {on: [verify-failed, clear]}
"""


def _run(tmp_path: Path, *options: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """A live run over 5 s of slow steps, then healthy ones; its result and audit records."""
    knob = tmp_path / "proc" / "sys" / "kernel" / "numa_balancing"
    knob.parent.mkdir(parents=True)
    knob.write_text("1\n")
    (tmp_path / "hooks").mkdir()
    (tmp_path / "p.yaml").write_text(POLICY)
    (tmp_path / "r.jsonl").write_text("".join(
        json.dumps({"t": i * 0.1, "name": "step_time_ms", "labels": {"job": "j", "rank": "0"},
                    "value": 520.0 if i < 50 else 100.0}) + "\n" for i in range(120)))
    r = run_cli(*options, "--state-dir", str(tmp_path / "state"), "--proc-root", str(tmp_path / "proc"), "--hook-dir",
                str(tmp_path / "hooks"), "run", "--no-probes", "--replay", str(tmp_path / "r.jsonl"), "--policy",
                str(tmp_path / "p.yaml"), "--mode", "policy", "--interval", "0.2", "--duration", "12",
                "--kill-switch", str(tmp_path / "disable"))
    assert r.returncode == 0, r.stderr
    records = [json.loads(line) for line in (tmp_path / "state" / "audit.jsonl").read_text().splitlines()]
    assert knob.read_text().strip() == "1", "reverted when the rule cleared"
    return r, records


def _told(records: list[dict]) -> list[str]:
    """What each transition and action of the audit must read as on stderr."""
    out = []
    for rec in records:
        if rec["kind"] == "transition":
            out.append(f"{rec['from']} -> {rec['to']}")
        elif rec["kind"] == "action":
            out.append(f"{rec['actuator']} {rec['outcome']}")
    return out


@pytest.mark.slow
def test_a_live_run_tells_each_transition_and_action_on_stderr(tmp_path):
    r, records = _run(tmp_path)
    told = _told(records)
    assert told[:4] == ["ok -> pending", "pending -> firing", "firing -> acting", "sysctl applied"], told
    assert "sysctl reverted" in told and told[-1] == "cooldown -> ok", told
    prefix = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d numa-off/slow-steps job=j rank=0: ")
    lines = [prefix.sub("", line) for line in r.stderr.splitlines() if prefix.match(line)]
    assert [line.split(":")[0].split(" (")[0] for line in lines] == told, r.stderr
    assert lines[0] == "ok -> pending: step_time_ms 520 > 300"
    assert lines[told.index("sysctl applied")] == "sysctl applied: sysctl kernel.numa_balancing: 1 -> 0"
    assert re.search(r"^\S+ \S+ reflexarc started \(live\): 1 policy: numa-off \(enforce\)$", r.stderr, re.M)
    assert re.search(r"^\S+ \S+ reflexarc stopped: \d+ transition\(s\); actions: applied 1, reverted 1$",
                     r.stderr, re.M)
    assert len(r.stderr.splitlines()) == len(told) + 2, r.stderr      # nothing else: no library noise, no evals


@pytest.mark.slow
def test_json_log_format_tells_the_same_events_and_log_records_without_library_noise(tmp_path):
    r, records = _run(tmp_path / "v", "-v", "--log-format", "json")
    lines = [json.loads(line) for line in r.stderr.splitlines()]       # every line is one JSON object
    events = [e for e in lines if e["logger"] == "reflexarc.events"]
    assert [f"{e['from']} -> {e['to']}" if e["kind"] == "transition" else f"{e['actuator']} {e['outcome']}"
            for e in events if e["kind"] in ("transition", "action")] == _told(records)
    assert [e["kind"] for e in events if e["kind"] not in ("transition", "action")] == ["run", "end"]
    loggers = {e["logger"] for e in lines}
    assert all(name.startswith("reflexarc.") for name in loggers), loggers   # -v: no library records
    r, _ = _run(tmp_path / "vv", "-vv", "--log-format", "json")
    loggers = {json.loads(line)["logger"] for line in r.stderr.splitlines()}
    assert "reflexarc.engine" in loggers and any(n.startswith("transitions") for n in loggers), loggers  # -vv: all
