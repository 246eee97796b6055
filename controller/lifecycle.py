"""The lifecycle of one rule for one target, as a ``transitions`` state machine.

    ok -> pending -> firing -> acting -> verifying -> remediated -> cooldown -> ok
                                 |            |             \\-> recovering -> rolled_back -> cooldown
                                 |            \\-> recovering -> acting (escalate to the next action)
                                 \\-> escalated (an alert was raised) -> cooldown
    failure: acting/recovering -> failed -> cooldown
    any state -> failed (the run raised; see ``Controller.tick``)
    verifying/remediated/escalated/recovering -> cooldown (its target is gone)
    verifying/remediated/escalated -> recovering -> rolled_back -> cooldown (an operator rolled it back)

The machine holds state; the code around it stays flat: time and data checks
are plain Python, and a trigger is fired only when a state change is due, so a
healthy tick costs no ``transitions`` call at all. Triggers are queued
(``queued=True``) so a callback may fire another one; the only guarded triggers
left (``act``, ``applied``, ``clear``, ``escalate``) are read back from
``state``.

The same machine runs in every mode; only the actuator step differs (see
``executor.py``). ``step(now)`` evaluates the rule's conditions from the
target's cached inputs and fires at most a few triggers; every state change is
audited with its evidence, built only then.

Example::

    run = RuleRun(ctx, policy, rule, targets, key=("4242",))
    run.step(now)          # evaluate, move, act
    run.state              # "firing", ...

Overhead: a healthy tick is one cached evaluation per condition (see
``evaluate.py``) and a few attribute reads; a transition costs ~25 us in
``transitions``.
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from transitions import Machine

from reflexarc.actuators.base import Change, Target
from reflexarc.core.outcomes import TAKEN, Outcome

from .evaluate import OPS, Baseline, compile_expr, conditions_of, evidence_item
from .targets import RuleTargets

log = logging.getLogger("reflexarc.lifecycle")

STATES = ("ok", "pending", "firing", "acting", "verifying", "remediated", "escalated",
          "recovering", "rolled_back", "failed", "cooldown")
HOLDING = ("verifying", "remediated", "escalated", "recovering")   # states that may hold a change

TRANSITIONS = [
    {"trigger": "breach", "source": "ok", "dest": "pending"},
    {"trigger": "calm", "source": ["pending", "firing"], "dest": "ok"},
    {"trigger": "fire", "source": "pending", "dest": "firing"},
    {"trigger": "act", "source": "firing", "dest": "acting", "conditions": "within_limits"},
    {"trigger": "applied", "source": "acting", "dest": "verifying", "conditions": "needs_verify"},
    {"trigger": "applied", "source": "acting", "dest": "remediated"},
    {"trigger": "notified", "source": "acting", "dest": "escalated"},
    {"trigger": "act_failed", "source": "acting", "dest": "recovering"},
    {"trigger": "verified", "source": "verifying", "dest": "remediated"},
    {"trigger": "verify_failed", "source": "verifying", "dest": "recovering"},
    {"trigger": "escalate", "source": "recovering", "dest": "acting", "conditions": "can_escalate"},
    {"trigger": "reverted", "source": "recovering", "dest": "rolled_back"},
    {"trigger": "give_up", "source": ["acting", "recovering"], "dest": "failed"},
    {"trigger": "clear", "source": ["remediated", "escalated"], "dest": "recovering",
     "conditions": "rollback_on_clear"},
    {"trigger": "clear", "source": ["remediated", "escalated"], "dest": "cooldown"},
    {"trigger": "expire", "source": "remediated", "dest": "recovering"},
    {"trigger": "vanished", "source": list(HOLDING), "dest": "cooldown"},
    {"trigger": "withdrawn", "source": ["verifying", "remediated", "escalated"], "dest": "recovering"},
    {"trigger": "settle", "source": ["rolled_back", "failed"], "dest": "cooldown"},
    {"trigger": "cooled", "source": "cooldown", "dest": "ok"},
    {"trigger": "crash", "source": "*", "dest": "failed"},
]


@dataclass
class ActiveChange:
    """A change this run made (or, outside enforce, would have made)."""

    step: int
    change: Change
    journal_id: str | None
    mode: str
    expires_at: float | None


class Tally:
    """How many changes all runs hold: the node's active remediations, kept
    current as changes come and go instead of counted over every run."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


