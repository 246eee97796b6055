"""Worker churn against the signal bus's series cap, and silence against a
remediated rule, on the real bus and controller in simulated time.

Ten training processes each replace their five DataLoader workers every
second (50 new worker pids a second, as epochs without persistent workers do
on a busy node), for ``CHURN_S`` simulated seconds (five minutes in a soak);
every worker publishes a per-worker signal while it lives. With a cap of
``CAP`` series per signal, the cap is reached within seconds: the exited
workers' series must make room for the new ones (every live worker's sample
stored, never ``series_limit``), and a remediated rule per training process
that reads those signals must not read the churn as "clear".

Then the workers stop for good: the rule's signals fall silent. A remediated
rule holds its change (an audited ``limit`` with reason ``no_data``) rather
than reverting it on silence.

The sources are simulated (a loop publishing what the probes would); the
bus, the rules and the lifecycle are the real ones.
"""
from __future__ import annotations

import os

from engine_fixtures import registry
from reflexarc.controller.bus import SignalBus, Stored
from reflexarc.controller.clock import SimClock
from reflexarc.controller.engine import Controller
from reflexarc.controller.limits import LimitSettings
from reflexarc.controller.policy.model import Action, Condition, Policy, Rollback, Rule, Selector

CAP = 1024
TRAINERS, WORKERS = 10, 5
CHURN_S = 300 if os.environ.get("REFLEXARC_SOAK") == "1" else 90


def churn_policy() -> Policy:
    cond = Condition("dataloader_read_latency_us", "max", 5.0, ">", 1000.0)
    rule = Rule("slow-reads", cond, [Action("knob", {"value": 1})],
                Rollback(frozenset({"clear", "shutdown"}), None, False, "revert"),
                by=("trainer",), for_=2.0, clear_for=5.0, cooldown=30.0)
    return Policy("churn", [rule], mode="enforce", selector=Selector(match={"job": "j"}))


def test_churn_never_blinds_the_rules_and_silence_is_not_health():
    state, sent = {}, []
    clock = SimClock()
    bus = SignalBus(max_series=CAP)
    ctl = Controller([churn_policy()], bus, registry(state, sent), clock,
                     limits=LimitSettings(kill_switch="/nonexistent/off", max_active=TRAINERS, actions_per_hour=100))
    ctl.start("test")
    next_pid = 10_000
    refused = stored = 0
    for t in range(CHURN_S):
        clock.set(float(t))
        for trainer in range(TRAINERS):
            for _ in range(WORKERS):              # this second's workers: new pids
                next_pid += 1
                for tick in range(4):             # four samples over the worker's life
                    r = bus.publish("dataloader_read_latency_us",
                                    {"job": "j", "trainer": str(trainer), "pid": str(next_pid)}, 5000.0,
                                    t + tick * 0.25)
                    refused += r is Stored.SERIES_LIMIT
                    stored += r is not Stored.SERIES_LIMIT
        ctl.tick()
    assert next_pid - 10_000 == TRAINERS * WORKERS * CHURN_S > 4 * CAP, "the churn outgrows the cap many times"
    assert refused == 0, f"{refused} samples of live workers refused at the series cap ({stored} stored)"
    assert len(bus.series("dataloader_read_latency_us")) <= CAP
    runs = {key: run for key, run in ctl.runs.items() if key[0] == "churn"}
    assert len(runs) == TRAINERS
    assert {run.state for run in runs.values()} == {"remediated"}, {k: r.state for k, r in runs.items()}
    outcomes = [(r["actuator"], r["outcome"]) for r in ctl.audit.records if r["kind"] == "action"]
    assert outcomes.count(("knob", "applied")) == TRAINERS and ("knob", "reverted") not in outcomes, outcomes

    # silence: no worker publishes any more
    for t in range(CHURN_S, CHURN_S + 60):
        clock.set(float(t))
        ctl.tick()
    assert {run.state for run in runs.values()} == {"remediated"}, "silence was read as clear"
    holds = [r for r in ctl.audit.records if r["kind"] == "limit" and r["reason"] == "no_data"]
    assert len(holds) == TRAINERS, holds
    assert all(state[key] == 1 for key in state), state     # every change still applied
    ctl.shutdown()
    assert all(v == 0 for v in state.values()), "shutdown reverts what the rule holds"
