"""What a scenario promises, per mode, and the check of a run against it.

A scenario's ``expect`` block says, for ``enforce`` and ``dry-run`` (and
optionally ``alert-only``), which actuator steps the run must show, whether the
plant must end up fixed, how many system changes are allowed at most, and which
alerts must be raised. The check reads the run's ``action`` audit records (see
``docs/audit-format.md``) and the plant.

Example::

    exp = scenario.expect["enforce"]
    problems = check_expectation(exp, result.actions(), plant)   # [] when the run kept the promise

Overhead: one pass over the run's action records.
"""
from __future__ import annotations

from dataclasses import dataclass

from reflexarc.actuators.specs import SPECS
from reflexarc.core.outcomes import TAKEN, Outcome

MODES = ("dry-run", "alert-only", "enforce")
OUTCOMES = (Outcome.APPLIED, Outcome.PLANNED, Outcome.ALERTED, Outcome.NOOP, Outcome.FAILED, Outcome.REVERTED,
            Outcome.WOULD_REVERT, Outcome.KEPT, Outcome.ADOPTED, Outcome.NOTIFIED)
CHANGE_OUTCOMES = TAKEN


@dataclass(frozen=True)
class ExpectedAction:
    actuator: str
    outcome: str
    rule: str | None = None

    def matches(self, record: dict) -> bool:
        return (record.get("actuator") == self.actuator and record.get("outcome") == self.outcome
                and (self.rule is None or record.get("rule") == self.rule))

    def describe(self) -> str:
        rule = f" by rule {self.rule}" if self.rule else ""
        return f"{self.actuator} {self.outcome}{rule}"


@dataclass
class Expectation:
    """``actions``: steps that must appear in this order (others may come between);
    an empty list means no action at all; None leaves actions unchecked.
    ``fixed``: whether every fault is neutralised at the end of the run.
    ``max_changes``: most actions that changed (or would have changed) the system.
    ``alerts``: label sets, each carried by a distinct raised alert; empty means none."""

    actions: list[ExpectedAction] | None = None
    fixed: bool | None = None
    max_changes: int | None = None
    alerts: list[dict] | None = None


def _changes(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("outcome") in CHANGE_OUTCOMES
            and r.get("actuator") in SPECS and SPECS[r["actuator"]].changes_system]


def check_expectation(expectation: Expectation, action_records: list[dict], plant) -> list[str]:
    """Problems with a run (empty when it matched): ``action_records`` are the
    run's audit records of kind ``action``; ``plant`` the plant it ran against."""
    problems = []
    seen = [f"{r.get('actuator')} {r.get('outcome')}" for r in action_records]
    if expectation.actions is not None:
        if not expectation.actions and action_records:
            problems.append(f"expected no actions, got: {', '.join(seen)}")
        position = 0
        for want in expectation.actions:
            while position < len(action_records) and not want.matches(action_records[position]):
                position += 1
            if position == len(action_records):
                problems.append(f"expected '{want.describe()}' (in order) among actions: "
                                f"{', '.join(seen) or 'none'}")
                break
            position += 1
    if expectation.fixed is not None and plant.fixed != expectation.fixed:
        state = "fixed" if plant.fixed else f"not fixed (still in effect: {', '.join(plant.unfixed)})"
        problems.append(f"expected the plant {'fixed' if expectation.fixed else 'not fixed'} at the end, "
                        f"it was {state}")
    if expectation.max_changes is not None:
        changes = _changes(action_records)
        if len(changes) > expectation.max_changes:
            problems.append(f"expected at most {expectation.max_changes} changes, got {len(changes)}: "
                            + ", ".join(f"{r['actuator']}@{r.get('ts', '?')}" for r in changes))
    if expectation.alerts is not None:
        problems.extend(_check_alerts(expectation.alerts, plant.alerts))
    return problems


def _check_alerts(wanted: list[dict], alerts: list[dict]) -> list[str]:
    if not wanted:
        return [f"expected no alerts, got {len(alerts)}: " + "; ".join(a["summary"] for a in alerts)] if alerts else []
    free = list(alerts)
    problems = []
    for labels in wanted:
        hit = next((a for a in free if all(str(a["labels"].get(k)) == str(v) for k, v in labels.items())), None)
        if hit is None:
            problems.append(f"expected an alert with labels {labels}, got: "
                            + ("; ".join(str(a["labels"]) for a in alerts) or "none"))
        else:
            free.remove(hit)
    return problems