class HeldChanges(list):
    """A run's active changes; adding or removing one updates the shared tally."""

    def __init__(self, tally: Tally) -> None:
        super().__init__()
        self.tally = tally

    def append(self, ac: ActiveChange) -> None:
        super().append(ac)
        self.tally.count += 1

    def remove(self, ac: ActiveChange) -> None:
        super().remove(ac)
        self.tally.count -= 1


class Services(Protocol):
    """What a run asks of the controller that drives it."""

    registry: object
    executor: object
    min_history: float          # seconds of healthy history before a baseline counts
    held: Tally                 # changes held by all runs

    def mode_for(self, policy) -> str: ...
    def node_refusal(self, now: float, mode: str = "enforce") -> str | None: ...
    def limited(self, run: "RuleRun", reason: str) -> None: ...
    def transitioned(self, run: "RuleRun", frm: str, to: str, trigger: str, evidence, note: str) -> None: ...
    def audit_eval(self, run: "RuleRun", result: bool, verify: bool = False) -> None: ...
    def audit_action(self, run: "RuleRun", step, change, outcome: str, jid, error, mode: str | None = None) -> None: ...
    def run_action(self, run: "RuleRun", step: int, action): ...
    def revert_change(self, run: "RuleRun", ac: ActiveChange, why: str, note: str | None = None) -> bool: ...
    def refresh_changes(self, run: "RuleRun") -> None: ...
    def resolve_notices(self, run: "RuleRun") -> None: ...


