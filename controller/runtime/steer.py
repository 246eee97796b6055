"""What an operator may ask of a running controller, carried out on its loop.

``control.py`` brings each request here, on the loop thread, between two
ticks; ``Steering`` answers it from the controller's own state and journal,
so nothing is read from files another process is writing:

- ``status``: the mode, the policies, every rule-target that is not ``ok``
  with its evidence, the changes held, the node limits used, enforcement
  (kill switch, pause) and the probes;
- ``journal``: every journaled change, with the times of its steps;
- ``check``: every open change read back now; those the system no longer
  shows (drift);
- ``top``: the status, and the latest value of every live series on the bus
  (a counter as its rate per second over the last ``RATE_WINDOW``);
- ``rollback`` (one ``id`` or ``all``): a change a rule holds is withdrawn
  through its run, so the lifecycle follows (rolled back, then the rule's
  cooldown); one no rule holds (a manual ``act``, an adopted change) is
  reverted from its entry. Audited with who asked;
- ``forget``: close an entry without reverting it, with a reason;
- ``act``: one actuator step by hand, journaled in this controller's journal;
- ``pause`` (``reason``, optional ``for`` seconds) and ``resume``: enforcement
  held and released, audited with who asked.

Example::

    steering = Steering(ctl, journal, probes=lambda: {"dataloader_io": "running"})
    steering({"verb": "pause", "reason": "kernel upgrade", "for": 600}, peer)

Overhead: nothing per tick; a request costs a pass over the rule runs
(``status``) or the journal's entries (``journal``, ``rollback``).
"""
from __future__ import annotations

import math

from reflexarc.actuators.base import Target
from reflexarc.core.outcomes import Outcome
from reflexarc.core.params import check_params
from reflexarc.core.ports import port_ranges

from ..engine.engine import _change_view
from ..engine.journal import OPEN_STATES, JournalWriteError
from ..signals.catalogue import CATALOGUE
from .control import ControlError, Peer
from .narrate import evidence_words

MODES = ("dry-run", "alert-only", "enforce")
RATE_WINDOW = 10.0       # seconds over which a counter's rate is taken
LIVE_FOR = 60.0          # a series silent longer is not shown by top


def _who(peer: Peer) -> str:
    return f"uid {peer.uid}, pid {peer.pid}"


