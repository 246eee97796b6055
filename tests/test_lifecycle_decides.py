"""A rule run decides and is told; it never calls the controller.

``lifecycle.py`` names nothing of the controller (checked on its source), and
a run driven by hand, with no controller at all, yields the decisions the
controller would carry out and moves on the results it is sent.
"""
from __future__ import annotations

import ast
from pathlib import Path

from engine_fixtures import policy, registry
from reflexarc.actuators.base import Change
from reflexarc.controller.engine import lifecycle
from reflexarc.controller.engine.bus import SignalBus
from reflexarc.controller.engine.decisions import Act, Evaluated, Limited, Refresh, Revert, Transitioned
from reflexarc.controller.engine.executor import StepResult
from reflexarc.controller.engine.lifecycle import RuleRun, Tally
from reflexarc.controller.engine.limits import Room
from reflexarc.controller.engine.targets import RuleTargets
from reflexarc.core.outcomes import Outcome

CONTROLLER_NAMES = {"ctx", "ctl", "controller", "engine", "services", "Services", "Controller"}


def calls_into_the_controller(source: str) -> list[str]:
    """What in ``source`` imports the controller's module or reaches through a
    name that stands for the controller."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == "engine":
            found.append(f"line {node.lineno}: from {'.' * node.level}{node.module} import ...")
        elif isinstance(node, ast.Import) and any(a.name.endswith(".engine.engine") for a in node.names):
            found.append(f"line {node.lineno}: import {node.names[0].name}")
        elif isinstance(node, ast.Attribute) and node.attr in CONTROLLER_NAMES:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in CONTROLLER_NAMES:
            found.append(f"line {node.lineno}: {node.id}")
        elif isinstance(node, ast.arg) and node.arg in CONTROLLER_NAMES:
            found.append(f"line {node.lineno}: parameter {node.arg}")
    return found


def test_the_lifecycle_never_calls_the_controller():
    source = Path(lifecycle.__file__).read_text()
    assert not calls_into_the_controller(source), calls_into_the_controller(source)


def test_the_check_for_calls_into_the_controller_can_fail():
    assert calls_into_the_controller("def f(self, ctx):\n    self.ctx.transitioned(self)\n")
    assert calls_into_the_controller("from .engine import Controller\n")


def drive(decisions, answer=lambda d: None):
    """Run a run's generator as the controller would, answering with ``answer``."""
    seen, reply = [], None
    while True:
        try:
            decision = decisions.send(reply)
        except StopIteration:
            return seen
        seen.append(decision)
        reply = answer(decision)


def applied(decision):
    """What the executor would answer: every action applied, every revert made, nothing refreshed."""
    if isinstance(decision, Act):
        change = Change(decision.action.actuator, None, dict(decision.params), 0, 1, "knob 0->1")
        return StepResult(Outcome.APPLIED, change, f"j{decision.step}")
    if isinstance(decision, Revert):
        return StepResult(Outcome.REVERTED, decision.change.change, decision.change.journal_id)
    if isinstance(decision, Refresh):
        return []
    return None


def a_run(pol, value: float, held: Tally | None = None):
    bus = SignalBus()
    bus.publish("step_time_ms", {"job": "j", "rank": "0"}, value, 0.0)
    targets = RuleTargets(bus, pol, pol.rules[0])
    targets.resolve_if_changed()
    (key,) = targets.groups
    run = RuleRun(pol, pol.rules[0], targets, key, mode=pol.mode, registry=registry({}, []),
                  held=held or Tally(), min_history=60.0)
    return bus, run


def moves(decisions):
    return [(d.src, d.dst) for d in decisions if isinstance(d, Transitioned)]


def test_a_run_decides_an_action_and_moves_on_its_result():
    _, run = a_run(policy(for_=0.0), 300.0)
    seen = drive(run.step(1.0, Room()), applied)
    assert isinstance(seen[0], Evaluated) and seen[0].state == "ok" and seen[0].result is True
    assert moves(seen) == [("ok", "pending"), ("pending", "firing"), ("firing", "acting"), ("acting", "verifying")]
    (act,) = [d for d in seen if isinstance(d, Act)]
    assert (act.step, act.mode, act.params) == (0, "enforce", {"value": 1})
    assert seen.index(act) == 4, "the action comes after the move to acting, before the move on"
    assert moves(seen)[-1] == ("acting", "verifying") and run.state == "verifying"
    assert [ac.journal_id for ac in run.changes] == ["j0"]
    evidence = next(d for d in seen if isinstance(d, Transitioned)).evidence
    assert evidence[0]["value"] == 300.0 and evidence[0]["ok"] is True


