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

The series of a process the probes saw exit leave at once
(``SignalBus.drop_exited``), those a process that reused the pid fed since
stay; ``ProbeSource`` hands the bus the exits of its previous poll before its
next batch is published (here with a stand-in probe manager; the real probes
and workers are in ``test_probe_proc_exit.py`` and ``reliability/churn.py``).
"""
from __future__ import annotations

import os

from engine_fixtures import registry
from reflexarc.controller.engine.bus import SignalBus, Stored
from reflexarc.controller.engine.clock import SimClock
from reflexarc.controller.engine.engine import Controller
from reflexarc.controller.engine.limits import LimitSettings
from reflexarc.controller.policy.model import Action, Condition, Policy, Rollback, Rule, Selector
from reflexarc.controller.sources.readers import ProbeSource

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


def worker_series(bus, name="dataloader_read_latency_us") -> set[str]:
    return {s.labels["pid"] for s in bus.series(name)}


def test_an_exited_process_series_leave_at_once_and_a_reused_pid_keeps_its_own():
    bus = SignalBus(max_series=8, silent_after=10.0)
    for pid in ("101", "102", "103"):
        for q in ("0.5", "0.99"):
            bus.publish("dataloader_read_latency_us", {"trainer": "7", "pid": pid, "quantile": q}, 900.0, ts=1.0)
        bus.publish("dataloader_reads_total", {"trainer": "7", "pid": pid}, 3.0, ts=1.0)
    bus.publish("step_time_ms", {"job": "j", "rank": "0"}, 250.0, ts=1.0)
    gen = bus.generation("dataloader_read_latency_us")
    assert bus.drop_exited({101, 102, 999}, fed_until=1.0) == 6      # 999: no series, nothing to do
    assert worker_series(bus) == worker_series(bus, "dataloader_reads_total") == {"103"}
    assert bus.generation("dataloader_read_latency_us") != gen, "readers must resolve their series again"
    assert bus.series_count() == 4

    # pid 102 reused by a new process fed after the poll that saw the old one exit
    bus.publish("dataloader_reads_total", {"trainer": "7", "pid": "102"}, 1.0, ts=2.0)
    assert bus.drop_exited({102}, fed_until=1.0) == 0
    assert worker_series(bus, "dataloader_reads_total") == {"102", "103"}

    # series gone by expiry or to make room leave the index too: a later exit finds nothing
    bus.expire(now=1.0 + bus.retention)
    assert worker_series(bus, "dataloader_reads_total") == {"102"}
    assert bus.drop_exited({103}, fed_until=10.0) == 0
    for pid in range(200, 208):                  # the cap: the silent series make room
        bus.publish("dataloader_reads_total", {"pid": str(pid)}, 1.0, ts=20.0)
    assert "102" not in worker_series(bus, "dataloader_reads_total")
    assert bus.drop_exited({102}, fed_until=30.0) == 0
    assert bus.drop_exited(range(200, 208), fed_until=20.0) == 8 and bus.series_count() == 0


class ExitingProbes:
    """A stand-in probe manager: each collect returns the batch queued for it
    and sets ``exited`` as the real one does."""

    def __init__(self, batches) -> None:
        self.batches = list(batches)
        self.exited = frozenset()

    def refresh_selection(self):
        pass

    def expire_deep(self, now):
        return []

    def collect(self, now):
        samples, self.exited = self.batches.pop(0)
        return samples


def reads(pid: int, trainer: str = "7"):
    return ("dataloader_reads_total", {"trainer": trainer, "pid": str(pid)}, 1.0)


def test_probe_source_drops_the_exited_before_its_next_batch_is_published():
    bus = SignalBus()
    probes = ExitingProbes([
        ([reads(1), reads(2)], frozenset()),
        ([reads(1), reads(2)], frozenset({2, 4242})),   # 2 exited: these are its last counts
        ([reads(1), reads(2, trainer="8")], frozenset()),   # pid 2 again: a new process, fed after the exit
        ([reads(1)], frozenset()),
    ])
    source = ProbeSource(probes, bus=bus)
    seen = []
    for now in (1.0, 2.0, 3.0, 4.0):
        for name, labels, value in source.poll(now):
            bus.publish(name, labels, value, now)
        seen.append(sorted((s.labels["pid"], s.labels["trainer"]) for s in bus.series("dataloader_reads_total")))
    assert seen[1] == [("1", "7"), ("2", "7")], "the poll that sees the exit publishes the last counts"
    assert seen[2] == [("1", "7"), ("2", "8")], "the next one drops the exited, not the new process"
    assert seen[3] == seen[2]


def test_at_the_cap_room_is_made_the_moment_a_series_falls_silent_not_later():
    """A pass that frees nothing notes when the first series can fall silent and
    refuses without a walk until then: exactly until then, a series created
    late with an older time included."""
    bus = SignalBus(max_series=4, silent_after=10.0)
    for pid, ts in (("1", 6.0), ("2", 7.0), ("3", 8.0), ("4", 5.0)):    # pid 4 falls silent first, at 15 s
        bus.publish("dataloader_reads_total", {"pid": pid}, 1.0, ts=ts)
    for n, ts in enumerate((9.0, 12.0, 14.9)):
        assert bus.publish("dataloader_reads_total", {"pid": f"5{n}"}, 1.0, ts=ts) is Stored.SERIES_LIMIT
    assert bus.publish("dataloader_reads_total", {"pid": "6"}, 1.0, ts=15.0) is Stored.STORED
    assert worker_series(bus, "dataloader_reads_total") == {"1", "2", "3", "6"}