class Steering:
    def __init__(self, controller, journal, probes=None) -> None:
        self.ctl = controller
        self.journal = journal
        self.probes = probes or (lambda: {})

    def __call__(self, request: dict, peer: Peer) -> dict:
        verb = request.get("verb")
        handler = {"status": self.status, "journal": self.entries, "top": self.top, "check": self.check,
                   "rollback": self.rollback,
                   "forget": self.forget, "act": self.act, "pause": self.pause, "resume": self.resume}.get(verb)
        if handler is None:
            raise ControlError(f"unknown request '{verb}'; the controller answers status, journal, top, check, "
                               "rollback, forget, act, pause and resume")
        return {"ok": True, **handler(request, peer)}

    # --- reading --------------------------------------------------------------
    def status(self, request: dict, peer: Peer) -> dict:
        ctl, now = self.ctl, self.ctl.clock.now()
        limits, pause = ctl.limits, ctl.limits.pause
        rules = [{"policy": run.policy.name, "rule": run.rule.name, "target": run.target_key, "labels": run.labels,
                  "state": run.state, "since": ctl.clock.to_wall(run.since), "for_s": round(now - run.since, 1),
                  "evidence": evidence_words(run.evidence)}
                 for run in ctl.runs.values() if run.state != "ok"]
        changes = [{"journal_id": ac.journal_id, "policy": run.policy.name, "rule": run.rule.name,
                    "target": run.target_key, "actuator": ac.change.actuator, "mode": ac.mode,
                    "summary": ac.change.summary}
                   for run in ctl.runs.values() for ac in run.changes]
        return {"mode": ctl.mode_override or "policy",
                "policies": [{"name": p.name, "mode": ctl.mode_for(p), "rules": [r.name for r in p.rules]}
                             for p in ctl.policies],
                "targets": len(ctl.runs), "rules": sorted(rules, key=lambda r: (r["policy"], r["rule"], r["target"])),
                "changes": changes,
                "journal_open": 0 if self.journal is None else len(self.journal.open_entries()),
                "limits": {"active": ctl.active_count(), "max_active": limits.settings.max_active,
                           "actions_last_hour": limits.actions_last_hour(now),
                           "actions_per_hour": limits.settings.actions_per_hour},
                "enforcement": {"held": ctl.hold, "kill_switch": limits.settings.kill_switch,
                                "paused": None if pause is None else {
                                    "reason": pause.reason, "by": pause.by,
                                    "since": ctl.clock.to_wall(pause.since),
                                    "until": None if pause.until is None else ctl.clock.to_wall(pause.until)}},
                "probes": self.probes(), "fleet": self.fleet()}

    def fleet(self) -> dict | None:
        """The node's side of the fleet: its name and lease, the slots it holds,
        each rollout as it last read it; None without a fleet store."""
        budget, rollout = self.ctl.budget, self.ctl.rollout
        if budget is None:
            return None
        seen = rollout.seen if rollout is not None else {}
        return {"node": budget.node, "store": budget.store.endpoint, "registered": budget.renewing,
                "held": budget.held(), "limit": {"max_nodes": budget.max_nodes, "max_percent": budget.max_percent},
                "rollouts": {policy: {"stage": state.stage + 1, "open": state.open}
                             for policy, state in sorted(seen.items())}}

    def top(self, request: dict, peer: Peer) -> dict:
        ctl, now = self.ctl, self.ctl.clock.now()
        names = set(CATALOGUE) | {c.signal for p in ctl.policies for r in p.rules for c in r.conditions()}
        rows = []
        for name in sorted(names):
            counter = name in CATALOGUE and CATALOGUE[name].kind == "counter"
            for series in ctl.bus.series(name):
                if not series.ts or now - series.ts[-1] > LIVE_FOR:
                    continue
                row = {"name": name, "labels": series.labels, "value": series.vs[-1],
                       "ts": ctl.clock.to_wall(series.ts[-1])}
                if counter:
                    row["rate"] = _rate(series)
                rows.append(row)
        return {**self.status(request, peer), "signals": rows}

    def entries(self, request: dict, peer: Peer) -> dict:
        if self.journal is None:
            return {"entries": []}
        return {"entries": [{"id": e.id, "state": e.state, "actuator": e.change.get("actuator"),
                             "policy": e.policy, "rule": e.rule, "summary": e.change.get("summary", ""),
                             "history": e.history} for e in self.journal.entries()]}

    def check(self, request: dict, peer: Peer) -> dict:
        """Every open entry read back now: ``{id: what differs}`` for those that drifted."""
        self._journal()
        return {"open": len(self.journal.open_entries()), "drifted": self.ctl.check_drift()}

    # --- changing -------------------------------------------------------------------
    def _journal(self):
        if self.journal is None:
            raise ControlError("this controller keeps no journal")
        return self.journal

    def rollback(self, request: dict, peer: Peer) -> dict:
        journal = self._journal()
        jid, everything = request.get("id"), request.get("all") is True
        if bool(jid) == everything:
            raise ControlError("rollback names one journal id or all")
        entries = journal.open_entries()
        if jid:
            entries = [e for e in entries if e.id == jid]
            if not entries:
                raise ControlError(f"no open journal entry '{jid}' (see 'reflexarc journal')")
        note = f"rolled back by an operator ({_who(peer)})"
        results = []
        for entry in reversed(entries):            # the newest first, as a rule reverts its own
            held = self.ctl.holder(entry.id)
            if held is not None:
                run, ac = held
                reverted = self.ctl.withdraw(run, ac, note)
                outcome, error = (Outcome.REVERTED, None) if reverted else (Outcome.FAILED, "see the audit")
                if reverted and journal.get(entry.id).state in OPEN_STATES:
                    outcome, error = Outcome.FAILED, "the revert could not be recorded in the journal"
            else:
                res = self.ctl.executor.revert_entry(entry)
                outcome, error = res.outcome, res.error or res.unrecorded
                self.ctl.audit.write("action", policy=entry.policy or "manual", rule=entry.rule or "act",
                                     target=res.change.target.key() if res.change else "", mode="enforce",
                                     step=None, actuator=entry.change.get("actuator"), params=None,
                                     outcome=res.outcome, change=_change_view(res.change), journal_id=entry.id,
                                     error=res.error, note=note)
            results.append({"id": entry.id, "actuator": entry.change.get("actuator"), "outcome": str(outcome),
                            "error": error, "summary": entry.change.get("summary", "")})
        self.ctl.audit.write("operator", verb="rollback", by=peer.as_dict(), id=jid, all=everything,
                             results=[{k: r[k] for k in ("id", "outcome")} for r in results])
        return {"results": results}

    def forget(self, request: dict, peer: Peer) -> dict:
        journal = self._journal()
        jid, reason = request.get("id"), str(request.get("reason") or "").strip()
        if not reason:
            raise ControlError("forget needs a reason (it is audited)")
        try:
            entry = journal.forget(str(jid), reason)
        except (LookupError, JournalWriteError) as exc:
            raise ControlError(str(exc)) from None
        held = self.ctl.holder(entry.id)
        if held is not None:                       # the run lets it go, as if its target were gone
            self.ctl.let_go(*held)
        self.ctl.audit.write("forget", journal_id=entry.id, actuator=entry.change.get("actuator"),
                             policy=entry.policy, rule=entry.rule, summary=entry.change.get("summary", ""),
                             reason=reason, user=peer.uid, by=peer.as_dict())
        return {"id": entry.id, "actuator": entry.change.get("actuator")}

    def act(self, request: dict, peer: Peer) -> dict:
        ctl = self.ctl
        actuator, mode = request.get("actuator"), request.get("mode", "dry-run")
        if actuator not in ctl.registry:
            raise ControlError(f"unknown actuator '{actuator}'")
        if mode not in MODES:
            raise ControlError(f"mode '{mode}': one of {', '.join(MODES)}")
        if mode == "enforce" and ctl.hold:
            raise ControlError(f"enforcement is held ({ctl.hold.replace('_', ' ')}): nothing is changed until "
                               "'reflexarc resume' (or the kill switch is removed); --mode dry-run plans it")
        texts, labels, selector = (request.get(k) or {} for k in ("params", "labels", "selector"))
        if not all(isinstance(d, dict) for d in (texts, labels, selector)):
            raise ControlError("act: params, labels and selector are objects")
        try:
            params = check_params(ctl.registry.spec(actuator), {str(k): str(v) for k, v in texts.items()})
        except ValueError as exc:
            raise ControlError(str(exc)) from None
        try:
            selector = {**selector, "ports": port_ranges(selector.get("ports") or [])}
        except ValueError as exc:
            raise ControlError(str(exc)) from None
        target = Target({str(k): str(v) for k, v in labels.items()}, {**selector, "policy": "manual", "rule": "act"})
        res = ctl.executor.act(actuator, target, params, mode, policy="manual", rule="act")
        change = res.change
        ctl.audit.write("action", policy="manual", rule="act", target=target.key(), target_labels=target.labels,
                        mode=mode, step=0, actuator=actuator, params=params, outcome=res.outcome,
                        change=_change_view(change), journal_id=res.journal_id, error=res.error,
                        note=f"by an operator ({_who(peer)})")
        return {"outcome": str(res.outcome), "journal_id": res.journal_id, "error": res.error,
                "before": change.before if change else None, "after": change.after if change else None,
                "summary": change.summary if change else None}

    def pause(self, request: dict, peer: Peer) -> dict:
        reason = str(request.get("reason") or "").strip()
        if not reason:
            raise ControlError("pause needs a reason (it is audited)")
        duration = request.get("for")
        if duration is not None and (not isinstance(duration, (int, float)) or isinstance(duration, bool)
                                     or not math.isfinite(duration) or duration <= 0):
            raise ControlError("pause: 'for' is a number of seconds > 0")
        pause = self.ctl.pause(reason, peer.as_dict(), duration)
        return {"held": self.ctl.hold, "until": None if pause.until is None else self.ctl.clock.to_wall(pause.until)}

    def resume(self, request: dict, peer: Peer) -> dict:
        reason = str(request.get("reason") or "resumed by an operator")
        pause = self.ctl.resume(reason, peer.as_dict())
        return {"was_paused": pause is not None, "held": self.ctl.hold}


def _rate(series) -> float | None:
    """A counter's increase per second over the last ``RATE_WINDOW`` of its
    points; None with one point, or across a reset."""
    ts, vs = series.ts, series.vs
    last = len(ts) - 1
    first = last
    while first > series.head and ts[first - 1] >= ts[last] - RATE_WINDOW:
        first -= 1
    if first == last and first > series.head:   # sparser than the window: the point before
        first -= 1
    span = ts[last] - ts[first]
    if span <= 0 or vs[last] < vs[first]:
        return None
    return (vs[last] - vs[first]) / span
