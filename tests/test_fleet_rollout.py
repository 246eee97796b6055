"""A policy's fleet rollout and its circuit breaker against a real etcd cluster
(three members on loopback, ``simulations/testbed/etcd.py``) and real
``reflexarc run`` controllers (``fleet_nodes.Node``).

- controllers: the second node enforces only after the first one's
  remediations were verified (its first change journaled after the
  ``widened`` record); a remediation that never verifies opens the breaker,
  audited and alerted (a real webhook receives it), every node is then
  refused, a restarted controller too, until ``reflexarc fleet reset``;
- in this process: the stages admit their counts, two nodes racing for the
  last seat get one, an outcome the store could not take is reported before
  the next change, ``fleet status`` shows it all.

The arithmetic and the policy language need no server (fast tier).
"""
from __future__ import annotations

import dataclasses
import http.server
import json
import threading
import time

import pytest

from conftest import run_cli, wait_until
from fleet_nodes import TTL, Node, fresh_prefix, one_error_at, reason_of
from reflexarc.controller.fleet.budget import FleetBudget, Refused
from reflexarc.controller.fleet.rollout import FleetRollout, read, reset
from reflexarc.controller.fleet.store import EtcdStore
from reflexarc.controller.policy.loader import validate_paths
from reflexarc.core.outcomes import Outcome
from reflexarc.core.rollout import RolloutSpec, Stage, parse_stage, parse_success_rate

POLICY = """\
policies:
  - name: canary
    mode: enforce
    selector: {{match: {{job: j}}}}
    rollout: {rollout}
    rules:
      - name: slow-steps
        by: [rank]
        when: {{signal: step_time_ms, agg: max, window: 2s, op: ">", threshold: 300}}
        actions:
          - actuator: sysctl
            params: {{key: kernel.numa_balancing, value: "0"}}
        verify: {{when: {{signal: step_time_ms, agg: max, window: 1s, op: "{verify_op}", threshold: 300}},
                 timeout: 1s}}
        rollback: {{on: [verify-failed, ttl, shutdown], ttl: 1s}}
        cooldown: 1s
"""
WORKS = ">"          # the verify condition holds: every remediation verified
NEVER = "<"          # it never holds (the steps stay slow): every remediation fails its verify



def _audits(node: Node, kind: str) -> list[dict]:
    return [r for r in node.audit() if r.get("kind") == kind]


def _refusals(node: Node, reason: str) -> list[dict]:
    return [r for r in _audits(node, "action") if r.get("outcome") == Outcome.REFUSED and reason in r["error"]]


