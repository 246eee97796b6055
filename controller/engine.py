"""The controller: evaluates every policy's rules each tick and drives their
lifecycles, with one journal, one audit log and node-wide limits.

It takes its clock from outside (simulated time in scenarios, wall time on
nodes) and its signals from the bus, so the same code runs both.

Example::

    ctl = Controller(policies, bus, registry, SimClock(), journal=None, audit=AuditLog(None, clock))
    ctl.start()                 # reconciles what a previous run left applied
    for t in range(600):
        clock.set(t); ctl.tick()
    ctl.shutdown()              # reverts what rules roll back on shutdown

Overhead: per tick, one evaluation per (rule, target); see ``lifecycle.py``.
"""
from __future__ import annotations

import logging

from reflexarc.actuators.base import EVIDENCE_PARAM, Registry

from .audit import AuditLog
from .bus import SignalBus
from .evaluate import Evaluator
from .executor import Executor, StepResult
from .journal import Journal
from .lifecycle import ActiveChange, RuleRun
from .limits import LimitSettings, NodeLimits
from .metrics import ControllerMetrics
from .policy.model import Policy

log = logging.getLogger("reflexarc.engine")


def describe_policies(policies: list[Policy]) -> list[dict]:
    out = []
    for p in policies:
        rules = []
        for r in p.rules:
            rb = r.rollback
            rb_text = "never" if rb.never else f"on {sorted(rb.on)}" + (f", ttl {rb.ttl:g}s" if rb.ttl else "")
            rules.append({"name": r.name, "conditions": [c.describe() for c in r.conditions()],
                          "actions": [a.actuator for a in r.actions],
                          "verify": (", ".join(c.describe() for c in _conds(r.verify.when))
                                     + f" within {r.verify.timeout:g}s") if r.verify else None,
                          "rollback": rb_text})
        out.append({"name": p.name, "mode": p.mode, "file": p.loc.file if p.loc else None, "rules": rules})
    return out


def _conds(expr):
    return expr.conditions() if hasattr(expr, "conditions") else [expr]


