"""Runs one actuator step the same way in every mode: plan, diff, journal, apply.

``enforce`` journals the intent, applies (temporary errors retried with tenacity,
bounded), journals ``applied``; a failed apply is reverted before the error is
reported, so nothing is left half-applied. A journal that cannot take the intent
refuses the step before anything is applied (``FAILED``, "refused before apply");
one that cannot take the ``applied`` mark (or a refreshed change) gets the
change undone (``FAILED``; ``REVERTED`` for a refresh): nothing stays applied
that the journal does not list. A ``reverted`` step it cannot take is named in
``unrecorded``: the change was reverted, the journal still shows it open, and
the next start reverts it again (reverting is idempotent).
``dry-run`` stops after the plan and returns the diff. ``alert-only`` stops
after the plan and raises an alert that describes the change instead.
Notify-only actuators (alert, log) send in ``enforce`` and ``alert-only`` and
only plan in ``dry-run``.

With a fleet budget (``controller/fleet/budget.py``, which needs a journal),
``enforce`` first takes a slot of the pool ``policy:<policy>`` before it
journals the intent; a refusal (the budget full, the store out of reach or
answering an error) is ``REFUSED`` with the reason in ``refused``: nothing is
journaled or applied. The slot is given back once the change is closed:
reverted, closed without a revert (kept, forgotten, its target gone), or
failed and undone. A change whose undo failed keeps its slot (it may still be
on the system). A change a restart adopted takes its slot again, past the
queue (``hold_adopted``, asked at each of the engine's housekeeping passes
until it has one). Dry-run, alert-only and notifications never touch the budget.
A budget without a limit takes no slot: it only holds the node's lease.

A policy with a rollout (``rollout=`` of ``act``) is first admitted by the
fleet's rollout (``controller/fleet/rollout.py``): a node outside the stage,
or any node while the policy's breaker is open, is ``REFUSED``
(``rollout-stage``, ``breaker-open``); without a fleet store it is refused
too (``no-fleet-store``): a rollout is never skipped. A policy's own budget
(``budget=`` of ``act``, ``core/budget.py``) takes its slot by that limit
instead of the node's, in one pool per job with ``per: job`` (the target's
``job`` label, else ``job=``, the job its selector names); without a fleet
store it is refused the same way.

Example::

    ex = Executor(registry, journal, clock)
    step = ex.act("affinity", target, {"node": 0}, mode="enforce", policy="p", rule="r")
    step.outcome        # an Outcome: APPLIED, PLANNED, ALERTED, NOOP, NOTIFIED, FAILED
    ex.revert(step.change, step.journal_id, mode="enforce")
    ex.deliver_notices()     # at stop: the alerts queued (resolutions too) go out, within the deadline
    Executor(registry, journal, clock, budget=FleetBudget(store, "node-a", max_nodes=2))   # fleet-wide slots
    Executor(registry, journal, clock, budget=budget, rollout=FleetRollout(budget))
    ex.act("sysctl", target, params, mode="enforce", policy="p", rule="r", rollout=spec)  # stage and breaker first
    ex.act("affinity", target, params, mode="enforce", policy="p", rule="r",
           budget=BudgetSpec(max_nodes=2, per="job"))          # the policy's own limit, per job

Overhead: the actuator's own cost, one fsync per journal step.
"""
from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from reflexarc.actuators.base import (ActuatorError, Change, PermanentActuatorError, Registry, Target,
                                      TemporaryActuatorError)
from reflexarc.core.outcomes import Outcome
from reflexarc.core.budget import BudgetSpec
from reflexarc.core.rollout import RolloutSpec

from ..fleet.budget import FleetBudget, Refused
from ..fleet.rollout import FleetRollout
from .journal import Entry, Journal, JournalWriteError

log = logging.getLogger("reflexarc.executor")

FAULT_ENV = "REFLEXARC_FAULT_INJECT"   # "after-intent" | "after-apply": SIGKILL self there
CLOSING = frozenset({Outcome.FAILED, Outcome.REVERTED, Outcome.TARGET_GONE, Outcome.KEPT, Outcome.FORGOTTEN})
"""Journal states that close an entry: its fleet slot is given back."""


