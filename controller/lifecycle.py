"""The lifecycle of one rule for one target, as a ``transitions`` state machine.

    ok -> pending -> firing -> acting -> verifying -> remediated -> cooldown -> ok
                                 |            |             \\-> recovering -> rolled_back -> cooldown
                                 |            \\-> recovering -> acting (escalate to the next action)
                                 \\-> escalated (an alert was raised) -> cooldown
    failure: acting/recovering -> failed -> cooldown

Triggers are queued (``queued=True``), so a trigger's return value says nothing
about its guard: the code reads ``state`` after a guarded trigger instead.

The same machine runs in every mode; only the actuator step differs (see
``executor.py``). ``step(now)`` reads the rule's conditions and fires at most a
few triggers; every state change is audited with its evidence.

Example::

    run = RuleRun(ctx, policy, rule, target_labels={"pid": "42"})
    run.step(now)          # evaluate, move, act
    run.state              # "firing", ...

Overhead: one evaluation of the rule's conditions per tick; a transition costs
~10 us in ``transitions``.
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

from transitions import Machine

from reflexarc.actuators.base import Change, Target

from .evaluate import Scope

log = logging.getLogger("reflexarc.lifecycle")

STATES = ("ok", "pending", "firing", "acting", "verifying", "remediated", "escalated",
          "recovering", "rolled_back", "failed", "cooldown")

TRANSITIONS = [
    {"trigger": "breach", "source": "ok", "dest": "pending"},
    {"trigger": "calm", "source": ["pending", "firing"], "dest": "ok"},
    {"trigger": "fire", "source": "pending", "dest": "firing", "conditions": "sustained"},
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
    {"trigger": "settle", "source": ["rolled_back", "failed"], "dest": "cooldown"},
    {"trigger": "cooled", "source": "cooldown", "dest": "ok", "conditions": "cooled_down"},
]


@dataclass
class ActiveChange:
    """A change this run made (or, outside enforce, would have made)."""

    step: int
    change: Change
    journal_id: str | None
    mode: str
    expires_at: float | None


class RuleRun:
    """Model object driven by the machine; ``ctx`` is the controller (services)."""

    def __init__(self, ctx, policy, rule, target_labels: dict) -> None:
        self.ctx, self.policy, self.rule = ctx, policy, rule
        self.labels = dict(target_labels)
        tkey = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items())) or "*"
        self.target_key = tkey
        self.scope = Scope(f"{policy.name}/{rule.name}/{tkey}", tuple(sorted(policy.selector.match.items())),
                           tuple(sorted(self.labels.items())))
        self.target = Target(self.labels, {**policy.selector.to_dict(), "policy": policy.name, "rule": rule.name})
        self.since = 0.0            # when the current state was entered
        self.breach_since = None    # first tick of the current breach
        self.clear_since = None     # first tick the condition was false after remediation
        self.step_index = 0
        self.acted_at = None
        self.changes: list[ActiveChange] = []
        self.notices: list[Change] = []   # alerts sent and not yet resolved
        self.action_times: deque[float] = deque()
        self.evidence: list[dict] = []
        self.now = 0.0
        self._limit_reason = None
        self.machine = Machine(model=self, states=list(STATES), transitions=TRANSITIONS, initial="ok",
                               auto_transitions=False, queued=True, send_event=True,
                               after_state_change="_on_change", on_exception="_on_exception")

    # --- mode --------------------------------------------------------------
    @property
    def mode(self) -> str:
        return self.ctx.mode_for(self.policy)

    # --- named conditions ------------------------------------------------------
    def sustained(self, event) -> bool:
        return self.breach_since is not None and self.now - self.breach_since >= self.rule.for_

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

    def cooled_down(self, event) -> bool:
        return self.now - self.since >= self.rule.cooldown

    # --- callbacks -------------------------------------------------------------
    def _on_change(self, event) -> None:
        frm, to = event.transition.source, event.transition.dest
        self.since = self.now
        self.ctx.transitioned(self, frm, to, event.event.name, event.kwargs.get("evidence", self.evidence),
                              event.kwargs.get("note", ""))

    def _on_exception(self, event) -> None:
        log.error("rule %s raised in %s: %s", self.scope.key, event.event.name, event.error)
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
        return self.ctx.node_refusal(self.now)

    # --- the loop ----------------------------------------------------------------
    def step(self, now: float) -> None:
        self.now = now
        ctx = self.ctx
        self._expire_changes(now)
        result, self.evidence = ctx.evaluator.evaluate(self.rule.when, self.scope, now)
        state = self.state
        if state in ("ok", "pending", "firing"):
            ctx.audit_eval(self, result)
        if state == "ok":
            ctx.evaluator.learn(self.scope, self.rule, now)
            if result:
                self.breach_since = now
                self.breach(evidence=self.evidence)
                state = self.state
        if state == "pending":
            if not result:
                self.breach_since = None
                self.calm(evidence=self.evidence)
            elif self.sustained(None):
                self.fire(evidence=self.evidence)
                state = self.state
        if state == "firing":
            if not result:
                self.breach_since = None
                self._limit_reason = None
                self.calm(evidence=self.evidence)
            else:
                self.act(evidence=self.evidence)   # guarded by within_limits
                if self.state == "acting":
                    self._limit_reason = None
                    self._run_action()
        elif state == "verifying":
            ok, ev = ctx.evaluator.evaluate(self.rule.verify.when, self.scope, now)
            ctx.audit_eval(self, ok, ev)
            if ok:
                self.verified(evidence=ev)
            elif now - self.acted_at >= self.rule.verify.timeout:
                self.verify_failed(evidence=ev, note=f"not verified within {self.rule.verify.timeout:g}s")
                self._recover("verify-failed")
        elif state in ("remediated", "escalated"):
            ctx.audit_eval(self, result)
            if result:
                self.clear_since = None
            else:
                self.clear_since = self.clear_since if self.clear_since is not None else now
                if now - self.clear_since >= self.rule.clear_for:
                    self.clear_since = None
                    self.clear(evidence=self.evidence)
                    self.ctx.resolve_notices(self)
                    if self.state == "recovering":
                        self._recover("clear")
        elif state == "cooldown":
            self.cooled()
        self.ctx.refresh_changes(self)

    def _run_action(self) -> None:
        action = self.rule.actions[self.step_index]
        spec = self.ctx.registry.spec(action.actuator)
        res = self.ctx.run_action(self, self.step_index, action)
        self.acted_at = self.now
        if res.notice is not None:
            self.notices.append(res.notice)
        if res.outcome in ("applied", "planned", "alerted", "noop") and spec.changes_system:
            self.action_times.append(self.now)
            if res.outcome != "noop":
                self._track(res)
            enforced = res.outcome == "applied" or (res.outcome == "noop" and self.mode == "enforce")
            self.applied(enforced=enforced, note=f"{action.actuator}: {res.outcome}")
        elif res.outcome in ("notified", "planned"):
            self.notified(note=f"{action.actuator}: {res.outcome}")
        else:
            self.act_failed(note=res.error or res.outcome)
            self._recover("act-failed")

    def _track(self, res) -> None:
        rb = self.rule.rollback
        expires = self.now + rb.ttl if (rb.ttl and "ttl" in rb.on) else None
        mode = "enforce" if res.outcome == "applied" else "dry-run"
        if rb.never and res.journal_id:
            self.ctx.executor.release(res.journal_id, "kept")
            self.ctx.audit_action(self, self.step_index, res.change, "kept", None, None)
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