class RuleRun:
    """Model object driven by the machine; ``ctx`` provides the services."""

    def __init__(self, ctx: Services, policy, rule, targets: RuleTargets, key: tuple = ()) -> None:
        self.ctx, self.policy, self.rule = ctx, policy, rule
        self.targets, self.key = targets, key
        self.labels = targets.labels(key)
        self.target_key = targets.key_text(key)
        self.scope_key = f"{policy.name}/{rule.name}/{self.target_key}"
        self.target = Target(self.labels, {**policy.selector.to_dict(), "policy": policy.name, "rule": rule.name})
        conds = targets.conditions
        self._when = compile_expr(rule.when, targets.index)
        self._verify = compile_expr(rule.verify.when, targets.index) if rule.verify else None
        self._when_idx = [targets.index[id(c)] for c in rule.conditions()]
        self._verify_idx = [targets.index[id(c)] for c in conditions_of(rule.verify.when if rule.verify else None)]
        self._texts = [c.describe() for c in conds]
        self._baselines = {i: Baseline(c.baseline_window, ctx.min_history) for i, c in enumerate(conds) if c.relative}
        self._items: list[tuple | None] = [None] * len(conds)   # (value, threshold, baseline, ok) per condition
        self.since = 0.0            # when the current state was entered
        self.breach_since = None    # first tick of the current breach
        self.clear_since = None     # first tick the condition was false after remediation
        self.step_index = 0
        self.acted_at = None
        self.changes = HeldChanges(ctx.held)
        self.notices: list[Change] = []   # alerts sent and not yet resolved
        self.action_times: deque[float] = deque()
        self.now = 0.0
        self._limit_reason = None
        self._no_data = False       # holding a change while the rule's signals are silent
        self.machine = Machine(model=self, states=list(STATES), transitions=TRANSITIONS, initial="ok",
                               auto_transitions=False, queued=True, send_event=True,
                               after_state_change="_on_change", on_exception="_on_exception")

    # --- mode and evidence ------------------------------------------------------
    @property
    def mode(self) -> str:
        return self.ctx.mode_for(self.policy)

    def _evidence(self, indices: list[int]) -> list[dict]:
        conds = self.targets.conditions
        out = []
        for i in indices:
            item = self._items[i]
            if item is not None:
                out.append(evidence_item(conds[i], self._texts[i], *item))
        return out

    @property
    def evidence(self) -> list[dict]:
        """The ``when`` conditions as last evaluated: value, threshold, baseline, ok."""
        return self._evidence(self._when_idx)

    @property
    def verify_evidence(self) -> list[dict]:
        return self._evidence(self._verify_idx)

    def last_seen(self) -> float:
        return self.targets.last_seen(self.key)

    # --- evaluation ---------------------------------------------------------------
    def _check(self, i: int, inputs, now: float) -> bool:
        cond = inputs[i].cond
        value = inputs[i].value(now)
        if cond.relative:
            baseline = self._baselines[i].median(now)
            threshold = cond.threshold * baseline if baseline is not None else None
        else:
            baseline, threshold = None, cond.threshold
        ok = value is not None and threshold is not None and OPS[cond.op](value, threshold)
        self._items[i] = (value, threshold, baseline, ok)
        return ok

    def _eval(self, expr, inputs, now: float) -> bool:
        if isinstance(expr, int):
            return self._check(expr, inputs, now)
        results = [self._eval(sub, inputs, now) for sub in expr[1]]   # every item, for the evidence
        return all(results) if expr[0] else any(results)

    def _learn(self, inputs, now: float) -> None:
        """Record healthy values of every relative condition (``when`` and ``verify``)."""
        for i, base in self._baselines.items():
            value = inputs[i].value(now)
            if value is not None:
                base.add(now, value)

    # --- named conditions ------------------------------------------------------
    def _no_evidence(self) -> bool:
        """None of the ``when`` conditions had a value at the last evaluation."""
        return all(self._items[i] is None or self._items[i][0] is None for i in self._when_idx)

    def within_limits(self, event) -> bool:
        reason = self._refusal()
        if reason and reason != self._limit_reason:
            self.ctx.limited(self, reason)
        self._limit_reason = reason
        return reason is None

    def needs_verify(self, event) -> bool:
        return self.rule.verify is not None and event.kwargs.get("enforced", False)

    def can_escalate(self, event) -> bool:
        nxt = self.step_index + 1
        return self.rule.escalate and nxt < len(self.rule.actions) and self._refusal(nxt) is None

    def rollback_on_clear(self, event) -> bool:
        return "clear" in self.rule.rollback.on and bool(self.changes)

    # --- callbacks -------------------------------------------------------------
    def _on_change(self, event) -> None:
        frm, to = event.transition.source, event.transition.dest
        self.since = self.now
        evidence = event.kwargs.get("evidence")
        self.ctx.transitioned(self, frm, to, event.event.name, self.evidence if evidence is None else evidence,
                              event.kwargs.get("note", ""))

    def _on_exception(self, event) -> None:
        log.error("rule %s raised in %s: %s", self.scope_key, event.event.name, event.error)
        raise event.error

    # --- limits ------------------------------------------------------------------
    def _refusal(self, index: int | None = None) -> str | None:
        action = self.rule.actions[self.step_index if index is None else index]
        if not self.ctx.registry.spec(action.actuator).changes_system:
            return None
        ml = self.rule.max_actions
        if ml:
            while self.action_times and self.action_times[0] <= self.now - ml.window:
                self.action_times.popleft()
            if len(self.action_times) >= ml.count:
                return "max_actions"
        return self.ctx.node_refusal(self.now, self.mode)

    # --- the loop ----------------------------------------------------------------
    def retirable(self) -> bool:
        """Nothing held and nothing pending: the run may be dropped once its target is silent."""
        if self.changes or self.notices:
            return False
        return self.state == "ok" or (self.state == "cooldown" and self.now - self.since >= self.rule.cooldown)

    def step(self, now: float) -> None:
        self.now = now
        ctx = self.ctx
        if self.changes:
            self._expire_changes(now)
        inputs = self.targets.groups.get(self.key)
        if inputs is None:          # the target's series were dropped: no data
            inputs = self.targets.empty
        result = self._eval(self._when, inputs, now)
        state = self.state
        if state in ("ok", "pending", "firing"):
            ctx.audit_eval(self, result)
        if state == "ok":
            self._learn(inputs, now)
            if not result:
                return
            self.breach_since = now
            self.breach()
            state = self.state
        if state == "pending":
            if not result:
                self.breach_since = None
                self.calm()
            elif now - self.breach_since >= self.rule.for_:
                self.fire()
                state = self.state
        if state == "firing":
            if not result:
                self.breach_since = None
                self._limit_reason = None
                self.calm()
            else:
                self.act()   # guarded by within_limits
                if self.state == "acting":
                    self._limit_reason = None
                    self._run_action()
        elif state == "verifying":
            ok = self._eval(self._verify, inputs, now)
            ctx.audit_eval(self, ok, verify=True)
            if ok:
                self.verified(evidence=self.verify_evidence)
            elif now - self.acted_at >= self.rule.verify.timeout:
                self.verify_failed(evidence=self.verify_evidence,
                                   note=f"not verified within {self.rule.verify.timeout:g}s")
                self._recover("verify-failed")
        elif state in ("remediated", "escalated"):
            ctx.audit_eval(self, result)
            if result:
                self.clear_since = None
                self._no_data = False
            elif self._no_evidence():     # silence is not health: hold, say so once
                self.clear_since = None
                if not self._no_data:
                    self._no_data = True
                    ctx.limited(self, "no_data")
            else:
                self._no_data = False
                self.clear_since = self.clear_since if self.clear_since is not None else now
                if now - self.clear_since >= self.rule.clear_for:
                    self.clear_since = None
                    self.clear()
                    ctx.resolve_notices(self)
                    if self.state == "recovering":
                        self._recover("clear")
        elif state == "cooldown":
            if now - self.since >= self.rule.cooldown:
                self.cooled()
        elif state == "failed":
            self.settle()
        if self.changes or self.notices:
            ctx.refresh_changes(self)

    def _run_action(self) -> None:
        action = self.rule.actions[self.step_index]
        spec = self.ctx.registry.spec(action.actuator)
        res = self.ctx.run_action(self, self.step_index, action)
        self.acted_at = self.now
        if res.notice is not None:
            self.notices.append(res.notice)
        outcome = res.outcome
        if spec.changes_system and (outcome in TAKEN or outcome is Outcome.NOOP):
            self.action_times.append(self.now)
            if outcome is not Outcome.NOOP:
                self._track(res)
            enforced = outcome is Outcome.APPLIED or (outcome is Outcome.NOOP and self.mode == "enforce")
            self.applied(enforced=enforced, note=f"{action.actuator}: {outcome}")
        elif outcome in (Outcome.NOTIFIED, Outcome.PLANNED):
            self.notified(note=f"{action.actuator}: {outcome}")
        else:
            self.act_failed(note=res.error or outcome)
            self._recover("act-failed")

    def _track(self, res) -> None:
        rb = self.rule.rollback
        expires = self.now + rb.ttl if (rb.ttl and "ttl" in rb.on) else None
        mode = "enforce" if res.outcome is Outcome.APPLIED else "dry-run"
        if rb.never and res.journal_id:
            self.ctx.executor.release(res.journal_id, Outcome.KEPT)
            self.ctx.audit_action(self, self.step_index, res.change, Outcome.KEPT, None, None)
            return
        self.changes.append(ActiveChange(self.step_index, res.change, res.journal_id, mode, expires))

    def _recover(self, why: str) -> None:
        """In ``recovering``: undo what the rollback policy says, then escalate or finish.

        ``why`` is ``verify-failed``, ``act-failed``, ``clear`` or ``ttl``."""
        failure = why in ("verify-failed", "act-failed")
        revert = why != "verify-failed" or "verify-failed" in self.rule.rollback.on
        if revert:
            self.revert_all(why)
        if failure:
            self.escalate(note=f"{why}: escalating to action {self.step_index + 2}")  # guarded by can_escalate
        if self.state == "acting":
            self.step_index += 1
            self._run_action()
            return
        self.step_index = 0
        if revert and self.changes:
            self.give_up(note="a revert failed; the journal keeps it for the next reconcile")
        elif failure and (why == "act-failed" or not revert):
            self.give_up(note=f"{why}; no action left" + ("" if revert else "; change kept by rollback policy"))
        else:
            self.reverted(note=why)
        self.settle()

    def revert_all(self, why: str) -> None:
        for ac in reversed(list(self.changes)):
            if self.ctx.revert_change(self, ac, why):
                self.changes.remove(ac)

    def withdraw(self, ac: ActiveChange, note: str) -> bool:
        """An operator rolled ``ac`` back: revert it; once the run holds nothing,
        it goes the way of a rollback (recovering, rolled_back, then its cooldown)
        and its alerts are resolved. False when the revert failed (it stays held)."""
        if not self.ctx.revert_change(self, ac, "operator", note=note):
            return False
        self.changes.remove(ac)
        if not self.changes and self.may_withdrawn():
            self.withdrawn(note=note)
            self.ctx.resolve_notices(self)
            self.step_index = 0
            self.reverted(note=note)
            self.settle()
        return True

    def target_gone(self, gone: list[ActiveChange]) -> None:
        """Its target no longer exists: drop those changes; with nothing left, cool down."""
        for ac in gone:
            self.changes.remove(ac)
        if not self.changes and self.state in HOLDING:
            self.step_index = 0
            self.vanished(note="target gone")

    def _expire_changes(self, now: float) -> None:
        due = [ac for ac in self.changes if ac.expires_at is not None and now >= ac.expires_at]
        if not due:
            return
        if self.state == "remediated" and len(due) == len(self.changes):
            self.expire(note="ttl")
            self._recover("ttl")
            return
        for ac in due:
            if self.ctx.revert_change(self, ac, "ttl"):
                self.changes.remove(ac)
