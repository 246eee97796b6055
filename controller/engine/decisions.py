"""What a rule run decides, for the controller to carry out.

A run (``lifecycle.RuleRun``) never calls the controller. Each of its entry
points (``step``, ``withdraw``, ``target_gone``, ``shutdown``, ``end``,
``crashed``) is a generator of these decisions; the controller
(``engine.Controller._drive``) carries each out in order and sends back the
result of those the run waits on: ``Act`` and ``Revert`` are answered with the
executor's ``StepResult``, ``Refresh`` with the changes that moved. Everything
the controller needs (evidence, mode, parameters) travels in the decision.

Example::

    decisions = run.step(now, room)
    decisions.send(None)          # Evaluated(state="firing", result=True, ...)
    decisions.send(None)          # Transitioned(src="firing", dst="acting", ...)
    decisions.send(None)          # Act(step=0, action=..., params={...}, mode="enforce")
    decisions.send(executor.act(...))   # the result; the run moves on to verifying

Overhead: one small object per decision; a healthy tick makes one
(``Evaluated``), whose evidence is rendered only when the audit writes it.
"""
from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Union

from reflexarc.actuators.base import Change

from ..policy.model import Action, Condition
from .evaluate import evidence_item

Described = tuple[tuple[int, Condition, str], ...]   # (index, condition, its text) of the conditions shown
Items = tuple[tuple | None, ...]                      # (value, threshold, baseline, ok) per condition, or None


def render_evidence(conditions: Described, items: Items) -> list[dict]:
    """The conditions as evaluated, one ``evidence_item`` each (those never evaluated left out)."""
    return [evidence_item(cond, text, *items[i]) for i, cond, text in conditions if items[i] is not None]


@dataclass
class ActiveChange:
    """A change a run made (or, outside enforce, would have made)."""

    step: int
    change: Change
    journal_id: str | None
    mode: str
    expires_at: float | None


@dataclass(slots=True)   # not frozen: one is made per run and tick, and a frozen one costs 3x to make
class Evaluated:
    """The rule's conditions were evaluated in ``state``: an ``eval`` record, when the audit's sampling wants one."""

    state: str
    result: bool
    conditions: Described
    items: Items

    def evidence(self) -> list[dict]:
        return render_evidence(self.conditions, self.items)


@dataclass(frozen=True, slots=True)
class Limited:
    """Held back: by a limit (``max_actions``, a node cap), a hold (kill switch,
    pause), or silence (``no_data``): counted and audited as a ``limit``."""

    reason: str


@dataclass(frozen=True, slots=True)
class Transitioned:
    """The run's machine moved: the state metric, a ``transition`` record, a log line."""

    src: str
    dst: str
    trigger: str
    evidence: list[dict]
    note: str
    mode: str


@dataclass(frozen=True, slots=True)
class Act:
    """Run action ``step`` in ``mode`` with ``params`` (the action's, plus the
    evidence for a notification); answered with the ``StepResult``."""

    step: int
    action: Action
    params: dict
    mode: str


@dataclass(frozen=True, slots=True)
class Revert:
    """Undo a held change (audited with ``note``); answered with the ``StepResult``."""

    change: ActiveChange
    note: str | None = None


@dataclass(frozen=True, slots=True)
class Keep:
    """``rollback: never``: close the change's journal entry as ``kept``, without undoing it."""

    change: ActiveChange


@dataclass(frozen=True, slots=True)
class Adopt:
    """Leave a change applied and journaled, for the next start to adopt (``on_restart: adopt``)."""

    change: ActiveChange
    note: str


@dataclass(frozen=True, slots=True)
class Refresh:
    """Follow held changes to new targets and resend firing alerts; answered with
    ``(change, followed)`` for each change that moved: the grown ``Change``, or
    None when its target is gone."""

    changes: tuple[ActiveChange, ...]
    notices: tuple[Change, ...]


@dataclass(frozen=True, slots=True)
class Resolve:
    """Resolve the alerts the run raised."""

    notices: tuple[Change, ...]


Decision = Union[Evaluated, Limited, Transitioned, Act, Revert, Keep, Adopt, Refresh, Resolve]
Decisions = Generator[Decision, object, None]
