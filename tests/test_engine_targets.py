"""The engine on a node whose targets come and go: runs are retired with their
metric series, a change whose target vanished is closed as ``target-gone``,
one failing run does not stop the others, and the audit follows events."""
from __future__ import annotations

import json
import logging

from engine_fixtures import Knob, Note, policy
from reflexarc.actuators.base import Actuator, ActuatorSpec, ParamSpec, Registry
from reflexarc.controller.engine.audit import AuditLog
from reflexarc.controller.engine.bus import SignalBus
from reflexarc.controller.engine.clock import SimClock
from reflexarc.controller.engine.engine import Controller
from reflexarc.controller.engine.journal import Journal
from reflexarc.controller.report.audit import load_audit
from reflexarc.core.outcomes import Outcome


def knob_registry(state: dict, sent: list) -> Registry:
    r = Registry()
    r.register(Knob.spec, lambda: Knob(state))
    r.register(Note.spec, lambda: Note(sent))
    return r


def controller(pols, state, *, journal=None, audit=None, registry=None):
    clock = SimClock()
    ctl = Controller(pols, SignalBus(retention=300.0), registry or knob_registry(state, []), clock,
                     journal=journal, audit=audit or AuditLog(None, clock), target_grace=30.0)
    ctl.start("test")
    return clock, ctl


def state_series(ctl, target: str) -> float | None:
    return ctl.metrics.registry.get_sample_value(
        "reflexarc_rule_state", {"policy": "test-policy", "rule": "slow-steps", "target": target,
                                 "reflexarc_rule_state": "ok"})


def test_runs_follow_live_targets_not_history():
    """Two new ranks every 60 s, the old ones stop (workers re-created per epoch):
    the runs, their state series and the bus stay bounded over 30 epochs."""
    clock, ctl = controller([policy(mode="dry-run")], {})
    sizes = []
    for t in range(30 * 60):
        clock.set(float(t))
        epoch = t // 60
        for rank in (2 * epoch, 2 * epoch + 1):
            ctl.bus.publish("step_time_ms", {"job": "j", "rank": str(rank)}, 50.0, t)
        ctl.tick()
        if t % 60 == 59:
            sizes.append(len(ctl.runs))
    assert max(sizes[3:]) <= 6, sizes            # 2 live targets, plus those within window + grace
    assert ctl.summary()["retired"] >= 50
    assert state_series(ctl, "rank=0") is None, "a retired target's state series is removed"
    assert state_series(ctl, "rank=59") == 1.0
    assert ctl.bus.series_count() <= 12          # dead series leave the bus after its retention
    assert ctl.metrics.registry.get_sample_value("reflexarc_bus_series") <= 12
    assert ctl.metrics.registry.get_sample_value("reflexarc_rule_targets") == len(ctl.runs)


def test_a_silent_target_holding_a_change_is_kept_until_it_lets_go():
    state = {}
    clock, ctl = controller([policy(verify=False, rollback_on=("shutdown",))], state)
    for t in range(400):
        clock.set(float(t))
        if t < 100:
            ctl.bus.publish("step_time_ms", {"job": "j", "rank": "0"}, 300.0 if t >= 20 else 50.0, t)
        ctl.tick()
    assert state["rank=0"] == 1
    assert ("test-policy", "slow-steps", "rank=0") in ctl.runs, "it still holds the change: not retired"
    assert ctl.active_count() == 1 == sum(len(r.changes) for r in ctl.runs.values())
    ctl.shutdown()
    assert state["rank=0"] == 0


