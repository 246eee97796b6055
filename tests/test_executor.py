"""The executor's error handling: temporary errors retried within bounds,
permanent ones not, a failed apply undone, every step journaled first."""
from __future__ import annotations

from reflexarc.actuators.base import (Actuator, ActuatorSpec, Change, PermanentActuatorError, ParamSpec, Registry,
                                      Target, TemporaryActuatorError)
from reflexarc.controller.engine.clock import SimClock
from reflexarc.controller.engine.executor import Executor, RetrySettings
from reflexarc.controller.engine.journal import Journal


class Flaky(Actuator):
    spec = ActuatorSpec("flaky", "test", (ParamSpec("fail", "str"),))

    def __init__(self):
        self.value, self.attempts, self.reverts = 0, 0, 0

    def read_current(self, target, params=None):
        return self.value

    def plan(self, target, params):
        return Change("flaky", target, dict(params), self.value, 1, "flaky 0->1")

    def apply(self, change):
        self.attempts += 1
        mode = change.params.get("fail", "")
        if mode == "temporary-twice" and self.attempts <= 2:
            raise TemporaryActuatorError("busy")
        if mode == "temporary-always":
            raise TemporaryActuatorError("busy")
        if mode == "permanent":
            raise PermanentActuatorError("no such device")
        if mode == "half":
            self.value = 1            # half-applied, then fails
            raise PermanentActuatorError("second half failed")
        if mode == "silent":
            return                    # says nothing, takes nothing: only a read-back tells
        self.value = change.after

    def drift(self, change):
        return None if self.value == change.after else f"value is {self.value}, not {change.after}"

    def revert(self, change):
        self.reverts += 1
        self.value = change.before


def setup(tmp_path):
    act = Flaky()
    reg = Registry()
    reg.register(Flaky.spec, lambda: act)
    journal = Journal(tmp_path / "j.jsonl")
    return act, Executor(reg, journal, SimClock(), RetrySettings(attempts=4), real_sleep=False), journal


def test_temporary_errors_are_retried_then_succeed(tmp_path):
    act, ex, journal = setup(tmp_path)
    res = ex.act("flaky", Target(), {"fail": "temporary-twice"}, "enforce")
    assert res.outcome == "applied" and act.attempts == 3 and act.value == 1
    assert [h["state"] for h in journal.get(res.journal_id).history] == ["intent", "applied"]


def test_temporary_errors_are_bounded(tmp_path):
    act, ex, journal = setup(tmp_path)
    res = ex.act("flaky", Target(), {"fail": "temporary-always"}, "enforce")
    assert res.outcome == "failed" and act.attempts == 4
    assert journal.get(res.journal_id).state == "failed"


def test_permanent_errors_are_not_retried_and_half_applied_is_undone(tmp_path):
    act, ex, journal = setup(tmp_path)
    res = ex.act("flaky", Target(), {"fail": "permanent"}, "enforce")
    assert res.outcome == "failed" and act.attempts == 1
    act.attempts = 0
    res = ex.act("flaky", Target(), {"fail": "half"}, "enforce")
    assert res.outcome == "failed" and act.reverts >= 1 and act.value == 0
    assert journal.open_entries() == []


def test_dry_run_and_alert_only_never_apply_or_journal(tmp_path):
    act, ex, journal = setup(tmp_path)
    assert ex.act("flaky", Target(), {}, "dry-run").outcome == "planned"
    assert ex.act("flaky", Target(), {}, "alert-only").outcome == "alerted"
    assert act.attempts == 0 and journal.entries() == []


def test_torn_last_journal_line_is_ignored(tmp_path):
    act, ex, journal = setup(tmp_path)
    ex.act("flaky", Target(), {}, "enforce")
    journal.close()
    with open(tmp_path / "j.jsonl", "a") as f:
        f.write('{"id": "abc", "state": "inte')      # a crash mid-write
    again = Journal(tmp_path / "j.jsonl")
    assert [e.state for e in again.open_entries()] == ["applied"]
    again.close()


def test_a_change_that_does_not_read_back_is_undone_and_fails_the_step(tmp_path):
    act, ex, journal = setup(tmp_path)
    res = ex.act("flaky", Target(), {"fail": "silent"}, "enforce")
    assert res.outcome == "failed" and "read back otherwise (value is 0, not 1)" in res.error
    assert act.reverts == 1 and act.value == 0
    assert journal.open_entries() == []
    assert journal.get(res.journal_id).state == "failed"


def test_drift_of_an_open_entry_is_what_the_system_no_longer_shows(tmp_path):
    act, ex, journal = setup(tmp_path)
    res = ex.act("flaky", Target(), {}, "enforce")
    entry = journal.get(res.journal_id)
    assert ex.drifted(entry) is None
    act.value = 5                     # changed behind the executor's back
    assert ex.drifted(entry) == "value is 5, not 1"


def test_every_actuator_reads_the_system_with_one_signature():
    import importlib
    import inspect
    import pkgutil

    import reflexarc.actuators as package
    for mod in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"reflexarc.actuators.{mod.name}")
    importlib.import_module("reflexarc.simulations.sim_actuators")
    seen, todo = [], list(Actuator.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if "read_current" in vars(cls) and cls.__module__.startswith("reflexarc."):
            seen.append(cls.__name__)
            assert list(inspect.signature(cls.read_current).parameters) == ["self", "target", "params"], cls
    assert {"AffinityActuator", "DscpActuator", "SysctlActuator"} <= set(seen)
