"""The controller's lifecycle against a scripted plant in simulated time."""
from __future__ import annotations

import pytest

from engine_fixtures import policy, registry
from reflexarc.controller.engine.bus import SignalBus
from reflexarc.controller.engine.clock import SimClock
from reflexarc.controller.engine.engine import Controller
from reflexarc.controller.engine.journal import Journal


def run(pol, fault=lambda t, fixed: 300.0 if 60 <= t else 50.0, fixable=True, until=300, journal=None,
        mode=None, kill_switch=None):
    state, sent = {}, []
    clock = SimClock()
    bus = SignalBus()
    limits = None
    if kill_switch:
        from reflexarc.controller.engine.limits import LimitSettings
        limits = LimitSettings(kill_switch=kill_switch)
    ctl = Controller([pol], bus, registry(state, sent), clock, journal=journal, mode_override=mode,
                     limits=limits)
    ctl.start("test")
    states = []
    for t in range(until):
        clock.set(float(t))
        fixed = fixable and state.get("rank=0") == 1
        bus.publish("step_time_ms", {"job": "j", "rank": "0"}, 50.0 if fixed else fault(t, fixed), t)
        ctl.tick()
        run_ = ctl.runs.get(("test-policy", "slow-steps", "rank=0"))
        states.append(run_.state if run_ else "ok")
    ctl.shutdown()
    return ctl, state, sent, states


def outcomes(ctl):
    return [(r["actuator"], r["outcome"]) for r in ctl.audit.records if r["kind"] == "action"]


def test_enforce_fixes_and_verifies():
    ctl, state, sent, states = run(policy())
    assert outcomes(ctl)[0] == ("knob", "applied")
    tr = [r["to"] for r in ctl.audit.records if r["kind"] == "transition"]
    assert tr[:5] == ["pending", "firing", "acting", "verifying", "remediated"]
    # first action at 60 + for (5s)
    first = next(r for r in ctl.audit.records if r["kind"] == "action")
    assert first["ts"] == 65.0
    assert first["change"] == {"before": 0, "after": 1, "summary": "knob 0->1"}
    # shutdown rolled back (rollback on shutdown)
    assert state["rank=0"] == 0
    assert outcomes(ctl)[-1] == ("knob", "reverted")


def test_dry_run_changes_nothing_and_records_plan():
    ctl, state, sent, states = run(policy(mode="dry-run"))
    assert state == {}
    assert outcomes(ctl)[0] == ("knob", "planned")
    assert ctl.summary()["would_have_acted"] >= 1
    assert ctl.summary()["applied"] == 0
    assert ctl.metrics.registry.get_sample_value(
        "reflexarc_would_have_acted_total", {"policy": "test-policy", "rule": "slow-steps", "actuator": "knob"}) >= 1


def test_cli_mode_overrides_file_mode():
    ctl, state, _, _ = run(policy(mode="enforce"), mode="dry-run")
    assert state == {}
    assert ("knob", "planned") in outcomes(ctl)


def test_unfixable_verify_fails_rolls_back_and_escalates():
    ctl, state, sent, states = run(policy(actions=("knob", "alert")), fixable=False)
    outs = outcomes(ctl)
    assert outs[:3] == [("knob", "applied"), ("knob", "reverted"), ("alert", "notified")]
    assert state["rank=0"] == 0
    assert sent and "escalated" in states
    tr = [(r["from"], r["to"]) for r in ctl.audit.records if r["kind"] == "transition"]
    assert ("verifying", "recovering") in tr and ("recovering", "acting") in tr