def test_a_change_whose_target_vanished_is_closed_as_target_gone(tmp_path):
    state = {}
    journal = Journal(tmp_path / "journal.jsonl")
    clock, ctl = controller([policy(verify=False, rollback_on=("clear", "shutdown"))], state, journal=journal)
    for t in range(300):
        clock.set(float(t))
        if t == 100:
            state["gone:rank=0"] = True          # the process it was made for exited
        if t < 100:
            ctl.bus.publish("step_time_ms", {"job": "j", "rank": "0"}, 300.0 if t >= 20 else 50.0, t)
        ctl.tick()
    gone = [r for r in ctl.audit.records if r["kind"] == "action" and r["outcome"] == "target-gone"]
    assert len(gone) == 1, "audited once"
    assert gone[0]["ts"] == 100.0
    [entry] = journal.entries()
    assert entry.state == "target-gone", "nothing left 'applied' for a target that no longer exists"
    assert journal.open_entries() == []
    transitions = [(r["from"], r["to"]) for r in ctl.audit.records if r["kind"] == "transition"]
    assert ("remediated", "cooldown") in transitions
    assert ("test-policy", "slow-steps", "rank=0") not in ctl.runs, "retired once its cooldown passed"
    assert ctl.active_count() == 0
    ctl.shutdown()
    assert not [r for r in ctl.audit.records if r["kind"] == "action" and r["outcome"] == "reverted"]
    journal.close()


def test_rollback_of_a_vanished_target_says_target_gone(tmp_path):
    from reflexarc.actuators.base import Change, Target
    from reflexarc.controller.engine.executor import Executor
    state = {}
    journal = Journal(tmp_path / "journal.jsonl")
    ex = Executor(knob_registry(state, []), journal, SimClock())
    res = ex.act("knob", Target({"pid": "7"}), {"value": 1}, "enforce")
    assert res.outcome is Outcome.APPLIED
    state["gone:pid=7"] = True
    back = ex.revert(Change.from_dict(res.change.to_dict()), res.journal_id, "enforce")
    assert back.outcome is Outcome.TARGET_GONE
    assert journal.get(res.journal_id).state == "target-gone"
    assert state["pid=7"] == 1, "nothing was written for a target that is gone"
    journal.close()


class Boom(Actuator):
    """An actuator with a bug: planning raises an error no actuator should raise."""

    spec = ActuatorSpec("boom", "raises", (ParamSpec("value", "int"),))

    def plan(self, target, params):
        raise RuntimeError("bug in an actuator")


def test_a_run_that_raises_goes_to_failed_and_the_others_go_on(caplog):
    from reflexarc.controller.policy.model import Action
    state = {}
    registry = knob_registry(state, [])
    registry.register(Boom.spec, Boom)
    broken = policy(verify=False)
    broken.name = "broken"
    broken.rules[0].actions = [Action("boom", {"value": 1})]
    clock, ctl = controller([broken, policy(verify=False)], state, registry=registry)
    with caplog.at_level(logging.ERROR, logger="reflexarc.engine"):
        for t in range(120):
            clock.set(float(t))
            ctl.bus.publish("step_time_ms", {"job": "j", "rank": "0"}, 300.0 if t >= 20 else 50.0, t)
            ctl.tick()
    assert state["rank=0"] == 1, "the healthy policy acted"
    errors = [r for r in ctl.audit.records if r["kind"] == "error"]
    assert errors and errors[0]["policy"] == "broken" and "bug in an actuator" in errors[0]["error"]
    assert ctl.metrics.registry.get_sample_value(
        "reflexarc_rule_errors_total", {"policy": "broken", "rule": "slow-steps"}) == len(errors)
    to_failed = [r for r in ctl.audit.records if r["kind"] == "transition" and r["policy"] == "broken"
                 and r["to"] == "failed"]
    assert to_failed and to_failed[0]["trigger"] == "crash"
    assert any(rec.exc_info for rec in caplog.records), "the traceback is in the log"
    assert ctl.runs[("broken", "slow-steps", "rank=0")].state in ("failed", "cooldown")


def test_sampled_audit_follows_events(tmp_path):
    path = tmp_path / "audit.jsonl"
    clock = SimClock()
    audit = AuditLog(path, clock, evals="sampled", sample_every=100.0)
    ctl = Controller([policy(mode="dry-run")], SignalBus(), knob_registry({}, []), clock, audit=audit)
    ctl.start("test")
    for t in range(600):
        clock.set(float(t))
        bad = 400 <= t < 420
        ctl.bus.publish("step_time_ms", {"job": "j", "rank": "0"}, 300.0 if bad else 50.0, t)
        ctl.tick()
    ctl.shutdown()
    audit.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    evals = [r["ts"] for r in records if r["kind"] == "eval"]
    steady = [ts for ts in evals if ts < 400]
    assert steady == [0.0, 100.0, 200.0, 300.0], "a steady target is sampled once per interval"
    assert all(ts in evals for ts in range(400, 406)), "every tick on the way to acting"
    assert len(evals) < 60
    assert any(r["kind"] == "transition" for r in records)


