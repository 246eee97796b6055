"""The lifecycle of one rule for one target, as a ``transitions`` state machine.

    ok -> pending -> firing -> acting -> verifying -> remediated -> cooldown -> ok
                                 |            |             \\-> recovering -> rolled_back -> cooldown
                                 |            \\-> recovering -> acting (escalate to the next action)
                                 \\-> escalated (an alert was raised) -> cooldown
                                 \\-> firing (the fleet budget refused it: tried again after BUDGET_RETRY_S)
    failure: acting/recovering -> failed -> cooldown
    any state -> failed (the run raised; see ``Controller.tick``)
    verifying/remediated/escalated/recovering -> cooldown (its target is gone)
    verifying/remediated/escalated -> recovering -> rolled_back -> cooldown (an operator rolled it back)

The machine holds state; the run decides; the controller carries it out.
``step(now, room)`` evaluates the rule's conditions from the target's cached
inputs, fires a trigger only when a state change is due (a guarded one only
after ``may_<trigger>()`` or its named condition said it passes), and yields
decisions (``decisions.py``): evaluations and transitions to audit, an action
to run, changes to revert, keep or refresh, alerts to resolve. The controller
sends back the results the run waits on (an action's, a revert's); the run
never calls it. What the node allows (a hold, its caps) comes in as ``room``,
a value; the mode, the actuators' specs and the node's tally of held changes
are given at construction.

The same machine runs in every mode; only the actuator step differs (see
``executor.py``). Every state change is audited with its evidence, built only then.

Example::

    run = RuleRun(policy, rule, targets, ("4242",), mode="enforce", registry=registry, held=Tally(),
                  min_history=60.0)
    for decision in run.step(now, room):    # Evaluated, Transitioned, Act ... (``Controller._drive``
        ...                                 # sends an Act's result back instead of iterating)
    run.state                               # "firing", ...

Overhead: a healthy tick is one cached evaluation per condition (see
``evaluate.py``), a few attribute reads and one ``Evaluated``; a transition
costs ~25 us in ``transitions``.
"""
from __future__ import annotations

import logging
from collections import deque

from transitions import Machine

from reflexarc.actuators.base import EVIDENCE_PARAM, Change, Registry, Target
from reflexarc.core.outcomes import TAKEN, Outcome

from ..policy.model import conditions_of
from .decisions import (Act, ActiveChange, Adopt, Decisions, Evaluated, Keep, Limited, Refresh, Resolve, Revert,
                        Transitioned, render_evidence)
from .changepoint import ChangeDetector
from .evaluate import OPS, Baseline, compile_expr
from .limits import Room
from .targets import RuleTargets

log = logging.getLogger("reflexarc.lifecycle")

STATES = ("ok", "pending", "firing", "acting", "verifying", "remediated", "escalated",
          "recovering", "rolled_back", "failed", "cooldown")
HOLDING = ("verifying", "remediated", "escalated", "recovering")   # states that may hold a change
FAILED_STATE = "failed"      # the state, spelled as Outcome.FAILED but not an outcome
BUDGET_RETRY_S = 10.0        # after the fleet budget refused a change, the run waits this long in firing
BUDGET_LIMIT = "fleet_budget"   # the limit's reason meanwhile