def test_flapping_stays_within_max_actions():
    flap = lambda t, fixed: 300.0 if (t // 20) % 2 else 50.0  # noqa: E731
    ctl, state, sent, states = run(policy(for_=0.0, clear_for=0.0, cooldown=0.0, max_actions=(2, 3600),
                                          verify=False, rollback_on=("clear",)),
                                   fault=flap, fixable=False, until=600)
    applied = [o for o in outcomes(ctl) if o == ("knob", "applied")]
    assert len(applied) == 2
    assert any(r["kind"] == "limit" and r["reason"] == "max_actions" for r in ctl.audit.records)


def test_ttl_reverts():
    ctl, state, sent, states = run(policy(ttl=60.0, rollback_on=("ttl",)), until=200)
    outs = outcomes(ctl)
    applied = next(r for r in ctl.audit.records if r["kind"] == "action" and r["outcome"] == "applied")
    reverted = next(r for r in ctl.audit.records if r["kind"] == "action" and r["outcome"] == "reverted")
    assert reverted["ts"] - applied["ts"] == 60.0
    assert outs[:2] == [("knob", "applied"), ("knob", "reverted")]


def test_kill_switch_stops_enforcement(tmp_path):
    ks = tmp_path / "disable"
    ks.write_text("")
    ctl, state, _, _ = run(policy(), kill_switch=str(ks))
    assert state == {}
    assert any(r["kind"] == "limit" and r["reason"] == "kill_switch" for r in ctl.audit.records)


def test_journal_records_and_reconcile_reverts(tmp_path):
    j = Journal(tmp_path / "journal.jsonl")
    pol = policy(rollback_on=("verify-failed",))  # not reverted at shutdown
    ctl, state, _, _ = run(pol, journal=j)
    assert state["rank=0"] == 1
    assert [e.state for e in j.open_entries()] == ["applied"]
    j.close()
    # A new controller (same actuator state) reconciles by reverting.
    j2 = Journal(tmp_path / "journal.jsonl")
    from engine_fixtures import registry as reg
    from reflexarc.controller.engine.bus import SignalBus
    c2 = Controller([pol], SignalBus(), reg(state, []), SimClock(), journal=j2)
    results = c2.start()
    assert [r.outcome for _, r in results] == ["reverted"]
    assert state["rank=0"] == 0
    assert j2.open_entries() == []
    j2.close()


def test_journal_is_exclusive(tmp_path):
    from reflexarc.controller.engine.journal import JournalLocked
    j = Journal(tmp_path / "j.jsonl")
    with pytest.raises(JournalLocked):
        Journal(tmp_path / "j.jsonl")
    j.close()


def test_state_exported_as_prometheus_enum():
    ctl, _, _, _ = run(policy(ttl=None), until=70)
    reg = ctl.metrics.registry
    labels = {"policy": "test-policy", "rule": "slow-steps", "target": "rank=0"}
    assert reg.get_sample_value("reflexarc_rule_state", {**labels, "reflexarc_rule_state": "verifying"}) == 1.0
    assert reg.get_sample_value("reflexarc_rule_state", {**labels, "reflexarc_rule_state": "ok"}) == 0.0
    assert reg.get_sample_value("reflexarc_actions_total", {"policy": "test-policy", "rule": "slow-steps",
                                                            "actuator": "knob", "mode": "enforce",
                                                            "outcome": "applied"}) == 1.0


def test_relative_threshold_waits_for_baseline_then_fires():
    from reflexarc.controller.policy.model import Condition
    pol = policy()
    pol.rules[0].when = Condition("step_time_ms", "max", 10.0, ">", 3.0, relative=True, baseline_window=120.0)
    ctl, state, _, _ = run(pol, fault=lambda t, fixed: 300.0 if t >= 150 else 50.0 + (t % 3))
    first = next(r for r in ctl.audit.records if r["kind"] == "transition" and r["to"] == "pending")
    assert first["ts"] == 150.0
    ev = first["evidence"][0]
    assert 50.0 <= ev["baseline"] <= 52.0 and ev["threshold"] == ev["baseline"] * 3
    early = [r for r in ctl.audit.records if r["kind"] == "eval" and r["ts"] < 30]
    assert all(r["values"][0]["baseline"] is None for r in early), "learning: no baseline yet"
