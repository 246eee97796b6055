"""The synthetic workload of ``bench/engine.py``: policies built in code, a
notify-only actuator, and the 1 Hz feed of two signals for ten ranks.

Example::

    ctl = Controller(policies(100), bus, registry(), clock)
    feed(bus, t=61, busy=True)

Overhead: 20 bus publishes per simulated second.
"""
from __future__ import annotations

from reflexarc.actuators.base import Actuator, ActuatorSpec, Change, ParamSpec, Registry
from reflexarc.controller.policy.model import Action, Combo, Condition, Policy, Rollback, Rule

TARGETS = 10
BASE_STEP_MS, BASE_WAIT_MS = 180.0, 2.0


class Mark(Actuator):
    """A change that touches nothing: records its target in a set."""

    spec = ActuatorSpec("mark", "bench marker", (ParamSpec("value", "int", required=True),))

    def __init__(self) -> None:
        self.marked: set[str] = set()

    def read_current(self, target):
        return target.key() in self.marked

    def plan(self, target, params):
        return Change("mark", target, dict(params), self.read_current(target), True, "mark")

    def apply(self, change):
        self.marked.add(change.target.key())

    def revert(self, change):
        self.marked.discard(change.target.key())


def registry() -> Registry:
    r = Registry()
    r.register(Mark.spec, Mark)
    return r


def policies(rules: int) -> list[Policy]:
    out = []
    for i in range(rules):
        when = Combo("all", [
            Condition("step_time_ms", "max", 30.0, ">", 300.0 + i),
            Condition("dataloader_batch_wait_ms", "p99", 30.0, ">", 20.0 + i / 100),
        ])
        rule = Rule(f"r{i}", when, [Action("mark", {"value": 1})], Rollback(frozenset({"clear"})),
                    by=("rank",), for_=5.0, clear_for=10.0, cooldown=30.0)
        out.append(Policy(f"p{i}", [rule], mode="enforce"))
    return out


def feed(bus, t: int, busy: bool) -> None:
    """One second of samples; when ``busy``, a different tenth of the ranks
    breaches for the first 20 s of every minute."""
    hot = (t // 60) % TARGETS if busy and t % 60 < 20 else -1
    for rank in range(TARGETS):
        labels = {"job": "bench", "rank": str(rank)}
        slow = rank == hot
        bus.publish("step_time_ms", labels, (900.0 if slow else BASE_STEP_MS) + (t % 7), t)
        bus.publish("dataloader_batch_wait_ms", labels, (90.0 if slow else BASE_WAIT_MS) + (t % 3) / 10, t)
