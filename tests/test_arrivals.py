"""Evaluation on arrival: between two ticks the live loop takes the step
signals from the sources that give them as they come (``poll_arrived``) and
steps at once the rules that read them (``Controller.arrived``), and no other.
In process, with the engine's test actuators; nothing is timed: what is
checked is which rules moved and what a tick found already done."""
from __future__ import annotations

import dataclasses
import threading

from engine_fixtures import policy, registry

from reflexarc.controller.engine.audit import AuditLog
from reflexarc.controller.engine.bus import SignalBus
from reflexarc.controller.engine.clock import SimClock, WallClock
from reflexarc.controller.engine.engine import Controller
from reflexarc.controller.policy.model import Condition
from reflexarc.controller.runtime.live import run_live

RANK = {"job": "j", "rank": "0"}


def _two_policies():
    """``test-policy`` reads step_time_ms; ``waits`` reads dataloader_batch_wait_ms."""
    steps = policy(for_=0.0, verify=False)
    rule = dataclasses.replace(steps.rules[0], name="long-waits",
                               when=Condition("dataloader_batch_wait_ms", "max", 10.0, ">", 100.0))
    return steps, dataclasses.replace(steps, name="waits", rules=[rule])


def _moved(audit: AuditLog) -> set[str]:
    return {r["policy"] for r in audit.records if r["kind"] == "transition"}


def test_an_arrival_steps_the_rules_that_read_it_and_no_other():
    clock = SimClock()
    audit = AuditLog(None, clock)
    state: dict = {}
    ctl = Controller(list(_two_policies()), SignalBus(), registry(state, []), clock, audit=audit)
    ctl.start("test")
    clock.set(1.0)
    ctl.bus.publish("step_time_ms", RANK, 500.0, 1.0)
    ctl.bus.publish("dataloader_batch_wait_ms", RANK, 500.0, 1.0)
    assert ctl.arrived(1.0, {"gpu_utilization_pct"}) == 0 and _moved(audit) == set()
    assert ctl.arrived(1.0, {"step_time_ms"}) == 1
    assert _moved(audit) == {"test-policy"}, "only the rule that reads the arrived signal moved"
    assert state == {"rank=0": 1}, "it acted on the arrival"
    clock.set(2.0)
    ctl.tick()                                          # the tick steps every rule
    assert _moved(audit) == {"test-policy", "waits"}
    ctl.shutdown()


class Arriving:
    """A source whose third arrival brings a slow step; at each tick's poll it
    notes whether that step had come, and whether the change was applied."""

    name = "hooks"

    def __init__(self, state: dict, stop: threading.Event) -> None:
        self.state, self.stop = state, stop
        self.arrivals, self.seen_at_ticks = 0, []

    def poll(self, now):
        self.seen_at_ticks.append((self.arrivals >= 3, self.state.get("rank=0", 0)))
        if len(self.seen_at_ticks) >= 3 or any(came for came, _ in self.seen_at_ticks):
            self.stop.set()
        return [("step_time_ms", RANK, 50.0)]

    def poll_arrived(self, now):
        self.arrivals += 1
        return [("step_time_ms", RANK, 500.0)] if self.arrivals == 3 else []

    def close(self):
        pass


def _live(arrivals: float) -> Arriving:
    state: dict = {}
    stop = threading.Event()
    clock = WallClock()
    ctl = Controller([policy(for_=0.0, verify=False, rollback_on=("shutdown",))], SignalBus(),
                     registry(state, []), clock, audit=AuditLog(None, clock))
    ctl.start("test")
    src = Arriving(state, stop)
    run_live(ctl, [src], clock, interval=0.5, stop=stop, arrivals=arrivals)
    return src


def test_the_live_loop_acts_on_an_arrival_before_the_next_tick():
    src = _live(arrivals=0.02)
    first_after = next(applied for came, applied in src.seen_at_ticks if came)
    assert first_after == 1, f"the tick after the slow step found it applied already: {src.seen_at_ticks}"


def test_without_arrivals_nothing_is_polled_between_ticks():
    src = _live(arrivals=0.0)
    assert src.arrivals == 0 and len(src.seen_at_ticks) == 3