@dataclass
class StepResult:
    outcome: Outcome
    change: Change | None = None
    journal_id: str | None = None
    error: str | None = None
    notice: Change | None = None   # an alert sent by this step, to resolve when the rule clears
    unrecorded: str | None = None  # the journal step this change could not record
    refused: str | None = None     # REFUSED: the fleet budget's reason (budget-full, store-unreachable, ...)


@dataclass
class RetrySettings:
    attempts: int = 4
    wait_min: float = 0.05
    wait_max: float = 2.0


class Executor:
    def __init__(self, registry: Registry, journal: Journal | None, clock, retry: RetrySettings | None = None,
                 real_sleep: bool = True, budget: FleetBudget | None = None,
                 rollout: FleetRollout | None = None) -> None:
        if budget is not None and journal is None:
            raise ValueError("a fleet budget needs a journal: a slot is given back when its change's entry closes")
        self.registry = registry
        self.journal = journal
        self.budget = budget
        self.rollout = rollout
        self._slots: dict[str, str] = {}     # journal id -> the budget holder of its slot
        self._holders = 0
        self.clock = clock
        self.retry = retry or RetrySettings()
        self._sleep = clock.sleep if real_sleep else (lambda s: None)

    def _retrying(self, fn, *args):
        r = Retrying(stop=stop_after_attempt(self.retry.attempts),
                     wait=wait_exponential(multiplier=self.retry.wait_min, max=self.retry.wait_max),
                     retry=retry_if_exception_type(TemporaryActuatorError), sleep=self._sleep, reraise=True)
        return r(fn, *args)

    @staticmethod
    def _fault(point: str) -> None:
        if os.environ.get(FAULT_ENV) == point:
            os.kill(os.getpid(), signal.SIGKILL)

    def plan(self, actuator: str, target: Target, params: dict) -> Change:
        act = self.registry.get(actuator)
        return self._retrying(act.plan, target, params)

    def act(self, actuator: str, target: Target, params: dict, mode: str, policy: str = "", rule: str = "",
            on_restart: str = "revert", rollout: RolloutSpec | None = None, budget: BudgetSpec | None = None,
            job: str | None = None) -> StepResult:
        try:
            change = self.plan(actuator, target, params)
        except ActuatorError as exc:
            return StepResult(Outcome.FAILED, error=f"plan: {exc}")
        spec = self.registry.spec(actuator)
        if change.noop and spec.changes_system:
            return StepResult(Outcome.NOOP, change)
        if not spec.changes_system:
            if mode == "dry-run":
                return StepResult(Outcome.PLANNED, change)
            return self._send(change)
        if mode == "dry-run":
            return StepResult(Outcome.PLANNED, change)
        if mode == "alert-only":
            return self._alert_instead(change, policy, rule)
        return self._apply(change, policy, rule, on_restart, rollout, budget, job)

    def _send(self, change: Change) -> StepResult:
        try:
            self._retrying(self.registry.get(change.actuator).apply, change)
        except ActuatorError as exc:
            return StepResult(Outcome.FAILED, change, error=str(exc))
        return StepResult(Outcome.NOTIFIED, change, notice=change if change.actuator == "alert" else None)

    def notify(self, target: Target, summary: str, labels: dict, severity: str = "critical") -> StepResult:
        """Send an alert that no rule raised (a fleet event): ``NOTIFIED``, or
        ``PLANNED`` when this controller has no alert receiver (the audit has it)."""
        if "alert" not in self.registry:
            return StepResult(Outcome.PLANNED)
        try:
            alert = self.plan("alert", target, {"severity": severity, "summary": summary, "labels": labels})
            return self._send(alert)
        except ActuatorError as exc:
            return StepResult(Outcome.FAILED, error=f"alert: {exc}")

    def _alert_instead(self, change: Change, policy: str, rule: str) -> StepResult:
        if "alert" not in self.registry:
            return StepResult(Outcome.ALERTED, change)
        params = {"severity": "warning",
                  "summary": f"{policy}/{rule} would apply: {change.summary}",
                  "labels": {"mode": "alert-only", "actuator": change.actuator}}
        try:
            alert = self.plan("alert", change.target, params)
            self._retrying(self.registry.get("alert").apply, alert)
        except ActuatorError as exc:
            return StepResult(Outcome.FAILED, change, error=f"alert: {exc}")
        return StepResult(Outcome.ALERTED, change, notice=alert)

    def _take(self, change: Change, policy: str, rule: str, rollout: RolloutSpec | None,
              budget: BudgetSpec | None = None, job: str | None = None) -> str | StepResult | None:
        """The rollout's admission, then a slot of the fleet budget for
        ``change`` (by the policy's own ``budget``, in its pool for the
        target's job with ``per: job``, else by the node's limits): the
        slot's holder, a ``REFUSED`` result, or None without a limit."""
        if rollout is not None:
            try:
                if self.rollout is None:
                    raise Refused("no-fleet-store", f"policy {policy} declares a rollout, and this controller "
                                                    f"runs without a fleet store (run --fleet-etcd)")
                self.rollout.admit(policy, rollout)
            except Refused as exc:
                return StepResult(Outcome.REFUSED, change, error=f"fleet rollout: {exc}", refused=exc.reason)
        if budget is not None and self.budget is None:
            return StepResult(Outcome.REFUSED, change, refused="no-fleet-store",
                              error=f"fleet budget: no-fleet-store: policy {policy} declares a budget, and this "
                                    f"controller runs without a fleet store (run --fleet-etcd)")
        if self.budget is None or not self.budget.limited and budget is None:
            return None
        pool, holder = self._pool_and_holder(policy, rule, change.target, budget, job)
        try:
            self.budget.take(pool, holder, budget)
        except Refused as exc:
            return StepResult(Outcome.REFUSED, change, error=f"fleet budget: {exc}", refused=exc.reason)
        return holder

    def _pool_and_holder(self, policy: str, rule: str, target, budget: BudgetSpec | None,
                         job: str | None) -> tuple[str, str]:
        """The fleet pool a change of ``policy`` on ``target`` counts in (its
        own budget's, else the node's per-policy pool) and a holder name for
        its slot, unique in this process."""
        self._holders += 1
        holder = f"{policy}/{rule}/{target.key()}#{self._holders}"
        pool = budget.pool(policy, target.labels, job) if budget is not None else f"policy:{policy}"
        return pool, holder

    def closed(self, journal_id: str | None) -> None:
        """The entry ``journal_id`` is closed (here, or by an operator's
        ``forget``): give back its fleet slot, if it holds one."""
        holder = self._slots.pop(journal_id, None) if journal_id else None
        if holder is not None and self.budget is not None:
            self.budget.give_back(holder)

    def _apply(self, change: Change, policy: str, rule: str, on_restart: str, rollout: RolloutSpec | None,
               budget: BudgetSpec | None = None, job: str | None = None) -> StepResult:
        act = self.registry.get(change.actuator)
        holder = self._take(change, policy, rule, rollout, budget, job)
        if isinstance(holder, StepResult):
            return holder
        try:
            jid = self.journal.intent(change.to_dict(), policy, rule, on_restart) if self.journal else None
        except JournalWriteError as exc:     # the intent must be durable before the change
            if holder is not None:
                self.budget.give_back(holder)
            return StepResult(Outcome.FAILED, change, error=f"refused before apply: {exc}")
        if holder is not None:
            self._slots[jid] = holder
        self._fault("after-intent")
        try:
            self._retrying(act.apply, change)
        except ActuatorError as exc:
            undone = self._undo_partial(act, change)
            unrecorded = self._record(jid, Outcome.FAILED if undone else "intent",
                                      note=f"apply failed: {exc}" + ("" if undone else "; revert failed"))
            return StepResult(Outcome.FAILED, change, jid, str(exc), unrecorded=unrecorded)
        differs = self._drift(act, change)
        if differs is not None:              # read back: the system did not take it as planned
            undone = self._undo_partial(act, change)
            unrecorded = self._record(jid, Outcome.FAILED if undone else "intent",
                                      note=f"applied but read back otherwise: {differs}"
                                      + ("" if undone else "; revert failed"))
            return StepResult(Outcome.FAILED, change, jid, f"applied but read back otherwise ({differs}); "
                                                           + ("undone" if undone else "the undo failed too"),
                              unrecorded=unrecorded)
        unrecorded = self._record(jid, Outcome.APPLIED)
        if unrecorded and self._undo_partial(act, change):   # no change stays applied that the journal lacks
            self.closed(jid)
            return StepResult(Outcome.FAILED, change, jid, f"applied, then undone: the journal could not record "
                                                           f"it ({unrecorded})", unrecorded=unrecorded)
        self._fault("after-apply")
        return StepResult(Outcome.APPLIED, change, jid, unrecorded=unrecorded)

    @staticmethod
    def _drift(act, change: Change) -> str | None:
        """What reads back otherwise than ``change.after``; None when it matches or
        cannot be told (an error reading back is logged, never taken for drift)."""
        try:
            return act.drift(change)
        except (ActuatorError, OSError) as exc:
            log.warning("%s: cannot read back: %s", change.actuator, exc)
            return None

    def drifts(self) -> tuple[dict[str, str], dict[str, str]]:
        """Every open journal entry read back: ``{id: what differs}`` for those
        the system no longer shows, and ``{id: why}`` for those that cannot be
        read back (an actuator this node lacks, a record it cannot read)."""
        drifted, unreadable = {}, {}
        for entry in self.journal.open_entries() if self.journal else ():
            try:
                differs = self.drifted(entry)
            except (ActuatorError, AttributeError, KeyError, TypeError, ValueError) as exc:
                unreadable[entry.id] = str(exc) or type(exc).__name__
                continue
            if differs is not None:
                drifted[entry.id] = differs
        return drifted, unreadable

    def drifted(self, entry: Entry) -> str | None:
        """What of an open journal entry the system no longer shows (someone
        changed it behind the controller's back), or None."""
        change = Change.from_dict(entry.change)
        act = self.registry.get(change.actuator)
        try:
            if not act.exists(change):
                return None                  # gone: the next refresh or reconcile closes it
        except ActuatorError:
            return None
        return self._drift(act, change)

    def _record(self, journal_id: str | None, state: str, note: str = "", change: dict | None = None) -> str | None:
        """Journal a step of what was already done; what could not be recorded, or None."""
        if not (journal_id and self.journal):
            return None
        try:
            self.journal.mark(journal_id, state, note, change)
        except JournalWriteError as exc:
            unrecorded = f"not recorded: {exc}"
        else:
            unrecorded = None
        if state in CLOSING:      # recorded or not, the change is off the system or closed: its slot is free
            self.closed(journal_id)
        return unrecorded

    def _undo_partial(self, act, change: Change) -> bool:
        try:
            self._retrying(act.revert, change)
            return True
        except ActuatorError as exc:
            log.error("could not undo a failed %s: %s", change.actuator, exc)
            return False

    def _gone(self, act, change: Change, journal_id: str | None) -> StepResult | None:
        """``TARGET_GONE`` (journal entry closed) when the change's target no longer exists."""
        try:
            if act.exists(change):
                return None
        except ActuatorError as exc:
            log.warning("cannot tell whether the target of %s exists: %s", change.actuator, exc)
            return None
        unrecorded = self._record(journal_id, Outcome.TARGET_GONE, note=f"{change.target.key()} no longer exists")
        return StepResult(Outcome.TARGET_GONE, change, journal_id, unrecorded=unrecorded)

    def refresh(self, change: Change, journal_id: str | None, mode: str) -> StepResult | None:
        """While a change is active: ``TARGET_GONE`` when its target no longer
        exists; in enforce, extend it to new targets (e.g. new workers) or resend a
        firing alert, journaling the grown change (outcome ``APPLIED``). None when
        nothing is new."""
        act = self.registry.get(change.actuator)
        gone = self._gone(act, change, journal_id)
        if gone is not None or mode != "enforce":
            return gone
        try:
            grown = act.refresh(change)
        except ActuatorError as exc:
            log.warning("refresh of %s failed: %s", change.actuator, exc)
            return None
        if grown is None:
            return None
        unrecorded = self._record(journal_id, Outcome.APPLIED, note="refreshed", change=grown.to_dict())
        if unrecorded and self._undo_partial(act, grown):
            # what the journal cannot list is not left applied: the whole change is
            # undone, its entry stays open for the next start (reverting is idempotent)
            self.closed(journal_id)
            return StepResult(Outcome.REVERTED, grown, journal_id, f"grown, then undone: the journal could not "
                                                                    f"record it ({unrecorded})",
                              unrecorded=unrecorded)
        return StepResult(Outcome.APPLIED, grown, journal_id, unrecorded=unrecorded)

    def revert(self, change: Change, journal_id: str | None, mode: str) -> StepResult:
        if mode != "enforce":
            return StepResult(Outcome.WOULD_REVERT, change)
        act = self.registry.get(change.actuator)
        gone = self._gone(act, change, journal_id)
        if gone is not None:
            return gone
        try:
            self._retrying(act.revert, change)
        except ActuatorError as exc:
            return StepResult(Outcome.FAILED, change, journal_id, f"revert: {exc}")
        return StepResult(Outcome.REVERTED, change, journal_id, unrecorded=self._record(journal_id, Outcome.REVERTED))

    def revert_entry(self, entry: Entry) -> StepResult:
        """Revert a journaled change. One this node cannot revert (an actuator it
        lacks, a record its actuator cannot read) fails alone; the entry stays open."""
        change = Change.from_dict(entry.change)
        try:
            return self.revert(change, entry.id, "enforce")
        except PermanentActuatorError as exc:   # e.g. the actuator is not available here
            return StepResult(Outcome.FAILED, change, entry.id, str(exc))
        except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
            return StepResult(Outcome.FAILED, change, entry.id,
                              f"revert: the journaled change is not one {change.actuator} can read "
                              f"({type(exc).__name__}: {exc})")

    def resolve(self, notice: Change) -> StepResult:
        """Resolve an alert this controller raised (its condition cleared)."""
        try:
            self._retrying(self.registry.get(notice.actuator).revert, notice)
        except ActuatorError as exc:
            return StepResult(Outcome.FAILED, notice, error=f"resolve: {exc}")
        return StepResult(Outcome.RESOLVED, notice)

    def deliver_notices(self, within: float | None = None) -> bool:
        """Wait until the alerts sent so far (resolutions too) were delivered or
        given up, at most ``within`` seconds (None: the sender's ``deadline``;
        ``actuators/alert.py`` sends from a queue, a sender without one has
        nothing to wait for); whether they all were."""
        sender = self.registry.built("alert")
        flush = getattr(sender, "flush", None)
        return flush is None or flush(sender.deadline if within is None else min(within, sender.deadline))

    def release(self, journal_id: str | None, state: str) -> None:
        """Close a journal entry without reverting (``kept`` for rollback: never)."""
        self._record(journal_id, state)

    def slot_holders(self) -> set[str]:
        """The holders of the fleet slots of changes still open (applied):
        after a shutdown, those of the changes it leaves applied."""
        return set(self._slots.values())

    def hold_adopted(self, budgets: dict[str, tuple[BudgetSpec | None, str | None]]) -> list[tuple[Entry, str]]:
        """A fleet slot, past the queue, for each change a restart adopted
        (open in the journal, applied, ``on_restart: adopt``) that holds none:
        the bound counts what is applied, whoever applied it. ``budgets``:
        policy name -> (its own budget, the one job its selector names).
        Returns the entries left without one and why (the pool full, the store
        away); the next call asks again. Closing the entry gives the slot back."""
        if self.budget is None or self.journal is None:
            return []
        missed = []
        for entry in self.journal.open_entries():
            if entry.id in self._slots or entry.on_restart != "adopt" or entry.state != Outcome.APPLIED:
                continue
            spec, job = budgets.get(entry.policy, (None, None))
            if spec is None and not self.budget.limited:
                continue
            pool, holder = self._pool_and_holder(entry.policy, entry.rule, Change.from_dict(entry.change).target,
                                                 spec, job)
            try:
                self.budget.take(pool, holder, spec, ahead=True)
            except Refused as exc:
                missed.append((entry, str(exc)))
                continue
            self._slots[entry.id] = holder
        return missed

    def reconcile(self) -> list[tuple[str, StepResult]]:
        """Revert (or adopt) what a previous process left applied. Returns per entry."""
        if not self.journal:
            return []
        results = []
        for entry in self.journal.open_entries():
            if entry.on_restart == "adopt" and entry.state == Outcome.APPLIED:
                # stays open: ``rollback`` can still revert it, the next start adopts it again
                unrecorded = self._record(entry.id, Outcome.APPLIED, note="adopted by a restarted controller")
                results.append((entry.id, StepResult(Outcome.ADOPTED, Change.from_dict(entry.change), entry.id,
                                                     unrecorded=unrecorded)))
                continue
            results.append((entry.id, self.revert_entry(entry)))
        return results