class Controller:
    def __init__(self, policies: list[Policy], bus: SignalBus, registry: Registry, clock, *,
                 mode_override: str | None = None, journal: Journal | None = None,
                 audit: AuditLog | None = None, metrics: ControllerMetrics | None = None,
                 limits: LimitSettings | None = None, real_sleep: bool = True) -> None:
        self.policies = policies
        self.bus = bus
        self.registry = registry
        self.clock = clock
        self.mode_override = mode_override
        self.journal = journal
        self.audit = audit or AuditLog(None, clock)
        self.metrics = metrics or ControllerMetrics()
        self.limits = NodeLimits(limits)
        self.evaluator = Evaluator(bus)
        self.executor = Executor(registry, journal, clock, real_sleep=real_sleep)
        self.runs: dict[tuple[str, str, str], RuleRun] = {}

    # --- life ----------------------------------------------------------------
    def start(self, source: str = "live", scenario: dict | None = None) -> list[tuple[str, StepResult]]:
        import datetime
        self.audit.write("run", source=source, mode_override=self.mode_override,
                         started_at=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                         policies=describe_policies(self.policies), scenario=scenario)
        results = self.executor.reconcile()
        for jid, res in results:
            self.audit.write("action", policy="", rule="", target=res.change.target.key() if res.change else "",
                             target_labels=res.change.target.labels if res.change else {}, mode="enforce",
                             step=None, actuator=res.change.actuator if res.change else None, params=None,
                             outcome=res.outcome, change=_change_view(res.change), journal_id=jid,
                             error=res.error, note="reconciled at start")
        if self.journal is not None:
            self.journal.compact()
        return results

    def tick(self, now: float | None = None) -> None:
        now = self.clock.now() if now is None else now
        self.metrics.kill_switch.set(1 if self.limits.kill_switch_engaged() else 0)
        for policy in self.policies:
            for rule in policy.rules:
                seen = {tuple(sorted(t.items())): t for t in
                        self.evaluator.targets(rule, policy.selector.match, now)}
                for key, run in list(self.runs.items()):
                    if key[0] == policy.name and key[1] == rule.name:
                        seen.setdefault(tuple(sorted(run.labels.items())), run.labels)
                for labels in seen.values():
                    self._run_for(policy, rule, labels).step(now)
        self.metrics.active.set(self.active_count())

    def _run_for(self, policy: Policy, rule, labels: dict) -> RuleRun:
        tkey = ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "*"
        key = (policy.name, rule.name, tkey)
        run = self.runs.get(key)
        if run is None:
            run = self.runs[key] = RuleRun(self, policy, rule, labels)
            self.metrics.state(policy.name, rule.name, tkey, "ok")
        return run

    def shutdown(self) -> None:
        """Revert what rules roll back on shutdown; leave the rest to the journal."""
        for run in self.runs.values():
            run.now = self.clock.now()
            if "shutdown" in run.rule.rollback.on:
                run.revert_all("shutdown")
        self.audit.write("end", summary=self.summary())
        self.registry.close()

    # --- services used by RuleRun ----------------------------------------------
    def mode_for(self, policy: Policy) -> str:
        return self.mode_override or policy.mode

    def active_count(self) -> int:
        return sum(len(r.changes) for r in self.runs.values())

    def node_refusal(self, now: float) -> str | None:
        return self.limits.refuse(now, self.active_count())

    def limited(self, run: RuleRun, reason: str) -> None:
        self.metrics.limited.labels(run.policy.name, run.rule.name, reason).inc()
        self.audit.write("limit", policy=run.policy.name, rule=run.rule.name, target=run.target_key, reason=reason)

    def transitioned(self, run: RuleRun, frm: str, to: str, trigger: str, evidence, note: str) -> None:
        self.metrics.state(run.policy.name, run.rule.name, run.target_key, to)
        self.metrics.transition(run.policy.name, run.rule.name, frm, to)
        self.audit.write("transition", policy=run.policy.name, rule=run.rule.name, target=run.target_key,
                         target_labels=run.labels, mode=run.mode, **{"from": frm}, to=to, trigger=trigger,
                         evidence=evidence, note=note)
        log.info("%s: %s -> %s (%s) %s", run.scope.key, frm, to, trigger, note)

    def audit_eval(self, run: RuleRun, result: bool, evidence=None) -> None:
        self.audit.eval(run.scope.key, run.state, result, policy=run.policy.name, rule=run.rule.name,
                        target=run.target_key, target_labels=run.labels,
                        values=evidence if evidence is not None else run.evidence)

    def audit_action(self, run: RuleRun, step, change, outcome: str, jid, error, mode: str | None = None) -> None:
        mode = mode or run.mode
        actuator = change.actuator if change else run.rule.actions[step].actuator
        self.metrics.action(run.policy.name, run.rule.name, actuator, mode, outcome)
        self.audit.write("action", policy=run.policy.name, rule=run.rule.name, target=run.target_key,
                         target_labels=run.labels, mode=mode, step=step, actuator=actuator,
                         params=change.params if change else run.rule.actions[step].params, outcome=outcome,
                         change=_change_view(change), journal_id=jid, error=error)

    def run_action(self, run: RuleRun, step: int, action) -> StepResult:
        mode = run.mode
        if mode == "enforce" and self.limits.kill_switch_engaged():
            self.limited(run, "kill_switch")
            mode = "dry-run"
        params = dict(action.params)
        if self.registry.spec(action.actuator).accepts_evidence:
            params[EVIDENCE_PARAM] = run.evidence   # notifications carry why they were sent
        res = self.executor.act(action.actuator, run.target, params, mode, run.policy.name,
                                run.rule.name, run.rule.rollback.on_restart)
        if res.outcome in ("applied", "planned", "alerted") and self.registry.spec(action.actuator).changes_system:
            self.limits.record(run.now)
        self.audit_action(run, step, res.change, res.outcome, res.journal_id, res.error, mode)
        return res

    def revert_change(self, run: RuleRun, ac: ActiveChange, why: str) -> bool:
        res = self.executor.revert(ac.change, ac.journal_id, ac.mode)
        self.audit_action(run, ac.step, ac.change, res.outcome, ac.journal_id,
                          res.error or None, ac.mode)
        return res.outcome != "failed"

    def refresh_changes(self, run: RuleRun) -> None:
        for ac in run.changes:
            if ac.mode == "enforce":
                grown = self.executor.refresh(ac.change, ac.journal_id)
                if grown is not None:
                    ac.change = grown
        for notice in run.notices:
            self.executor.refresh(notice, None)

    def resolve_notices(self, run: RuleRun) -> None:
        for notice in run.notices:
            res = self.executor.resolve(notice)
            self.audit_action(run, None, notice, res.outcome, None, res.error, "enforce")
        run.notices.clear()

    # --- reporting --------------------------------------------------------------
    def summary(self) -> dict:
        c = self.audit.counts
        outcomes = {k.split(":", 1)[1]: v for k, v in c.items() if k.startswith("outcome:")}
        return {"transitions": c.get("transition", 0), "actions": outcomes,
                "would_have_acted": outcomes.get("planned", 0) + outcomes.get("alerted", 0),
                "applied": outcomes.get("applied", 0), "reverted": outcomes.get("reverted", 0),
                "states": {"/".join(k): r.state for k, r in self.runs.items()}}


def _change_view(change) -> dict | None:
    if change is None:
        return None
    return {"before": change.before, "after": change.after, "summary": change.summary}
