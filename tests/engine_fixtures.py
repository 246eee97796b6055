"""Small building blocks for engine tests: a policy built in code and a toy
"knob" actuator whose effect the test's signal generator reads back."""
from __future__ import annotations

from reflexarc.actuators.base import Actuator, ActuatorSpec, Change, ParamSpec, Registry, Target
from reflexarc.controller.policy.model import (Action, Condition, Policy, RateLimit, Rollback, Rule,
                                               Selector, Verify)


class Knob(Actuator):
    """Sets a named integer; ``state`` is what the fake plant reads."""

    spec = ActuatorSpec("knob", "test knob", (ParamSpec("value", "int", required=True),))

    def __init__(self, state: dict) -> None:
        self.state = state

    def read_current(self, target: Target, params: dict | None = None):
        return self.state.get(target.key(), 0)

    def plan(self, target, params):
        before = self.read_current(target)
        return Change("knob", target, dict(params), before, params["value"], f"knob {before}->{params['value']}")

    def apply(self, change):
        self.state[change.target.key()] = change.after

    def revert(self, change):
        self.state[change.target.key()] = change.before

    def exists(self, change):
        """The test says a target is gone by setting ``state["gone:<key>"]``."""
        return not self.state.get("gone:" + change.target.key())


class Note(Actuator):
    spec = ActuatorSpec("alert", "test alert", (ParamSpec("summary", "str"),), changes_system=False)

    def __init__(self, sent: list) -> None:
        self.sent = sent

    def read_current(self, target, params: dict | None = None):
        return None

    def plan(self, target, params):
        return Change("alert", target, dict(params), None, params, "alert")

    def apply(self, change):
        self.sent.append(change.params)

    def revert(self, change):
        pass


def registry(state: dict, sent: list) -> Registry:
    r = Registry()
    r.register(Knob.spec, lambda: Knob(state))
    r.register(Note.spec, lambda: Note(sent))
    return r


def cond(op=">", threshold=100.0, relative=False, window=10.0, agg="max"):
    return Condition("step_time_ms", agg, window, op, threshold, relative=relative)


def policy(mode="enforce", actions=("knob",), verify=True, rollback_on=("verify-failed", "clear", "shutdown"),
           ttl=None, for_=5.0, clear_for=10.0, cooldown=30.0, max_actions=None, on_restart="revert",
           never=False, threshold=100.0):
    acts = [Action("knob", {"value": 1}) if a == "knob" else Action("alert", {"summary": "x"}) for a in actions]
    on = frozenset(rollback_on) | (frozenset({"ttl"}) if ttl else frozenset())
    rule = Rule("slow-steps", cond(threshold=threshold), acts,
                Rollback(frozenset() if never else on, ttl, never, on_restart),
                by=("rank",), for_=for_, clear_for=clear_for,
                verify=Verify(cond("<", threshold), 20.0) if verify else None,
                cooldown=cooldown, max_actions=RateLimit(*max_actions) if max_actions else None)
    return Policy("test-policy", [rule], mode=mode, selector=Selector(match={"job": "j"}))