class Webhook:
    """A local JSON webhook that keeps what it receives."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):       # noqa: N802 - the handler's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hook.received.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- real controllers ------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_second_node_enforces_only_after_the_first_ones_verified_remediations(tmp_path, etcd):
    prefix = fresh_prefix()
    policy = POLICY.format(rollout="{stages: [1, all], promote_after: 4, success_rate: '50%', window: 4}",
                           verify_op=WORKS)
    first = Node(tmp_path, "node-a", etcd.endpoints, prefix, policy)
    wait_until("node-a enforcing", lambda: first.applied() or not first.alive(), timeout=60)
    second = Node(tmp_path, "node-b", etcd.endpoints, prefix, policy)
    try:
        wait_until("node-b enforcing", lambda: second.applied() or not (first.alive() and second.alive()),
                   timeout=90)
        assert first.alive() and second.alive(), first.stderr() + second.stderr()
    finally:
        codes = [first.stop(), second.stop()]
    assert codes == [0, 0], first.stderr() + second.stderr()
    (widened,) = [r for r in _audits(first, "rollout") if r["event"] == "widened"]
    assert widened["stage"] == 2, widened
    verified = [r for r in _audits(first, "transition") if r["trigger"] == "verified" and r["ts"] <= widened["ts"]]
    assert len(verified) >= 4, "the stage widened before its four verified remediations"
    stage_refusals = _refusals(second, "rollout-stage")
    assert stage_refusals, "node-b was never held back by the first stage"
    assert all(r["ts"] < widened["ts"] + 1 for r in stage_refusals)
    intents = [r["ts"] for r in second.journal() if r["state"] == "intent"]
    assert intents and min(intents) >= widened["ts"], "node-b changed its system before the stage widened"
    assert first.knob.read_text().strip() == second.knob.read_text().strip() == "1", "reverted at the stop"


@pytest.mark.slow
def test_failed_verifications_open_the_breaker_for_every_node_across_restarts_until_reset(tmp_path, etcd):
    prefix = fresh_prefix()
    policy = POLICY.format(rollout="{stages: [1, all], promote_after: 1, success_rate: '50%', window: 4}",
                           verify_op=NEVER)
    hook = Webhook()
    a = Node(tmp_path, "node-a", etcd.endpoints, prefix, policy, ("--webhook-url", hook.url))
    b = Node(tmp_path, "node-b", etcd.endpoints, prefix, policy, ("--webhook-url", hook.url))
    nodes = (a, b)
    try:
        wait_until("the breaker opened", lambda: [r for n in nodes for r in _audits(n, "rollout")]
                   or not all(n.alive() for n in nodes), timeout=90)
        assert all(n.alive() for n in nodes), a.stderr() + b.stderr()
        (opened,) = [r for n in nodes for r in _audits(n, "rollout")]
        assert opened["event"] == "opened" and opened["stage"] == 1, opened
        opener = a if opened["node"] == "node-a" else b
        failed = [r for r in _audits(opener, "transition") if r["trigger"] == "verify_failed"]
        assert len(failed) == 3, "two failures of four are allowed at 50 %: the third opens it"
        assert opened["alert"]["outcome"] == Outcome.NOTIFIED, opened
        wait_until("the alert delivered", lambda: hook.received, timeout=15)
        assert hook.received[0]["labels"]["alertname"] == "reflexarc_fleet_breaker_open"
        assert hook.received[0]["labels"]["policy"] == "canary"
        for n in nodes:
            wait_until(f"{n.name} refused by the breaker", lambda n=n: _refusals(n, "breaker-open"), timeout=30)
        b.stop()
        b.start()                                          # a restarted controller reads the breaker from etcd
        restarted = time.time()
        wait_until("the restarted node refused", lambda: [r for r in _refusals(b, "breaker-open")
                                                          if r["ts"] > restarted], timeout=30)
        applied = sum(n.applied() for n in nodes)
        node_status = run_cli("--state-dir", str(b.dir / "state"), "status", check=0).stdout
        assert "rollout canary: stage 1, breaker OPEN (reflexarc fleet reset canary --reason TEXT)" in node_status, \
            node_status
        status = run_cli("fleet", "status", "--fleet-etcd", ",".join(etcd.endpoints), "--fleet-prefix", prefix)
        assert status.returncode == 0, status.stderr
        assert "BREAKER OPEN" in status.stdout and "3 failed" in status.stdout, status.stdout
        time.sleep(3)                                      # still open: nothing more applied
        assert sum(n.applied() for n in nodes) == applied
        done = run_cli("fleet", "reset", "canary", "--reason", "threshold fixed", "--fleet-etcd",
                    ",".join(etcd.endpoints), "--fleet-prefix", prefix)
        assert done.returncode == 0, done.stderr
        assert "breaker closed (was open)" in done.stdout, done.stdout
        wait_until("a node enforcing again", lambda: sum(n.applied() for n in nodes) > applied
                   or not all(n.alive() for n in nodes), timeout=30)
    finally:
        codes = [n.stop() for n in nodes]
        hook.close()
    assert codes == [0, 0], a.stderr() + b.stderr()
    state, _, _ = read(EtcdStore(etcd.endpoints), prefix, "canary")
    reset_event = next(h for h in state.history if h["event"] == "reset")
    assert reset_event["reason"] == "threshold fixed" and reset_event["was_open"], reset_event
    assert a.knob.read_text().strip() == b.knob.read_text().strip() == "1"
    # one report across both nodes' audits, found under the directory that holds them
    out = tmp_path / "fleet-report"
    done = run_cli("report", str(tmp_path), "--out", str(out), check=0)
    assert "node-a: 1 run(s)" in done.stdout and "node-b: 2 run(s)" in done.stdout, done.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["format"] == "reflexarc-fleet-report/1"
    assert sorted(n["node"] for n in report["nodes"]) == ["node-a", "node-b"]
    assert [(e["node"], e["event"]) for e in report["rollout_events"]] == [(opened["node"], "opened")]
    refused = {(r["node"], r["reason"]): r["count"] for r in report["refusals"]}
    assert refused[("node-a", "breaker-open")] == len(_refusals(a, "breaker-open"))
    assert refused[("node-b", "breaker-open")] == len(_refusals(b, "breaker-open"))
    (job,) = report["jobs"]
    assert job["job"] == "j" and job["nodes"] == ["node-a", "node-b"], job
    assert job["incidents"].get("rolled back", 0) >= 3, "the opener's three failed verifies, each rolled back"
    for n in report["nodes"]:
        assert (out / n["report"]).is_file(), "each node's own report beside the fleet's"
    page = (out / "report.html").read_text()
    assert 'href="nodes/node-a/report.html"' in page and "breaker of canary opened by" in page


# --- in this process -------------------------------------------------------------------------------
@pytest.fixture
def nodes(etcd):
    """``make(name)``: a started budget without a limit (the node's lease) and its rollout."""
    prefix, made = fresh_prefix(), []

    def make(name: str) -> FleetRollout:
        budget = FleetBudget(EtcdStore(etcd.endpoints), name, ttl=TTL, prefix=prefix)
        budget.start()
        made.append(budget)
        return FleetRollout(budget)
    make.prefix = prefix
    yield make
    for b in made:
        b.stop()



@pytest.mark.slow
def test_stages_admit_their_counts_and_widen_on_verified_outcomes(nodes):
    spec = RolloutSpec(stages=(Stage(nodes=1), Stage(percent=50), Stage()), promote_after=2, success_rate=50,
                       window=4)
    a, b, c, d = (nodes(n) for n in "abcd")
    a.admit("p", spec)
    a.admit("p", spec)                                  # its seat: admitted again
    assert reason_of(lambda: b.admit("p", spec)) == "rollout-stage"
    assert a.report("p", spec, ok=True, target="t") == []
    assert reason_of(lambda: b.admit("p", spec)) == "rollout-stage", "one verified of the two it needs"
    (event,) = a.report("p", spec, ok=True, target="t")
    assert (event.kind, event.stage) == ("widened", 1)
    b.admit("p", spec)                                  # 50 % of 4 live nodes: 2 seats
    assert reason_of(lambda: c.admit("p", spec)) == "rollout-stage"
    assert b.report("p", spec, ok=False, target="t") == []
    assert b.report("p", spec, ok=True, target="t") == [], "one verified in stage 2 of the two it needs"
    (event,) = b.report("p", spec, ok=True, target="t")
    assert event.kind == "widened" and event.stage == 2
    c.admit("p", spec)
    d.admit("p", spec)                                  # all


@pytest.mark.slow
def test_two_nodes_racing_for_the_last_seat_get_one(nodes):
    spec = RolloutSpec(stages=(Stage(nodes=1), Stage()))
    racers = [nodes(f"n{i}") for i in range(4)]
    admitted, start = [], threading.Barrier(len(racers))

    def race(r: FleetRollout) -> None:
        start.wait()
        try:
            r.admit("p", spec)
            admitted.append(r.node)
        except Refused as exc:
            assert exc.reason == "rollout-stage", exc

    threads = [threading.Thread(target=race, args=(r,)) for r in racers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(admitted) == 1, admitted
    _, _, seats = read(racers[0].store, nodes.prefix, "p")
    assert [s.key.rsplit("/", 1)[-1] for s in seats] == admitted


@pytest.mark.slow
def test_an_outcome_the_store_missed_is_counted_before_the_next_change(etcd, nodes):
    spec = RolloutSpec(stages=(Stage(),), success_rate=100, window=5)
    a = nodes("a")
    a.admit("p", spec)
    etcd.stop()
    assert a.report("p", spec, ok=False, target="t") == [] and a.pending == 1
    assert reason_of(lambda: a.admit("p", spec)) == "store-unreachable"
    etcd.start()
    assert reason_of(lambda: a.admit("p", spec)) == "breaker-open", "the missed failure opened it first"
    assert a.pending == 0
    restarted = nodes("a2")                              # another process: the breaker is in etcd
    assert reason_of(lambda: restarted.admit("p", spec)) == "breaker-open"
    state = reset(a.store, nodes.prefix, "p", reason="fixed", by="test")
    assert not state.open and state.recent == []
    restarted.admit("p", spec)


@pytest.mark.slow
def test_a_changed_policy_starts_its_rollout_over_and_the_old_version_is_refused(nodes):
    v1 = RolloutSpec(stages=(Stage(nodes=1), Stage()), promote_after=1, success_rate=50, window=4, version="v1")
    v2 = dataclasses.replace(v1, version="v2")
    a, b, c = (nodes(n) for n in "abc")
    a.admit("p", v1)
    (widened,) = a.report("p", v1, ok=True, target="t")
    assert widened.stage == 1
    b.admit("p", v1)                                    # stage 2: every node
    c.admit("p", v2)                                    # c reloaded a changed policy: back to stage 1, its seat
    state, _, seats = read(c.store, nodes.prefix, "p")
    assert (state.version, state.superseded, state.stage) == ("v2", ["v1"], 0)
    assert [s.key.rsplit("/", 1)[-1] for s in seats] == ["c"], "the old stage's seats cleared"
    assert state.history[-1]["event"] == "restarted" and state.history[-1]["from_stage"] == 1
    for old in (a, b):
        assert reason_of(lambda old=old: old.admit("p", v1)) == "superseded", "the replaced version enforces nothing"
    assert a.report("p", v1, ok=True, target="t") == []            # an old version's outcome is not counted
    assert read(c.store, nodes.prefix, "p")[0].verified_in_stage == 0
    assert reason_of(lambda: a.admit("p", v2)) == "rollout-stage", "reloaded: the new version's first stage"
    reset(c.store, nodes.prefix, "p", reason="back to v1", by="test", from_start=True)
    a.admit("p", v1)                                    # versions forgotten: v1 is the fleet's again
    assert read(c.store, nodes.prefix, "p")[0].version == "v1"


def test_a_policy_s_version_is_what_it_enforces(tmp_path):
    from reflexarc.controller.engine.engine import rollout_specs
    text = POLICY.format(rollout="{stages: [1, all]}", verify_op=WORKS)
    path = tmp_path / "p.yaml"

    def version(policy_text: str) -> str:
        path.write_text(policy_text)
        (policy,), _ = validate_paths([str(path)])
        return rollout_specs([policy])["canary"].version

    first = version(text)
    assert len(first) == 16
    assert version("# a comment, and the file moved about\n\n" + text) == first
    adapted = text.replace("match: {job: j}", "match: {job: j}, interfaces: [lo]")
    assert adapted != text
    assert version(adapted) == first, \
        "a selector adapted to the node is the same version"
    assert version(text.replace("threshold: 300}", "threshold: 250}", 1)) != first
    assert version(text.replace("{stages: [1, all]}", "{stages: [2, all]}")) != first


# --- no server --------------------------------------------------------------------------------------
def test_the_breaker_and_the_widening_arithmetic():
    spec = RolloutSpec(stages=(Stage(nodes=1), Stage(percent=10), Stage()), promote_after=3, success_rate=90,
                       window=10)
    assert spec.allowed_failures() == 1
    assert not spec.breaks([True] * 8 + [False])
    assert spec.breaks([False, True, False])
    assert not spec.breaks([False] + [True] * 10 + [False]), "only the last ten count"
    assert not spec.widens([True, True], verified_in_stage=2, stage=0)
    assert spec.widens([True] * 3, verified_in_stage=3, stage=0)
    assert not spec.widens([True] * 3, verified_in_stage=3, stage=2), "the last stage does not widen"
    assert not spec.widens([True, False, True, True], verified_in_stage=3, stage=0), "75 % < 90 %"
    assert [s.size(40) for s in spec.stages] == [1, 4, None]
    assert Stage(percent=10).size(3) == 1, "a share admits at least one node"
    assert RolloutSpec(success_rate=100, window=4).allowed_failures() == 0


def test_stages_and_rates_as_written():
    assert parse_stage(2) == Stage(nodes=2)
    assert parse_stage("12.5%") == Stage(percent=12.5)
    assert parse_stage("all") == Stage()
    assert parse_success_rate("95%") == 95 and parse_success_rate(80) == 80
    for bad in (0, "0%", "150%", "half", True, 1.5):
        with pytest.raises(ValueError):
            parse_stage(bad)
    for bad in ("0%", 101, "ninety"):
        with pytest.raises(ValueError):
            parse_success_rate(bad)


@pytest.mark.parametrize("rollout, verify, error", [
    ("{stages: [all, 1]}", True, "'all' admits every node, so it can only be the last stage"),
    ("{stages: [0]}", True, "a stage of 0 nodes admits none"),
    ("{stages: [1], success_rate: '120%'}", True, "not > 0 % and <= 100 %"),
    ("{stages: [1], windw: 3}", True, "unknown key 'windw'; did you mean 'window'?"),
    ("{stages: [1, all]}", False, "a rollout widens on verified remediations, and rule(s) r change the system "
                                  "without a 'verify'"),
])
def test_a_bad_rollout_is_an_error_at_its_place(tmp_path, rollout, verify, error):
    verify_line = "        verify: {when: {signal: step_time_ms, agg: max, window: 1s, op: '<', threshold: 1}, " \
                  "timeout: 5s}\n" if verify else ""
    path = tmp_path / "p.yaml"
    path.write_text("policies:\n  - name: p\n    mode: enforce\n    rollout: " + rollout + "\n    rules:\n"
                    "      - name: r\n        when: {signal: step_time_ms, agg: max, window: 1s, op: '>', "
                    "threshold: 1}\n        actions: [{actuator: sysctl, params: {key: vm.swappiness, value: '1'}}]\n"
                    + verify_line + "        rollback: {on: [clear]}\n")
    one_error_at(path, "4:", error)


def test_a_good_rollout_loads_with_its_defaults(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("policies:\n  - name: p\n    rollout: {stages: [1, '10%', all]}\n    rules:\n"
                    "      - name: r\n        when: {signal: step_time_ms, agg: max, window: 1s, op: '>', "
                    "threshold: 1}\n        actions: [{actuator: log}]\n")
    (policy,), diagnostics = validate_paths([str(path)])
    assert not [d for d in diagnostics if d.is_error], diagnostics
    assert policy.rollout == RolloutSpec(stages=(Stage(nodes=1), Stage(percent=10), Stage()))
    assert policy.rollout.describe().startswith("1 node, then 10 %, then all; a stage widens after 3 verified")


def test_an_enforcing_rollout_without_a_fleet_store_does_not_start(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(POLICY.format(rollout="{stages: [1, all]}", verify_op=WORKS))
    done = run_cli("--state-dir", str(tmp_path / "state"), "run", "--no-probes", "--policy", str(path),
                "--mode", "policy", "--duration", "0")
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "error: policy canary enforces a fleet rollout, which is held in etcd: give --fleet-etcd (docs/fleet.md), "
        "or run it in dry-run or alert-only")