def test_a_failed_action_is_told_and_the_run_gives_up():
    _, run = a_run(policy(for_=0.0), 300.0)
    seen = drive(run.step(1.0, Room()),
                    lambda d: StepResult(Outcome.FAILED, None, None, "no knob") if isinstance(d, Act) else None)
    assert moves(seen)[-3:] == [("acting", "recovering"), ("recovering", "failed"), ("failed", "cooldown")]
    assert not run.changes


def test_a_hold_keeps_an_enforcing_run_in_firing_until_released():
    _, run = a_run(policy(for_=0.0), 300.0)
    seen = drive(run.step(1.0, Room(hold="paused")), applied)
    assert [d.reason for d in seen if isinstance(d, Limited)] == ["paused"]
    assert not any(isinstance(d, Act) for d in seen) and run.state == "firing"
    again = drive(run.step(2.0, Room(hold="paused")), applied)
    assert not any(isinstance(d, (Limited, Act)) for d in again), "a held run says so once"
    released = drive(run.step(3.0, Room()), applied)
    assert [d.mode for d in released if isinstance(d, Act)] == ["enforce"] and run.state == "verifying"


def test_a_revert_makes_room_at_once_for_the_next_action():
    """At most one active change on the node: the run holds it, its check fails,
    it reverts it, and the next action may go within the same step."""
    held = Tally()
    bus, run = a_run(policy(actions=("knob", "knob"), for_=0.0), 300.0, held)
    drive(run.step(1.0, Room(max_active=1)), applied)
    assert run.state == "verifying" and held.count == 1
    bus.publish("step_time_ms", {"job": "j", "rank": "0"}, 300.0, 30.0)
    seen = drive(run.step(30.0, Room(max_active=1)), applied)
    assert [type(d).__name__ for d in seen if isinstance(d, (Revert, Act))] == ["Revert", "Act"]
    assert ("recovering", "acting") in moves(seen) and run.step_index == 1 and held.count == 1


def test_an_operator_rollback_is_decided_by_the_run():
    _, run = a_run(policy(for_=0.0), 300.0)
    drive(run.step(1.0, Room()), applied)
    (ac,) = run.changes
    stuck = drive(run.withdraw(ac, "by hand", 2.0),
                     lambda d: StepResult(Outcome.FAILED, ac.change, ac.journal_id, "stuck"))
    assert [type(d) for d in stuck] == [Revert] and list(run.changes) == [ac], "a failed revert keeps it held"
    seen = drive(run.withdraw(ac, "by hand", 3.0), applied)
    assert isinstance(seen[0], Revert) and seen[0].note == "by hand" and not run.changes
    assert moves(seen) == [("verifying", "recovering"), ("recovering", "rolled_back"), ("rolled_back", "cooldown")]


def test_a_refusal_of_the_fleet_budget_sends_the_run_back_to_firing_until_its_retry():
    """Nothing applied: acting -> firing (trigger ``refused``), held there as the
    ``fleet_budget`` limit for ``BUDGET_RETRY_S``, then the same action is asked again."""
    bus, run = a_run(policy(for_=0.0), 300.0)
    refused = lambda d: (StepResult(Outcome.REFUSED, None, None, "fleet budget: budget-full", refused="budget-full")
                         if isinstance(d, Act) else applied(d))
    seen = drive(run.step(1.0, Room()), refused)
    assert moves(seen)[-2:] == [("firing", "acting"), ("acting", "firing")]
    assert [d.trigger for d in seen if isinstance(d, Transitioned)][-1] == "refused"
    assert "budget-full" in [d for d in seen if isinstance(d, Transitioned)][-1].note
    assert run.state == "firing" and not run.changes and not run.action_times, "a refusal takes nothing"
    waiting = drive(run.step(2.0, Room()), applied)
    assert [d.reason for d in waiting if isinstance(d, Limited)] == [lifecycle.BUDGET_LIMIT]
    assert not any(isinstance(d, Act) for d in waiting) and run.state == "firing"
    bus.publish("step_time_ms", {"job": "j", "rank": "0"}, 300.0, 1.0 + lifecycle.BUDGET_RETRY_S - 0.5)
    still = drive(run.step(1.0 + lifecycle.BUDGET_RETRY_S - 0.5, Room()), applied)
    assert not any(isinstance(d, (Act, Limited)) for d in still), "the wait says so once"
    again = drive(run.step(1.0 + lifecycle.BUDGET_RETRY_S, Room()), applied)
    assert [(d.step, d.mode) for d in again if isinstance(d, Act)] == [(0, "enforce")]
    assert run.state == "verifying" and [ac.journal_id for ac in run.changes] == ["j0"]