TRANSITIONS = [
    {"trigger": "breach", "source": "ok", "dest": "pending"},
    {"trigger": "calm", "source": ["pending", "firing"], "dest": "ok"},
    {"trigger": "fire", "source": "pending", "dest": "firing"},
    {"trigger": "act", "source": "firing", "dest": "acting", "conditions": "within_limits"},
    {"trigger": "applied", "source": "acting", "dest": "verifying", "conditions": "needs_verify"},
    {"trigger": "applied", "source": "acting", "dest": "remediated"},
    {"trigger": "notified", "source": "acting", "dest": "escalated"},
    {"trigger": "act_failed", "source": "acting", "dest": "recovering"},
    {"trigger": "refused", "source": "acting", "dest": "firing"},
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


class RuleRun:
    """Model object driven by the machine: one rule for one target."""

    def __init__(self, policy, rule, targets: RuleTargets, key: tuple = (), *, mode: str, registry: Registry,
                 held: Tally, min_history: float) -> None:
        self.policy, self.rule, self.mode = policy, rule, mode
        self.targets, self.key = targets, key
        self.labels = targets.labels(key)
        self.target_key = targets.key_text(key)
        self.scope_key = f"{policy.name}/{rule.name}/{self.target_key}"
        self.target = Target(self.labels, {**policy.selector.to_dict(), "policy": policy.name, "rule": rule.name})
        self._specs = [registry.spec(a.actuator) for a in rule.actions]
        conds = targets.conditions
        texts = [c.describe() for c in conds]
        self._when = compile_expr(rule.when, targets.index)
        self._verify = compile_expr(rule.verify.when, targets.index) if rule.verify else None
        self._when_idx = [targets.index[id(c)] for c in rule.conditions()]
        verify_idx = [targets.index[id(c)] for c in conditions_of(rule.verify.when if rule.verify else None)]
        self._shown_when = tuple((i, conds[i], texts[i]) for i in self._when_idx)
        self._shown_verify = tuple((i, conds[i], texts[i]) for i in verify_idx)
        self._baselines = {i: Baseline(c.baseline_window, min_history) for i, c in enumerate(conds) if c.relative}
        self._changes = {i: ChangeDetector(c.change, c.baseline_window, min_history)
                         for i, c in enumerate(conds) if c.change is not None}
        self._items: list[tuple | None] = [None] * len(conds)   # (value, threshold, baseline, ok[, extra]) each
        self.since = 0.0            # when the current state was entered
        self.breach_since = None    # first tick of the current breach
        self.clear_since = None     # first tick the condition was false after remediation
        self.step_index = 0
        self.acted_at = None
        self.refused_at = None      # when the fleet budget last refused this run's change
        self.changes = HeldChanges(held)
        self.notices: list[Change] = []   # alerts sent and not yet resolved
        self.action_times: deque[float] = deque()
        self.now = 0.0
        self.room = Room()          # what the node allowed at the start of the current step
        self._limit_reason = None
        self._no_data = False       # holding a change while the rule's signals are silent
        self._moved: deque[Transitioned] = deque()   # state changes not yet yielded
        self.machine = Machine(model=self, states=list(STATES), transitions=TRANSITIONS, initial="ok",
                               auto_transitions=False, send_event=True,
                               after_state_change="_on_change", on_exception="_on_exception")

    # --- evidence ------------------------------------------------------------------
    @property
    def evidence(self) -> list[dict]:
        """The ``when`` conditions as last evaluated: value, threshold, baseline, ok
        (and, for a change condition, where the change began)."""
        return render_evidence(self._shown_when, self._items)

    @property
    def verify_evidence(self) -> list[dict]:
        return render_evidence(self._shown_verify, self._items)

    def _evaluated(self, result: bool, verify: bool = False) -> Evaluated:
        return Evaluated(self.state, result, self._shown_verify if verify else self._shown_when, tuple(self._items))

    def last_seen(self) -> float:
        return self.targets.last_seen(self.key)

    # --- evaluation ---------------------------------------------------------------
    def _check(self, i: int, inputs, now: float) -> bool:
        cond = inputs[i].cond
        if cond.change is not None:     # learns while the rule is healthy
            item = self._changes[i].update(inputs[i].series, now, learning=self.state == "ok")
            self._items[i] = item
            return item[3]
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
        return self._refusal() is None

    def needs_verify(self, event) -> bool:
        return self.rule.verify is not None and event.kwargs.get("enforced", False)

    def can_escalate(self, event) -> bool:
        nxt = self.step_index + 1
        return self.rule.escalate and nxt < len(self.rule.actions) and self._refusal(nxt) is None

    def rollback_on_clear(self, event=None) -> bool:
        return "clear" in self.rule.rollback.on and bool(self.changes)

    # --- callbacks -------------------------------------------------------------
    def _on_change(self, event) -> None:
        self.since = self.now
        evidence = event.kwargs.get("evidence")
        self._moved.append(Transitioned(event.transition.source, event.transition.dest, event.event.name,
                                        self.evidence if evidence is None else evidence,
                                        event.kwargs.get("note", ""), self.mode))

    def _on_exception(self, event) -> None:
        log.error("rule %s raised in %s: %s", self.scope_key, event.event.name, event.error)
        raise event.error

    def _moves(self) -> Decisions:
        """The state changes the last trigger made, in order."""
        while self._moved:
            yield self._moved.popleft()

    # --- limits ------------------------------------------------------------------
    def _refusal(self, index: int | None = None) -> str | None:
        if not self._specs[self.step_index if index is None else index].changes_system:
            return None
        ml = self.rule.max_actions
        if ml:
            while self.action_times and self.action_times[0] <= self.now - ml.window:
                self.action_times.popleft()
            if len(self.action_times) >= ml.count:
                return "max_actions"
        if self.refused_at is not None and self.now - self.refused_at < BUDGET_RETRY_S:
            return BUDGET_LIMIT
        return self.room.refuse(self.mode, self.changes.tally.count)

    # --- the loop ----------------------------------------------------------------
    def retirable(self) -> bool:
        """Nothing held and nothing pending: the run may be dropped once its target is silent."""
        if self.changes or self.notices:
            return False
        return self.state == "ok" or (self.state == "cooldown" and self.now - self.since >= self.rule.cooldown)

    def step(self, now: float, room: Room) -> Decisions:
        """One tick: evaluate, move, and yield what the controller is to carry out."""
        self.now, self.room = now, room
        if self.changes:
            yield from self._expire_changes(now)
        inputs = self.targets.groups.get(self.key)
        if inputs is None:          # the target's series were dropped: no data
            inputs = self.targets.empty
        result = self._eval(self._when, inputs, now)
        state = self.state
        if state in ("ok", "pending", "firing"):
            yield self._evaluated(result)
        if state == "ok":
            self._learn(inputs, now)
            if not result:
                return
            self.breach_since = now
            self.breach()
            yield from self._moves()
            state = self.state
        if state == "pending":
            if not result:
                self.breach_since = None
                self.calm()
            elif now - self.breach_since >= self.rule.for_:
                self.fire()
            yield from self._moves()
            state = self.state
        if state == "firing":
            if not result:
                self.breach_since = None
                self._limit_reason = None
                self.step_index = 0     # an escalation the budget refused starts over at the next incident
                self.calm()
                yield from self._moves()
            else:
                reason = self._refusal()
                if reason and reason != self._limit_reason:
                    yield Limited(reason)
                self._limit_reason = reason
                if self.may_act():
                    self.act()
                    yield from self._moves()
                    yield from self._run_action()
        elif state == "verifying":
            ok = self._eval(self._verify, inputs, now)
            yield self._evaluated(ok, verify=True)
            if ok:
                self.verified(evidence=self.verify_evidence)
                yield from self._moves()
            elif now - self.acted_at >= self.rule.verify.timeout:
                self.verify_failed(evidence=self.verify_evidence,
                                   note=f"not verified within {self.rule.verify.timeout:g}s")
                yield from self._moves()
                yield from self._recover("verify-failed")
        elif state in ("remediated", "escalated"):
            yield self._evaluated(result)
            if result:
                self.clear_since = None
                self._no_data = False
            elif self._no_evidence():     # silence is not health: hold, say so once
                self.clear_since = None
                if not self._no_data:
                    self._no_data = True
                    yield Limited("no_data")
            else:
                self._no_data = False
                self.clear_since = self.clear_since if self.clear_since is not None else now
                if now - self.clear_since >= self.rule.clear_for:
                    self.clear_since = None
                    roll_back = self.rollback_on_clear()
                    self.clear()      # to recovering when it rolls back, else to cooldown
                    yield from self._moves()
                    yield from self._resolve()
                    if roll_back:
                        yield from self._recover("clear")
        elif state == "cooldown":
            if now - self.since >= self.rule.cooldown:
                self.cooled()
                yield from self._moves()
        elif state == FAILED_STATE:
            self.settle()
            yield from self._moves()
        if self.changes or self.notices:
            yield from self._refresh()

    def _run_action(self) -> Decisions:
        index = self.step_index
        action, spec = self.rule.actions[index], self._specs[index]
        mode = self.mode
        if mode == "enforce" and self.room.hold:    # e.g. an alert while held: planned, not sent
            yield Limited(self.room.hold)
            mode = "dry-run"
        params = dict(action.params)
        if spec.accepts_evidence:
            params[EVIDENCE_PARAM] = self.evidence   # notifications carry why they were sent
        res = yield Act(index, action, params, mode)
        self.acted_at = self.now
        if res.notice is not None:
            self.notices.append(res.notice)
        outcome = res.outcome
        if spec.changes_system and (outcome in TAKEN or outcome is Outcome.NOOP):
            self.action_times.append(self.now)
            if outcome is not Outcome.NOOP:
                yield from self._track(res)
            enforced = outcome is Outcome.APPLIED or (outcome is Outcome.NOOP and self.mode == "enforce")
            self.applied(enforced=enforced, note=f"{action.actuator}: {outcome}")
            yield from self._moves()
        elif outcome in (Outcome.NOTIFIED, Outcome.PLANNED):
            self.notified(note=f"{action.actuator}: {outcome}")
            yield from self._moves()
        elif outcome is Outcome.REFUSED:    # nothing applied: back to firing, another try after BUDGET_RETRY_S
            self.refused_at = self.now
            self.refused(note=f"{action.actuator}: refused by the fleet ({res.refused})")
            yield from self._moves()
        else:
            self.act_failed(note=res.error or outcome)
            yield from self._moves()
            yield from self._recover("act-failed")

    def _track(self, res) -> Decisions:
        rb = self.rule.rollback
        expires = self.now + rb.ttl if (rb.ttl and "ttl" in rb.on) else None
        mode = "enforce" if res.outcome is Outcome.APPLIED else "dry-run"
        ac = ActiveChange(self.step_index, res.change, res.journal_id, mode, expires)
        if rb.never and res.journal_id:
            yield Keep(ac)
            return
        self.changes.append(ac)

    def _recover(self, why: str) -> Decisions:
        """In ``recovering``: undo what the rollback policy says, then escalate or finish.

        ``why`` is ``verify-failed``, ``act-failed``, ``clear`` or ``ttl``."""
        failure = why in ("verify-failed", "act-failed")
        revert = why != "verify-failed" or "verify-failed" in self.rule.rollback.on
        if revert:
            yield from self._revert_all()
        if failure and self.may_escalate():
            self.escalate(note=f"{why}: escalating to action {self.step_index + 2}")
            yield from self._moves()
            self.step_index += 1
            yield from self._run_action()
            return
        self.step_index = 0
        if revert and self.changes:
            self.give_up(note="a revert failed; the journal keeps it for the next reconcile")
        elif failure and (why == "act-failed" or not revert):
            self.give_up(note=f"{why}; no action left" + ("" if revert else "; change kept by rollback policy"))
        else:
            self.reverted(note=why)
        yield from self._moves()
        self.settle()
        yield from self._moves()

    def _revert_all(self, note: str | None = None) -> Decisions:
        for ac in reversed(list(self.changes)):
            res = yield Revert(ac, note)
            if res.outcome is not Outcome.FAILED:
                self.changes.remove(ac)

    def _resolve(self) -> Decisions:
        notices, self.notices = tuple(self.notices), []
        if notices:
            yield Resolve(notices)

    def _refresh(self) -> Decisions:
        moved = yield Refresh(tuple(self.changes), tuple(self.notices))
        gone = []
        for ac, change in moved:
            if change is None:
                gone.append(ac)
            else:
                ac.change = change
        if gone:
            yield from self.target_gone(gone)

    def _expire_changes(self, now: float) -> Decisions:
        due = [ac for ac in self.changes if ac.expires_at is not None and now >= ac.expires_at]
        if not due:
            return
        if len(due) == len(self.changes) and self.may_expire():
            self.expire(note="ttl")
            yield from self._moves()
            yield from self._recover("ttl")
            return
        for ac in due:
            res = yield Revert(ac)
            if res.outcome is not Outcome.FAILED:
                self.changes.remove(ac)

    # --- what the controller asks besides a tick ---------------------------------
    def withdraw(self, ac: ActiveChange, note: str, now: float) -> Decisions:
        """An operator rolled ``ac`` back: revert it; once the run holds nothing,
        it goes the way of a rollback (recovering, rolled_back, then its cooldown)
        and its alerts are resolved. A failed revert leaves it held."""
        self.now = now
        res = yield Revert(ac, note)
        if res.outcome is Outcome.FAILED:
            return
        self.changes.remove(ac)
        if not self.changes and self.may_withdrawn():
            self.withdrawn(note=note)
            yield from self._moves()
            yield from self._resolve()
            self.step_index = 0
            self.reverted(note=note)
            yield from self._moves()
            self.settle()
            yield from self._moves()

    def target_gone(self, gone: list[ActiveChange]) -> Decisions:
        """Its target no longer exists: drop those changes; with nothing left, cool down."""
        for ac in gone:
            self.changes.remove(ac)
        if not self.changes and self.may_vanished():
            self.step_index = 0
            self.vanished(note="target gone")
            yield from self._moves()

    def shutdown(self, now: float) -> Decisions:
        """The controller stops: revert what the rule rolls back on shutdown (the
        journal keeps the rest) and resolve its alerts, unless it keeps them."""
        self.now = now
        if "shutdown" in self.rule.rollback.on:
            yield from self._revert_all()
        if self.rule.rollback.alerts != "keep":
            yield from self._resolve()

    def end(self, note: str, now: float) -> Decisions:
        """The rule was removed or changed: end as a restart without it would. Its
        changes are reverted if it rolls back on shutdown or reverts on restart,
        else (``on_restart: adopt``) left applied and journaled; its alerts are
        resolved. It holds nothing afterwards."""
        self.now = now
        rb = self.rule.rollback
        revert = "shutdown" in rb.on or rb.on_restart == "revert"
        for ac in reversed(list(self.changes)):
            if revert or ac.mode != "enforce":
                res = yield Revert(ac, note)
                if res.outcome is Outcome.FAILED:
                    log.error("%s: %s; the journal keeps the change for the next start or 'reflexarc "
                              "rollback'", self.scope_key, res.error)
            else:
                yield Adopt(ac, note)
            self.changes.remove(ac)
        yield from self._resolve()

    def crashed(self, note: str) -> Decisions:
        """The run raised: to ``failed`` (it then cools down and starts again)."""
        self._moved.clear()          # what the failed step had not yet said
        self.crash(note=note)
        yield from self._moves()