def test_audit_rotates_and_reports_read_the_rotated_files(tmp_path):
    path = tmp_path / "audit.jsonl"
    clock = SimClock()
    audit = AuditLog(path, clock, max_bytes=4000, keep=3)
    for t in range(400):
        clock.set(float(t))
        audit.write("limit", policy="p", rule="r", target="*", reason="x" * 40)
    audit.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2", "audit.jsonl.3"]
    assert all(p.stat().st_size < 4200 for p in tmp_path.iterdir())
    folded = load_audit(path)
    stamps = [r["ts"] for r in folded.limits]
    assert stamps == sorted(stamps) and stamps[-1] == 399.0
    kept = sum(len(p.read_text().splitlines()) for p in tmp_path.iterdir())
    assert len(stamps) == kept and stamps[0] == 400 - kept


def test_a_target_never_joins_two_jobs():
    """Two jobs on one node, each with a rank 0, read by a rule grouped by rank
    only: one target per job, each holding only its job's series and the node's
    own; the slow job alone acts. With one job, the targets are the rule's own."""
    from reflexarc.controller.policy.model import Selector
    pol = policy(mode="enforce", verify=False)
    pol.selector = Selector()
    state: dict = {}
    clock, ctl = controller([pol], state)
    for t in range(40):
        clock.set(float(t))
        ctl.bus.publish("step_time_ms", {"job": "fast", "rank": "0"}, 50.0, t)
        ctl.bus.publish("step_time_ms", {"job": "slow", "rank": "0"}, 300.0, t)
        ctl.bus.publish("step_time_ms", {"rank": "0"}, 60.0, t)         # no job: joins both
        ctl.tick()
    keys = {k[2] for k in ctl.runs}
    assert keys == {"job=fast,rank=0", "job=slow,rank=0"}, keys
    rt = next(iter(ctl.runs.values())).targets
    for key, inputs in rt.groups.items():
        jobs = {s.labels.get("job") for s in inputs[0].series}
        assert jobs == {key[-1], None}, (key, jobs)
    assert ctl.runs[("test-policy", "slow-steps", "job=slow,rank=0")].state != "ok"
    assert ctl.runs[("test-policy", "slow-steps", "job=fast,rank=0")].state == "ok"
    assert list(state) == ["job=slow,rank=0"], state

    clock, ctl = controller([policy(mode="dry-run")], {})
    clock.set(1.0)
    ctl.bus.publish("step_time_ms", {"job": "j", "rank": "0"}, 50.0, 1.0)
    ctl.tick()
    assert {k[2] for k in ctl.runs} == {"rank=0"}


def test_a_jobs_selector_reads_only_its_jobs_and_the_nodes_own_series():
    from reflexarc.controller.policy.model import Selector
    pol = policy(mode="dry-run", verify=False)
    pol.selector = Selector(jobs=("sl*",))
    clock, ctl = controller([pol], {})
    for t in range(3):
        clock.set(float(t))
        for job in ("fast", "slow", "slower"):
            ctl.bus.publish("step_time_ms", {"job": job, "rank": "0"}, 300.0, t)
        ctl.bus.publish("step_time_ms", {"rank": "0"}, 60.0, t)
        ctl.tick()
    assert {k[2] for k in ctl.runs} == {"job=slow,rank=0", "job=slower,rank=0"}
    assert Selector(jobs=("sl*",)).scoped({"job": "slow"}) and not Selector(jobs=("sl*",)).scoped({"job": "fast"})
    assert Selector(pods=("1b2c*",)).scoped({"job": "x"}) and not Selector(pods=("1b2c*",)).scoped({"pod": "ff"})
