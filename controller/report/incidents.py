"""Incidents: what a rule did about one breach of one target, from the breach to
the last word on its change.

An incident opens when a rule fires for a target (``pending -> firing``; its
onset is the ``pending`` that led there, the last one not cleared before
firing) and gathers the actions that followed, the verify result (``verifying
-> remediated`` or ``-> recovering``, with the verify condition's values), the
rollback (``reverted``, ``would-revert``, ``kept``, ``target-gone``, ...) and
whatever else the target's rule did until it fires again or the run ends. An
action outside such an episode (``reflexarc act`` by hand, a change a restarted
controller found in its journal) is an incident of its own. Breaches that
cleared before the rule acted are only counted.

``status`` says how it ended, in the words of the audit where it has one:
``failed``, ``escalated`` (verify failed or nothing helped: an alert went to a
person), ``rolled back`` (verify failed, the change reverted), ``remediated``,
``applied`` (no verify result yet), ``planned`` / ``alerted`` (dry-run /
alert-only: what it would have done), ``notified`` (an alert or log action),
``adopted``, ``reverted``, ``held back`` (limits kept it from acting).

Example::

    log = IncidentLog(audit, keep=20, per_rule=3)
    for row in iter_decisions(audit):
        for done in log.add(row):      # incidents as they close
            ...
    log.finish()                       # the ones still open at the end
    log.shown()                        # what the pages show, most important first
    log.groups                         # (run, policy, rule, status) -> count, first, last

Overhead: one open incident per rule and target (and those whose change is
still in place), ``per_rule`` finished ones per run, rule and status, and a
count per group.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from reflexarc.core.outcomes import Outcome

FAILED_STATE = "failed"      # the lifecycle state, spelled as Outcome.FAILED but not an outcome
STATUS_ORDER = (Outcome.FAILED, "escalated", "rolled back", "remediated", Outcome.APPLIED, Outcome.NOTIFIED,
                Outcome.ALERTED, Outcome.PLANNED, Outcome.ADOPTED, Outcome.REVERTED, Outcome.TARGET_GONE, "held back")
GOOD = ("remediated",)
BAD = (Outcome.FAILED, "escalated", "rolled back")
DRY = (Outcome.PLANNED, Outcome.ALERTED)
ROLLBACK_OUTCOMES = (Outcome.REVERTED, Outcome.WOULD_REVERT, Outcome.KEPT, Outcome.TARGET_GONE, Outcome.RESOLVED)
MAX_STEPS = 40               # transitions kept per incident
MAX_ACTIONS = 20             # actions kept per incident
MAX_DIFF_LINES = 60
SHUTDOWN_SLACK = 5.0         # a revert this close to the run's end, with no transition before it, is the shutdown's


def status_rank(status: str) -> int:
    return STATUS_ORDER.index(status) if status in STATUS_ORDER else len(STATUS_ORDER)


@dataclass
class IncidentLog:
    audit: object
    keep: int = 25                  # incidents the pages show
    per_rule: int = 25              # of them, at most this many of one run, rule and status
    kept: dict[tuple, list[dict]] = field(default_factory=dict)   # (run, policy, rule, status) -> its first few
    groups: dict[tuple, dict] = field(default_factory=dict)       # (run, policy, rule, status) -> count, first, last
    total: int = 0
    cleared: int = 0                                              # breaches that cleared before any action
    by_status: dict[str, int] = field(default_factory=dict)
    _open: dict[tuple, dict] = field(default_factory=dict)        # (run, policy, rule, target) -> incident
    _pending: dict[tuple, dict] = field(default_factory=dict)     # the last pending not yet cleared
    _limit_ts: dict[tuple, tuple] = field(default_factory=dict)
    _by_jid: dict[str, dict] = field(default_factory=dict)       # journal id -> the incident whose change it is
    _seq: int = 0                                                 # file order of the steps and actions kept

    # --- building ----------------------------------------------------------------
    def add(self, row: dict) -> list[dict]:
        """Take one decision row; the incidents it settles come back (closed, and
        no change of theirs still in place)."""
        key = (row["run"], row["policy"], row["rule"], row["target"])
        done: list[dict] = []
        if row["kind"] == "transition":
            to, frm = row.get("to"), row.get("from")
            if to == "pending":
                done += self._close(key, row["ts"])
                self._pending[key] = row
            elif to == "firing":
                done += self._close(key, row["ts"])
                self._open[key] = self._new(row, self._pending.pop(key, None))
            else:
                if to == "ok" and frm in ("pending", "firing"):
                    self._pending.pop(key, None)
                incident = self._open.get(key)
                if incident is not None:
                    self._step(incident, row)
            return done
        outcome = row.get("outcome")
        maker = self._by_jid.get(row.get("journal_id")) if outcome in ROLLBACK_OUTCOMES + (Outcome.ADOPTED,) else None
        if maker is not None and maker["run"] == row["run"] and outcome != Outcome.ADOPTED:
            self._act(maker, row)           # the revert of a change an earlier breach of this target made
            return done + self._settle_if_done(maker, row.get("journal_id"))
        if maker is not None:               # a later run took over or reverted an earlier run's change
            maker["rollback"].append(dict(self._action(row), why=f"by run {row['run']}"
                                          + (f": {row['note']}" if row.get("note") else "")))
            done += self._settle_if_done(maker, row.get("journal_id"))
        incident = self._open.get(key)
        if incident is None:
            incident = self._open[key] = self._new(row, None)
            if maker is not None:
                incident["made_in"] = {"run": maker["run"], "ts": maker["fired"] or maker["onset"]}
        self._act(incident, row)
        return done

    def finish(self) -> list[dict]:
        """Close and settle every incident still open (the run ended, or the audit stops)."""
        done = []
        for key in list(self._open):
            run = self.audit.runs[key[0] - 1] if 0 < key[0] <= len(self.audit.runs) else None
            done += self._close(key, run.last_ts if run is not None else None)
        waiting = {id(i): i for i in self._by_jid.values()}
        self._by_jid.clear()
        for incident in waiting.values():
            incident["in_place"], incident["active"] = list(incident["active"]), []
            done += self._settle(incident)
        self._pending.clear()
        return done

    def _new(self, row: dict, pending: dict | None) -> dict:
        fired = row["ts"] if row["kind"] == "transition" else None
        onset = pending["ts"] if pending is not None else row["ts"]
        steps = [_step_of(pending, self._next())] if pending is not None else []
        return {"run": row["run"], "policy": row["policy"], "rule": row["rule"], "target": row["target"],
                "mode": row.get("mode"), "onset": onset, "fired": fired,
                "evidence": row.get("evidence") if fired is not None else [],
                "steps": steps + ([_step_of(row, self._next())] if fired is not None else []),
                "actions": [], "verify": None, "rollback": [], "held_back": {}, "more_actions": 0,
                "first_action_s": None, "remediated_s": None, "last_ts": row["ts"],
                "standalone": fired is None, "note": None if fired is not None else row.get("note"),
                "made_in": None, "active": [], "closed": False, "status": None}

    def _step(self, incident: dict, row: dict) -> None:
        incident["last_ts"] = max(incident["last_ts"], row["ts"])
        if len(incident["steps"]) < MAX_STEPS:
            incident["steps"].append(_step_of(row, self._next()))
        if row.get("from") == "verifying" and row.get("to") in ("remediated", "recovering"):
            incident["verify"] = {"ts": row["ts"], "ok": row["to"] == "remediated", "evidence": row.get("evidence"),
                                  "note": row.get("note")}
        if row.get("to") == "remediated" and incident["remediated_s"] is None:
            incident["remediated_s"] = row["ts"] - incident["onset"]

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _action(self, row: dict) -> dict:
        return {"ts": row["ts"], "seq": self._next(), "step": row.get("step"), "actuator": row.get("actuator"),
                "outcome": row.get("outcome"), "mode": row.get("mode"), "summary": row.get("summary"),
                "error": row.get("error"), "journal_id": row.get("journal_id"), "note": row.get("note"),
                "attributed": row.get("attributed", False), "diff": (row.get("diff") or [])[:MAX_DIFF_LINES],
                "diff_lines": len(row.get("diff") or [])}

    def _act(self, incident: dict, row: dict) -> None:
        incident["last_ts"] = max(incident["last_ts"], row["ts"])
        outcome = row.get("outcome")
        action = self._action(row)
        taken = [a for a in incident["actions"] if a["outcome"] not in ROLLBACK_OUTCOMES]
        if outcome in ROLLBACK_OUTCOMES and (taken or not incident["standalone"]):
            action["why"] = self._why(incident, row)
            incident["rollback"].append(action)
        elif len(incident["actions"]) < MAX_ACTIONS:
            incident["actions"].append(action)
        else:
            incident["more_actions"] += 1
        jid = row.get("journal_id")
        if jid and outcome in (Outcome.APPLIED, Outcome.ADOPTED):
            self._by_jid[jid] = incident
            incident["active"].append(jid)
        if incident["first_action_s"] is None and outcome not in ROLLBACK_OUTCOMES and not incident["standalone"]:
            incident["first_action_s"] = row["ts"] - incident["onset"]

    def _why(self, incident: dict, row: dict) -> str:
        if row.get("note"):
            return str(row["note"])
        last = incident["steps"][-1] if incident["steps"] else None
        if last is not None and last["to"] == "recovering":
            return str(last.get("note") or last.get("trigger") or "")
        run = self.audit.runs[row["run"] - 1] if 0 < row["run"] <= len(self.audit.runs) else None
        if run is not None and run.end is not None and run.end["ts"] - row["ts"] <= SHUTDOWN_SLACK:
            return "at shutdown"
        return str(last.get("note") or last.get("trigger") or "") if last else ""

    def _held_back(self, incident: dict, until: float | None) -> dict[str, int]:
        """The limits that held the rule back between firing and ``until`` (the next breach, or the run's end)."""
        key = (incident["run"], incident["policy"], incident["rule"], incident["target"])
        stamps = self._limit_ts.get(key)
        if stamps is None:
            run = self.audit.runs[incident["run"] - 1]
            track = run.tracks.get(key[1:])
            limits = sorted(track.limits, key=lambda r: r["ts"]) if track is not None else []
            stamps = self._limit_ts[key] = ([lim["ts"] for lim in limits], [lim["reason"] for lim in limits])
        lo = bisect.bisect_left(stamps[0], incident["fired"])
        hi = len(stamps[0]) if until is None else bisect.bisect_right(stamps[0], until)
        out: dict[str, int] = {}
        for reason in stamps[1][lo:hi]:
            out[str(reason)] = out.get(str(reason), 0) + 1
        return out

    def _close(self, key: tuple, until: float | None) -> list[dict]:
        incident = self._open.pop(key, None)
        if incident is None:
            return []
        incident["closed"] = True
        incident["held_back"] = self._held_back(incident, until) if incident["fired"] is not None else {}
        return self._settle(incident)

    def _settle_if_done(self, incident: dict, jid) -> list[dict]:
        if jid in incident["active"]:
            incident["active"].remove(jid)
        if self._by_jid.get(jid) is incident:
            del self._by_jid[jid]
        return self._settle(incident)

    def _settle(self, incident: dict) -> list[dict]:
        """Count and keep a closed incident once none of its changes is still in place."""
        if not incident["closed"] or incident["active"] or incident.get("settled"):
            return []
        incident["settled"] = True
        incident.setdefault("in_place", [])
        incident["status"] = status = status_of(incident)
        del incident["active"], incident["closed"], incident["settled"]
        if status is None:
            self.cleared += 1
            return []
        self.total += 1
        self.by_status[status] = self.by_status.get(status, 0) + 1
        gkey = (incident["run"], incident["policy"], incident["rule"], status)
        shelf = self.kept.setdefault(gkey, [])
        if len(shelf) < min(self.keep, self.per_rule):
            shelf.append(incident)
        group = self.groups.get(gkey)
        if group is None:
            self.groups[gkey] = {"run": gkey[0], "policy": gkey[1], "rule": gkey[2], "status": status, "count": 1,
                                 "targets": {incident["target"]}, "first": incident["onset"],
                                 "last": incident["onset"]}
        else:
            group["count"] += 1
            if len(group["targets"]) < 1000:
                group["targets"].add(incident["target"])
            group["first"] = min(group["first"], incident["onset"])
            group["last"] = max(group["last"], incident["onset"])
        return [incident]

    # --- reading -----------------------------------------------------------------
    def shown(self, limit: int | None = None, per_rule: int | None = None) -> list[dict]:
        """The kept incidents to show, at most ``limit``, and at most ``per_rule`` of
        each run, rule and status (a flapping rule does not fill the page): the
        most important first, then in run and time order."""
        limit = self.keep if limit is None else limit
        per_rule = self.per_rule if per_rule is None else per_rule
        ordered = sorted((i for shelf in self.kept.values() for i in shelf),
                         key=lambda i: (status_rank(i["status"]), i["run"], i["onset"]))
        taken, per = [], {}
        for i in ordered:
            key = (i["run"], i["policy"], i["rule"], i["status"])
            if per_rule is not None and per.get(key, 0) >= per_rule:
                continue
            per[key] = per.get(key, 0) + 1
            taken.append(i)
            if len(taken) >= limit:
                break
        return sorted(taken, key=lambda i: (i["run"], status_rank(i["status"]), i["onset"]))

    def not_shown(self, shown: list[dict]) -> list[dict]:
        """The groups with incidents that ``shown`` leaves out: run, policy, rule, status, count, first, last."""
        seen: dict[tuple, int] = {}
        for i in shown:
            k = (i["run"], i["policy"], i["rule"], i["status"])
            seen[k] = seen.get(k, 0) + 1
        out = []
        for k, g in self.groups.items():
            rest = g["count"] - seen.get(k, 0)
            if rest > 0:
                out.append({**g, "targets": len(g["targets"]), "more": rest})
        return sorted(out, key=lambda g: (g["run"], status_rank(g["status"]), g["first"]))

    def counts(self, run: int | None = None) -> dict[str, int]:
        """Incidents by status, of one run or of all."""
        out: dict[str, int] = {}
        for (r, _, _, status), g in self.groups.items():
            if run is None or r == run:
                out[status] = out.get(status, 0) + g["count"]
        return dict(sorted(out.items(), key=lambda kv: status_rank(kv[0])))


def _step_of(row: dict, seq: int) -> dict:
    return {"ts": row["ts"], "seq": seq, "from": row.get("from"), "to": row.get("to"), "trigger": row.get("trigger"),
            "note": row.get("note")}


def status_of(incident: dict) -> str | None:
    """How an incident ended (see the module docstring); None for a breach that cleared untouched."""
    outcomes = {a["outcome"] for a in incident["actions"]} | {a["outcome"] for a in incident["rollback"]}
    reached = {s["to"] for s in incident["steps"]}
    verify_failed = incident["verify"] is not None and not incident["verify"]["ok"]
    if Outcome.FAILED in outcomes or FAILED_STATE in reached:
        return Outcome.FAILED
    for dry in DRY:
        if dry in outcomes:
            return dry
    if "escalated" in reached:
        return "escalated"
    if verify_failed and ("rolled_back" in reached or Outcome.REVERTED in outcomes):
        return "rolled back"
    if "remediated" in reached:
        return "remediated"
    if Outcome.APPLIED in outcomes:
        return Outcome.APPLIED
    for outcome in (Outcome.NOTIFIED, Outcome.ADOPTED, Outcome.REVERTED, Outcome.TARGET_GONE, Outcome.NOOP,
                    Outcome.KEPT, Outcome.RESOLVED, Outcome.WOULD_REVERT):
        if outcome in outcomes:
            return outcome
    if incident["held_back"]:
        return "held back"
    if outcomes:
        return sorted(outcomes)[0]
    return None

