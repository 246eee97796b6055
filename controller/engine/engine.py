"""The controller: evaluates every policy's rules each tick and drives their
lifecycles, with one journal, one audit log and node-wide limits.

It takes its clock from outside (simulated time in scenarios, wall time on
nodes) and its signals from the bus, so the same code runs both.

Targets come and go: a rule's targets are resolved from the bus only when a
series of its signals appears or is dropped (``targets.RuleTargets``); a run
whose target fell silent is retired ``target_grace`` seconds after its
longest window, once it holds nothing (state ``ok``, or ``cooldown`` served),
and its metric series go with it. A change whose target no longer exists
(every process it pinned exited) closes its journal entry as ``target-gone``.
Memory and CPU follow the live targets, not history.

With a fleet budget (``budget=``, ``controller/fleet/budget.py``), an enforce
change first takes a slot of its policy's pool; a refusal is audited as an
``action`` with the outcome ``refused``, counted in
``reflexarc_budget_refused_total{reason}``, and the run waits in ``firing``
(``lifecycle.BUDGET_RETRY_S``) before it tries again. Changes already applied
go on under their own rollback rules whatever the store does.

A policy with a rollout (``rollout=``, ``controller/fleet/rollout.py``) is
admitted stage by stage the same way (refusals ``rollout-stage``,
``breaker-open``). The controller reports each verify outcome of an enforced
change (the transitions ``verified`` and ``verify_failed``) to the rollout;
a stage that widens or a breaker that opens is audited (a ``rollout``
record), shown in ``reflexarc_rollout_stage`` and
``reflexarc_rollout_breaker_open``, and an opened breaker raises a critical
alert from the node whose failure opened it.

Each run decides and the controller carries it out: a run's entry points
(``RuleRun.step`` and the others) yield decisions (``decisions.py``) that
``_drive`` audits, counts and acts on, sending back the results the run waits
on; the run never calls the controller.

One run's unexpected error never stops the others: it is logged with its
traceback, audited, counted in ``reflexarc_rule_errors_total``, and that run
goes to ``failed`` (then cools down and starts again).

The policy set can be swapped while running (``replace_policies``, driven by
``reload.py``). A rule is the same rule when its policy name, its name and the
digest of its definition (``rule_digest``: the rule, its policy's selector and
the mode it runs in, not where it is written) are: it keeps its slot, so its
pending timers, active changes and cooldowns go on. The runs of every other
old rule end as a restart without that rule would end them (``_end``).

Example::

    ctl = Controller(policies, bus, registry, SimClock(), journal=None, audit=AuditLog(None, clock))
    ctl.start()                 # reconciles what a previous run left applied
    for t in range(600):
        clock.set(t); ctl.tick()
    swap = ctl.replace_policies(new_policies, reason="SIGHUP")   # between two ticks
    ctl.shutdown()              # reverts what rules roll back on shutdown

Overhead: per tick and rule, one generation check per signal; per target, one
cached evaluation (``lifecycle.py``); every ``HOUSEKEEPING_EVERY`` seconds, a
pass over the targets for new and silent ones and over the bus for dead series.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import math
import threading

from reflexarc.actuators.base import Change, Registry, Target
from reflexarc.core.outcomes import TAKEN, Outcome
from reflexarc.core.rollout import RolloutSpec

from ..fleet.budget import FleetBudget
from ..fleet.rollout import Event, FleetRollout
from ..policy.model import Policy, Rule, conditions_of, when_tree
from .audit import AuditLog
from .bus import SignalBus
from .decisions import (Act, ActiveChange, Adopt, Decision, Decisions, Evaluated, Keep, Limited, Refresh, Resolve,
                        Revert, Transitioned)
from .executor import Executor, StepResult
from .journal import Journal
from .lifecycle import FAILED_STATE, RuleRun, Tally
from .limits import LimitSettings, NodeLimits, Pause, Room
from .metrics import ControllerMetrics
from .targets import RuleTargets

log = logging.getLogger("reflexarc.engine")

HOUSEKEEPING_EVERY = 5.0     # seconds between passes for new, silent and dead targets
STOP_CHUNK = 256             # rule runs stepped or started between two looks at the stop event
DRIFT_EVERY = 60.0           # seconds between two read-backs of the journal's open changes
STOP_DELIVERY = 0.8          # seconds the stop waits for queued alerts (resolutions) to be delivered: with
                             # the sender's own close, SIGTERM to exit stays under 2 s whatever a receiver does


def describe_policies(policies: list[Policy]) -> list[dict]:
    out = []
    for p in policies:
        rules = []
        for r in p.rules:
            rb = r.rollback
            rb_text = "never" if rb.never else f"on {sorted(rb.on)}" + (f", ttl {rb.ttl:g}s" if rb.ttl else "")
            verify = None
            if r.verify:
                verify = (", ".join(c.describe() for c in conditions_of(r.verify.when))
                          + f" within {r.verify.timeout:g}s")
            rules.append({"name": r.name, "conditions": [c.describe() for c in r.conditions()],
                          "when": when_tree(r.when), "verify_when": when_tree(r.verify.when) if r.verify else None,
                          "actions": [a.actuator for a in r.actions], "verify": verify, "rollback": rb_text})
        job = p.selector.one_job()
        out.append({"name": p.name, "mode": p.mode, "file": p.loc.file if p.loc else None, "rules": rules,
                    **({"job": job} if job else {}),
                    **({"rollout": p.rollout.to_dict()} if p.rollout else {}),
                    **({"budget": p.budget.to_dict()} if p.budget else {})})
    return out


def rule_digest(policy: Policy, rule: Rule, mode: str) -> str:
    """What a rule does, as a digest: its definition, its policy's selector and
    the mode it runs in; not where it is written (locations, comments, the file
    or the order of files and rules) nor its policy's description."""
    text = json.dumps([_plain(rule), _plain(policy.selector), mode], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def policy_version(policy: Policy) -> str:
    """What a policy enforces across a fleet, as a digest: its rules'
    definitions and its rollout, not its selector (each node may adapt it:
    interfaces, netns), nor locations and comments; a changed policy is a new
    version, whose fleet rollout starts over."""
    assert policy.rollout is not None
    text = json.dumps([[_plain(r) for r in policy.rules], policy.rollout.to_dict()], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def rollout_specs(policies: list[Policy]) -> dict[str, RolloutSpec]:
    """Each policy's rollout, carrying the policy's version."""
    return {p.name: dataclasses.replace(p.rollout, version=policy_version(p))
            for p in policies if p.rollout is not None}


def _plain(value):
    """``value`` as plain JSON data, without source locations."""
    if dataclasses.is_dataclass(value):
        return {"type": type(value).__name__, **{f.name: _plain(getattr(value, f.name))
                                                 for f in dataclasses.fields(value) if f.name != "loc"}}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=repr)
    return value


@dataclasses.dataclass(frozen=True)
class PolicySwap:
    """What ``replace_policies`` did: policies by name, rules as ``policy/rule``."""

    added: tuple[str, ...]          # policies new to the set
    removed: tuple[str, ...]        # policies no longer in it
    changed: tuple[str, ...]        # policies in both with a rule added, removed or changed
    kept_rules: tuple[str, ...]     # rules that kept their state
    ended_rules: tuple[str, ...]    # rules removed or changed: their runs ended
    ended_changes: tuple[Outcome, ...]   # what became of those runs' changes: reverted, adopted, ...

    @property
    def unchanged(self) -> bool:
        return not (self.added or self.removed or self.changed)


class RuleSlot:
    """One rule of one policy: its targets on the bus and its runs by target;
    ``identity`` (policy, rule, ``rule_digest``) says whether a reload keeps it."""

    def __init__(self, bus: SignalBus, policy: Policy, rule: Rule, identity: tuple[str, str, str]) -> None:
        self.policy, self.rule, self.identity = policy, rule, identity
        self.targets = RuleTargets(bus, policy, rule)
        self.runs: dict[tuple, RuleRun] = {}
        self.retire_after = max((c.window for c in rule.conditions()), default=0.0)


class Controller:
    def __init__(self, policies: list[Policy], bus: SignalBus, registry: Registry, clock, *,
                 mode_override: str | None = None, journal: Journal | None = None,
                 audit: AuditLog | None = None, metrics: ControllerMetrics | None = None,
                 limits: LimitSettings | None = None, real_sleep: bool = True,
                 target_grace: float = 60.0, min_history: float = 60.0,
                 budget: FleetBudget | None = None, rollout: FleetRollout | None = None) -> None:
        self.policies = policies
        self.bus = bus
        self.registry = registry
        self.clock = clock
        self.mode_override = mode_override
        self.journal = journal
        self.audit = audit or AuditLog(None, clock)
        self.metrics = metrics or ControllerMetrics()
        self.limits = NodeLimits(limits)
        self.budget = budget
        self.rollout = rollout
        self.rollouts = rollout_specs(policies)
        self.executor = Executor(registry, journal, clock, real_sleep=real_sleep, budget=budget, rollout=rollout)
        self.target_grace = target_grace
        self.min_history = min_history
        self.held = Tally()
        self.slots = [RuleSlot(bus, p, r, self._identity(p, r)) for p in policies for r in p.rules]
        self.runs: dict[tuple[str, str, str], RuleRun] = {}
        self._housekept = -math.inf
        self._drift_checked = -math.inf
        self.drifted: dict[str, str] = {}   # journal id -> what differs, as last read back
        self.unslotted: set[str] = set()    # adopted changes the fleet budget has no slot for yet (said once)
        self._switch = False         # the kill switch as last seen
        self.hold: str | None = None  # why enforcement is held ("kill_switch", "paused"), as of this tick
        self._room = Room()          # what the node leaves to a new change: the hold and the caps, this tick

    # --- life ----------------------------------------------------------------
    def start(self, source: str = "live", scenario: dict | None = None,
              reconciled: list[tuple[str, StepResult]] | None = None,
              node: str | None = None) -> list[tuple[str, StepResult]]:
        """Reconcile what a previous process left applied (unless the caller did,
        first thing, and passes its ``reconciled`` results), then audit the run
        (``node``: the node it runs on, for reports across nodes) and the
        reconcile: an audit that cannot be written never keeps the journal
        from being reconciled."""
        if reconciled is None:
            reconciled = self.executor.reconcile()
            if self.journal is not None:
                self.journal.compact()
        self.audit.write("run", source=source, node=node, mode_override=self.mode_override,
                         started_at=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                         policies=describe_policies(self.policies), scenario=scenario)
        for jid, res in reconciled:
            change = res.change
            self.audit.write("action", policy=change.target.selector.get("policy", "") if change else "",
                             rule=change.target.selector.get("rule", "") if change else "",
                             target=change.target.key() if change else "",
                             target_labels=change.target.labels if change else {}, mode="enforce",
                             step=None, actuator=change.actuator if change else None, params=None,
                             outcome=res.outcome, change=_change_view(change), journal_id=jid,
                             error=res.error, note="reconciled at start")
        self._prepare_actuators(self._enforced_actuators())
        return reconciled

    def _enforced_actuators(self) -> set[str]:
        return {a.actuator for p in self.policies if self.mode_for(p) == "enforce" for r in p.rules for a in r.actions}

    def _prepare_actuators(self, names: set[str]) -> None:
        """Ready the actuators that enforcing policies use, so the first incident
        does not wait for a compile; a failure here is left for that action to report."""
        for name in sorted(names):
            try:
                self.registry.get(name).prepare()
            except Exception as exc:  # noqa: BLE001 - the first action says what is wrong
                log.warning("actuator %s not prepared: %s", name, exc)

    def tick(self, now: float | None = None, stop: threading.Event | None = None) -> None:
        """One pass over every rule; with ``stop`` (a ``threading.Event``), it
        returns early once that is set, looking every ``STOP_CHUNK`` runs."""
        now = self.clock.now() if now is None else now
        self._watch_hold(now)
        self._room = self.limits.room(now, self.hold)
        housekeeping = now - self._housekept >= HOUSEKEEPING_EVERY
        if housekeeping:
            self._housekept = now
            if self.rollout is not None and self.rollout.pending:     # outcomes the store did not take yet
                self._rollout_events(self.rollout.flush())
            if self.budget is not None:
                self._hold_adopted()
            self.bus.expire(now)
            self.metrics.bus_series.set(self.bus.series_count())
        if self.journal is not None and now - self._drift_checked >= DRIFT_EVERY:
            self._drift_checked = now
            self.check_drift()
        for slot in self.slots:
            if not self._step_slot(slot, now, stop, housekeeping):
                return
        self.metrics.active.set(self.active_count())
        self.metrics.targets.set(len(self.runs))

    def arrived(self, now: float, signals: set[str], stop: threading.Event | None = None) -> int:
        """Between two ticks, new samples of ``signals`` arrived: step the
        rules that read one of them, as a tick would (the kill switch and the
        limits looked at first), and no other. Returns the rules stepped."""
        slots = [slot for slot in self.slots if not signals.isdisjoint(slot.targets.signals)]
        if not slots:
            return 0
        self._watch_hold(now)
        self._room = self.limits.room(now, self.hold)
        for slot in slots:
            if not self._step_slot(slot, now, stop, False):
                break
        self.metrics.active.set(self.active_count())
        return len(slots)

    def _step_slot(self, slot: RuleSlot, now: float, stop: threading.Event | None, sync: bool) -> bool:
        """Step every run of ``slot`` (its targets synced first where they
        changed, or with ``sync``); False once ``stop`` is set."""
        try:
            if slot.targets.resolve_if_changed() or sync:
                self._sync(slot, now, stop)
        except Exception as exc:
            self._contain(slot.policy.name, slot.rule.name, "*", exc, None)
        for i, run in enumerate(list(slot.runs.values())):
            if stop is not None and i % STOP_CHUNK == 0 and stop.is_set():
                return False
            try:
                self._drive(run, run.step(now, self._room), now)
            except Exception as exc:
                self._contain(slot.policy.name, slot.rule.name, run.target_key, exc, run)
        return True

    def _sync(self, slot: RuleSlot, now: float, stop: threading.Event | None = None) -> None:
        """Start runs for fresh targets; retire silent ones that hold nothing."""
        targets = slot.targets
        for i, key in enumerate(targets.groups):
            if stop is not None and i % STOP_CHUNK == 0 and stop.is_set():
                self._housekept = -math.inf     # cut short: the next tick syncs every slot
                return
            if key not in slot.runs and (not key or targets.fresh(key, now)):
                run = slot.runs[key] = RuleRun(slot.policy, slot.rule, targets, key,
                                               mode=self.mode_for(slot.policy), registry=self.registry,
                                               held=self.held, min_history=self.min_history)
                self.runs[(slot.policy.name, slot.rule.name, run.target_key)] = run
                self.metrics.state(slot.policy.name, slot.rule.name, run.target_key, "ok")
        for key, run in list(slot.runs.items()):
            if key and run.retirable() and now - run.last_seen() > slot.retire_after + self.target_grace:
                self._retire(slot, key, run)

    def _retire(self, slot: RuleSlot, key: tuple, run: RuleRun, note: str | None = None) -> None:
        del slot.runs[key]
        del self.runs[(slot.policy.name, slot.rule.name, run.target_key)]
        self.metrics.forget(slot.policy.name, slot.rule.name, run.target_key)
        self.audit.forget(run.scope_key)
        self.audit.write("retire", policy=slot.policy.name, rule=slot.rule.name, target=run.target_key,
                         target_labels=run.labels, state=run.state, last_seen=self.clock.to_wall(run.last_seen()),
                         **({"note": note} if note else {}))

    def _contain(self, policy: str, rule: str, target: str, exc: Exception, run: RuleRun | None) -> None:
        log.error("%s/%s/%s raised; it goes to failed, the other rules go on", policy, rule, target,
                  exc_info=exc)
        self.metrics.rule_errors.labels(policy, rule).inc()
        self.audit.write("error", policy=policy, rule=rule, target=target,
                         error=f"{type(exc).__name__}: {exc}", state=run.state if run else None)
        if run is not None and run.state != FAILED_STATE:
            try:
                self._drive(run, run.crashed(f"{type(exc).__name__}: {exc}"), self.clock.now())
            except Exception:    # its transition could not be audited: the state metric says it still
                self.metrics.state(policy, rule, target, FAILED_STATE)

    # --- a new policy set ---------------------------------------------------------
    def _identity(self, policy: Policy, rule: Rule) -> tuple[str, str, str]:
        return policy.name, rule.name, rule_digest(policy, rule, self.mode_for(policy))

    def replace_policies(self, policies: list[Policy], reason: str) -> PolicySwap:
        """Run ``policies`` from now on; call it between two ticks. A rule of the
        same identity keeps its slot (targets, runs, timers, changes, cooldowns);
        the runs of every other old rule end (``_end``) after a ``reload`` record."""
        old = {slot.identity: slot for slot in self.slots}
        slots, kept, fresh = [], [], []
        for p in policies:
            for r in p.rules:
                identity = self._identity(p, r)
                slot = old.pop(identity, None)
                if slot is None:
                    slot = RuleSlot(self.bus, p, r, identity)
                    fresh.append(slot)
                else:
                    kept.append(slot)
                slots.append(slot)
        ended = list(old.values())
        before, after = {p.name for p in self.policies}, {p.name for p in policies}
        diff = dict(added=tuple(sorted(after - before)), removed=tuple(sorted(before - after)),
                    changed=tuple(sorted({s.policy.name for s in ended + fresh} & before & after)),
                    kept_rules=tuple(f"{s.policy.name}/{s.rule.name}" for s in kept),
                    ended_rules=tuple(f"{s.policy.name}/{s.rule.name}" for s in ended))
        self.audit.write("reload", reason=reason, outcome="ok", **{k: list(v) for k, v in diff.items()},
                         policies=describe_policies(policies))
        prepared = self._enforced_actuators()
        self.policies, self.slots = policies, slots
        self.rollouts = rollout_specs(policies)
        now, names, outcomes = self.clock.now(), {(s.policy.name, s.rule.name) for s in slots}, []
        for slot in ended:
            note = f"rule {'changed' if slot.identity[:2] in names else 'removed'} at reload"
            outcomes += self._end(slot, now, note)
        self._prepare_actuators(self._enforced_actuators() - prepared)
        self.metrics.active.set(self.active_count())
        self.metrics.targets.set(len(self.runs))
        return PolicySwap(**diff, ended_changes=tuple(outcomes))

    def _end(self, slot: RuleSlot, now: float, note: str) -> list[Outcome]:
        """End the runs of a rule that was removed or changed, as a restart without
        it would: its changes are reverted if it rolls back on shutdown or reverts
        on restart, else (``on_restart: adopt``) they stay applied and journaled, for
        the next start to adopt or ``reflexarc rollback`` to revert; its alerts are
        resolved; each run is retired. Returns what became of each change."""
        outcomes = []
        for key, run in list(slot.runs.items()):
            try:
                outcomes += self._drive(run, run.end(note, now), now)
            except Exception as exc:
                self._contain(slot.policy.name, slot.rule.name, run.target_key, exc, None)
            for ac in list(run.changes):    # what an error left: the journal still holds it
                run.changes.remove(ac)
            self._retire(slot, key, run, note=note)
        return outcomes

    def shutdown(self) -> None:
        """Revert what rules roll back on shutdown (leave the rest to the journal)
        and resolve the alerts still firing, but those of rules that keep them
        (``rollback: {alerts: keep}``); then wait, at most ``STOP_DELIVERY``, for
        what the alert sender queued to be delivered, before it closes: a
        receiver that hangs never holds the stop (what it did not take is
        logged and counted as not delivered)."""
        for run in self.runs.values():
            now = self.clock.now()
            self._drive(run, run.shutdown(now), now)
        if not self.executor.deliver_notices(within=STOP_DELIVERY):
            log.warning("stopping: alerts (resolutions) not delivered within %.1f s are given up; see "
                        "reflexarc_alert_deliveries_total", STOP_DELIVERY)
        self.audit.write("end", summary=self.summary())
        self.registry.close()

    # --- carrying out what a run decided ---------------------------------------------
    def mode_for(self, policy: Policy) -> str:
        return self.mode_override or policy.mode

    def active_count(self) -> int:
        return self.held.count

    def _drive(self, run: RuleRun, decisions: Decisions, now: float) -> list[Outcome]:
        """Carry out what ``run`` decided, in order, sending back the result of
        each decision it waits on (``Act``, ``Revert``, ``Refresh``); the run never
        calls the controller. Returns what became of the changes it let go
        (reverted, failed, adopted ...), in order."""
        let_go: list[Outcome] = []
        for decision in decisions:
            if type(decision) is Evaluated:     # most ticks decide just this: no dispatch
                self._evaluated(run, decision, now)
                continue
            reply = self._carry_out(run, decision, now, let_go)
            while reply is not None:        # the run waits on it: send it, carry out what it decides next
                try:
                    decision = decisions.send(reply)
                except StopIteration:
                    break
                reply = self._carry_out(run, decision, now, let_go)
        return let_go

    def _carry_out(self, run: RuleRun, decision: Decision, now: float,
                   let_go: list[Outcome]) -> StepResult | list[tuple[ActiveChange, Change | None]] | None:
        """One decision; what the run waits on (a ``StepResult``, the changes that
        moved) or None."""
        match decision:
            case Evaluated():
                self._evaluated(run, decision, now)
            case Transitioned():
                self._transitioned(run, decision)
            case Limited(reason=reason):
                self._limited(run, reason)
            case Act():
                return self._act(run, decision, now)
            case Revert(change=ac, note=note):
                res = self._revert(run, ac, note)
                let_go.append(res.outcome)
                return res
            case Keep(change=ac):
                self.executor.release(ac.journal_id, Outcome.KEPT)
                self.audit_action(run, ac.step, ac.change, Outcome.KEPT, None, None, ac.mode)
            case Adopt(change=ac, note=note):
                self.audit_action(run, ac.step, ac.change, Outcome.ADOPTED, ac.journal_id, None, ac.mode,
                                  note=note)
                let_go.append(Outcome.ADOPTED)
            case Refresh():
                return self._refresh(run, decision)
            case Resolve(notices=notices):
                self._resolve(run, notices)
        return None

    def _evaluated(self, run: RuleRun, evaluated: Evaluated, now: float) -> None:
        state, result = evaluated.state, evaluated.result
        if self.audit.eval_due(run.scope_key, state, result, now):
            self.audit.write("eval", state=state, result=result, policy=run.policy.name, rule=run.rule.name,
                             target=run.target_key, target_labels=run.labels, values=evaluated.evidence())

    def _hold_adopted(self) -> None:
        """Slots for the changes a restart adopted (the slots parked at the
        last stop first); one it cannot get yet is logged and audited once (a
        ``limit`` record) and asked again each pass. Once none is missing, the
        parked slots nothing took back are freed."""
        budgets = {p.name: (p.budget, p.selector.one_job()) for p in self.policies}
        missed = self.executor.hold_adopted(budgets)
        for entry, why in missed:
            if entry.id in self.unslotted:
                continue
            self.unslotted.add(entry.id)
            log.error("fleet budget: change %s (%s/%s), adopted at the start, has no slot: %s; it stays applied "
                      "and asks again every %g s", entry.id, entry.policy, entry.rule, why, HOUSEKEEPING_EVERY)
            self.audit.write("limit", policy=entry.policy, rule=entry.rule,
                             target=Change.from_dict(entry.change).target.key(), reason="fleet_budget",
                             journal_id=entry.id, note=f"adopted without a slot: {why}")
        self.unslotted &= {entry.id for entry, _ in missed}
        if not missed:             # every adopted change holds its slot: the parked ones left were reverted
            dropped = self.budget.drop_parked()
            if dropped:
                log.info("fleet budget: %d slot(s) parked at the last stop freed (their changes were reverted "
                         "at the start)", dropped)

    def _limited(self, run: RuleRun, reason: str) -> None:
        self.metrics.limited.labels(run.policy.name, run.rule.name, reason).inc()
        self.audit.write("limit", policy=run.policy.name, rule=run.rule.name, target=run.target_key, reason=reason)

    def _transitioned(self, run: RuleRun, moved: Transitioned) -> None:
        frm, to = moved.src, moved.dst
        self.metrics.state(run.policy.name, run.rule.name, run.target_key, to)
        self.metrics.transition(run.policy.name, run.rule.name, frm, to)
        self.audit.write("transition", policy=run.policy.name, rule=run.rule.name, target=run.target_key,
                         target_labels=run.labels, mode=moved.mode, **{"from": frm}, to=to, trigger=moved.trigger,
                         evidence=moved.evidence, note=moved.note)
        log.debug("%s: %s -> %s (%s) %s", run.scope_key, frm, to, moved.trigger, moved.note)   # told by narrate.py
        spec = self.rollouts.get(run.policy.name)
        if spec is not None and moved.mode == "enforce" and moved.trigger in ("verified", "verify_failed") \
                and self.rollout is not None:
            events = self.rollout.report(run.policy.name, spec, moved.trigger == "verified", run.target_key)
            self._rollout_events(events)

    def _rollout_events(self, events: list[Event]) -> None:
        """Audit what verify outcomes did to a rollout; an opened breaker is alerted too."""
        for event in events:
            self.metrics.rollout(event.policy, event.stage, event.kind == "opened")
            alert = None
            if event.kind == "opened":
                sent = self.executor.notify(Target({}, {"policy": event.policy, "rule": "rollout"}),
                                            f"fleet breaker of {event.policy} opened: {event.detail}; no node "
                                            f"enforces it until reflexarc fleet reset",
                                            {"alertname": "reflexarc_fleet_breaker_open", "policy": event.policy})
                alert = {"outcome": sent.outcome, "error": sent.error}
            self.audit.write("rollout", policy=event.policy, event=event.kind, stage=event.stage + 1,
                             detail=event.detail, node=self.rollout.node if self.rollout else None,
                             **({"alert": alert} if alert else {}))

    def audit_action(self, run: RuleRun, step, change, outcome: Outcome, jid, error, mode: str,
                     note: str | None = None, refused: str | None = None) -> None:
        actuator = change.actuator if change else run.rule.actions[step].actuator
        self.metrics.action(run.policy.name, run.rule.name, actuator, mode, outcome)
        self.audit.write("action", policy=run.policy.name, rule=run.rule.name, target=run.target_key,
                         target_labels=run.labels, mode=mode, step=step, actuator=actuator,
                         params=change.params if change else run.rule.actions[step].params, outcome=outcome,
                         change=_change_view(change), journal_id=jid, error=error,
                         **({"note": note} if note else {}), **({"refusal": refused} if refused else {}))

    def _act(self, run: RuleRun, act: Act, now: float) -> StepResult:
        """Run the action the run decided, in the mode it decided; a change taken
        counts against the node's hourly cap."""
        actuator = act.action.actuator
        spec = self.rollouts.get(run.policy.name) if act.mode == "enforce" else None
        res = self.executor.act(actuator, run.target, act.params, act.mode, run.policy.name, run.rule.name,
                                run.rule.rollback.on_restart, rollout=spec, budget=run.policy.budget,
                                job=run.policy.selector.one_job())
        if spec is not None and self.rollout is not None and run.policy.name in self.rollout.seen:
            seen = self.rollout.seen[run.policy.name]
            self.metrics.rollout(run.policy.name, seen.stage, seen.open)
        if res.outcome in TAKEN and self.registry.spec(actuator).changes_system:
            self.limits.record(now)
            self._room = self.limits.room(now, self.hold)
        if res.outcome is Outcome.REFUSED:
            self.metrics.budget_refused.labels(res.refused).inc()
        self.audit_action(run, act.step, res.change, res.outcome, res.journal_id, res.error, act.mode,
                          refused=res.refused)
        return res

    def _revert(self, run: RuleRun, ac: ActiveChange, note: str | None) -> StepResult:
        res = self.executor.revert(ac.change, ac.journal_id, ac.mode)
        self.audit_action(run, ac.step, ac.change, res.outcome, ac.journal_id, res.error, ac.mode, note=note)
        return res

    def _refresh(self, run: RuleRun, refresh: Refresh) -> list[tuple[ActiveChange, Change | None]]:
        """Follow each held change to new targets (not while enforcement is held:
        the kill switch or a pause stops every change, refreshes included); a
        change that grew is audited, one whose target is gone (None) too."""
        moved = []
        for ac in refresh.changes:
            res = self.executor.refresh(ac.change, ac.journal_id, "dry-run" if self.hold else ac.mode)
            if res is None:
                continue
            if res.outcome in (Outcome.TARGET_GONE, Outcome.REVERTED):   # reverted: it could not be journaled
                moved.append((ac, None))
                self.audit_action(run, ac.step, ac.change, res.outcome, ac.journal_id, res.error, ac.mode)
            else:
                moved.append((ac, res.change))
                self.audit_action(run, ac.step, res.change, res.outcome, ac.journal_id, res.error, ac.mode,
                                  note="refreshed: followed to new processes")
        for notice in refresh.notices:
            self.executor.refresh(notice, None, "enforce")
        return moved

    def _resolve(self, run: RuleRun, notices: tuple[Change, ...]) -> None:
        for notice in notices:
            res = self.executor.resolve(notice)
            self.audit_action(run, None, notice, res.outcome, None, res.error, "enforce")

    def check_drift(self) -> dict[str, str]:
        """Read back every open journal entry; audit each one found changed
        behind the controller's back (once per difference), and return them all."""
        found, _ = self.executor.drifts()    # an entry that cannot be read back is not drift
        for jid, differs in found.items():
            if self.drifted.get(jid) != differs:
                entry = self.journal.get(jid)
                self.audit.write("drift", journal_id=jid, actuator=entry.change.get("actuator"),
                                 policy=entry.policy, rule=entry.rule, summary=entry.change.get("summary", ""),
                                 differs=differs)
        self.drifted = found
        self.metrics.drifted.set(len(found))
        return found

    # --- enforcement held, and an operator's hand -------------------------------
    def _watch_hold(self, now: float) -> None:
        """Look at the kill switch and the pause once per tick; audit and log each
        change of either, so a held controller is never silently held."""
        switch = self.limits.kill_switch_engaged()
        if switch != self._switch:
            self._switch = switch
            self.audit.write("kill_switch", engaged=switch, path=self.limits.settings.kill_switch)
        pause = self.limits.pause
        if pause is not None and pause.until is not None and now >= pause.until:
            self.resume("the pause ran out", None)
        self.hold = self.limits.hold(now, switch)
        self.metrics.kill_switch.set(1 if switch else 0)
        self.metrics.paused.set(0 if self.limits.pause is None else 1)

    def pause(self, reason: str, by: dict | None, duration: float | None = None) -> Pause:
        """Hold enforcement from now (for ``duration`` seconds, or until ``resume``)."""
        now = self.clock.now()
        self.limits.pause = Pause(reason, by or {}, now, None if duration is None else now + duration)
        self.audit.write("pause", reason=reason, by=by, duration=duration,
                         until=None if duration is None else self.clock.to_wall(now + duration))
        self._watch_hold(now)
        return self.limits.pause

    def resume(self, reason: str, by: dict | None) -> Pause | None:
        """End a pause; the one ended, or None when none was on."""
        pause, self.limits.pause = self.limits.pause, None
        if pause is not None:
            self.audit.write("resume", reason=reason, by=by, paused_for=round(self.clock.now() - pause.since, 3))
            self.hold = self.limits.hold(self.clock.now(), self._switch)
            self.metrics.paused.set(0)
        return pause

    def holder(self, journal_id: str) -> tuple[RuleRun, ActiveChange] | None:
        """The run holding the change journaled as ``journal_id``, and the change."""
        for run in self.runs.values():
            for ac in run.changes:
                if ac.journal_id == journal_id:
                    return run, ac
        return None

    def withdraw(self, run: RuleRun, ac: ActiveChange, note: str) -> bool:
        """An operator's rollback of one change a run holds: reverted and audited
        with ``note``; the run's lifecycle follows (see ``RuleRun.withdraw``)."""
        now = self.clock.now()
        (outcome,) = self._drive(run, run.withdraw(ac, note, now), now)
        self.metrics.active.set(self.active_count())
        return outcome is not Outcome.FAILED

    def let_go(self, run: RuleRun, ac: ActiveChange) -> None:
        """Stop holding ``ac`` without undoing it (an operator closed its journal
        entry): the run goes on as if its target were gone; its fleet slot is given back."""
        self.executor.closed(ac.journal_id)
        self._drive(run, run.target_gone([ac]), self.clock.now())

    # --- reporting --------------------------------------------------------------
    def summary(self) -> dict:
        c = self.audit.counts
        outcomes = {k.split(":", 1)[1]: v for k, v in c.items() if k.startswith("outcome:")}
        return {"transitions": c.get("transition", 0), "actions": outcomes,
                "would_have_acted": outcomes.get(Outcome.PLANNED, 0) + outcomes.get(Outcome.ALERTED, 0),
                **{str(o): outcomes.get(o, 0) for o in (Outcome.APPLIED, Outcome.REVERTED)},
                "errors": c.get("error", 0), "retired": c.get("retire", 0),
                "states": {"/".join(k): r.state for k, r in self.runs.items()}}


def _change_view(change) -> dict | None:
    if change is None:
        return None
    return {"before": change.before, "after": change.after, "summary": change.summary}
