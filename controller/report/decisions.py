"""The decision log: every transition and action, with why and what it changed.

Each row carries its time, its run (the index of the controller start it
belongs to), the rule and target, the trigger and evidence (an action inherits
them from the transition that led to it), the mode, the outcome, the change as
``before``/``after`` plus a unified diff, and an action's ``note`` (``reconciled
at start``, ``rule changed at reload``). ``iter_decisions``
reads the rows from the trail again, one at a time, so a long trail is never
held whole; ``DecisionLog`` keeps what the pages show of them (the first rows
and the first held-back actions, with totals). ``limit_groups`` folds ``limit``
records into one line per (rule, target, reason).

Example::

    log = DecisionLog(cap=1000)
    for row in iter_decisions(audit):
        log.add(row)              # report.json gets every row; the pages log.rows and log.dry_run
    [r for r in log.rows if r["kind"] == "action" and r["outcome"] == Outcome.APPLIED]

Overhead: one more pass over the trail, linear in its lines; memory O(rules x
targets) (the last transition of each), or O(transitions and actions) when the
trail is out of time order (a wall clock stepped back) and its rows are sorted.
Identical changes share one diff.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterator

from reflexarc.core.outcomes import Outcome

from .audit import Audit
from .fmt import Clock, diff_lines, evidence_text

DRY_RUN_OUTCOMES = (Outcome.PLANNED, Outcome.ALERTED, Outcome.WOULD_REVERT)   # in the order the pages name them
DIFF_CACHE = 512


def _evidence(items) -> list[dict]:
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def _transition_row(rec: dict) -> dict:
    evidence = _evidence(rec.get("evidence"))
    return {"from": rec.get("from"), "to": rec.get("to"), "trigger": rec.get("trigger"),
            "note": rec.get("note"), "evidence": evidence,
            "evidence_text": [evidence_text(i) for i in evidence]}


@lru_cache(maxsize=DIFF_CACHE)
def _diff(change_json: str) -> tuple[str, ...]:
    before, after = json.loads(change_json)
    return tuple(diff_lines(before, after))


def _change_diff(change: dict) -> list[str]:
    """The diff of a change; a controller repeats the same change often, so equal ones are diffed once."""
    try:
        key = json.dumps([change.get("before"), change.get("after")], sort_keys=True)
    except (TypeError, ValueError):          # keys that do not sort: diff it as it is
        return diff_lines(change.get("before"), change.get("after"))
    return list(_diff(key))


def _action_row(rec: dict, cause: dict | None) -> dict:
    change = rec.get("change") if isinstance(rec.get("change"), dict) else None
    row = {"step": rec.get("step"), "actuator": rec.get("actuator"), "params": rec.get("params"),
           "outcome": rec.get("outcome"), "journal_id": rec.get("journal_id"), "error": rec.get("error"),
           "summary": (change or {}).get("summary"), "has_change": change is not None,
           "before": (change or {}).get("before"), "after": (change or {}).get("after"),
           "diff": _change_diff(change) if change else [],
           "note": rec.get("note"), "attributed": bool(rec.get("attributed")),
           "trigger": None, "cause": None, "evidence": [], "evidence_text": []}
    if cause is not None:
        row.update(trigger=cause["trigger"], evidence=cause["evidence"], evidence_text=cause["evidence_text"],
                   cause=f"{cause['from']} -> {cause['to']}")
    return row


def iter_decisions(audit: Audit) -> Iterator[dict]:
    """Transitions and actions of the whole trail, run by run, in time order (file order on ties)."""
    last_transition = {}
    clock = Clock(audit.wall_clock)
    events = audit.event_records()
    if not audit.events_in_order:
        events = iter(sorted(events, key=lambda r: (r["run"], r["ts"])))
    for rec in events:
        key = (rec["run"], rec["policy"], rec["rule"], str(rec.get("target") or "*"))
        row = {"ts": rec["ts"], "time": clock.at(rec["ts"]), "kind": rec["kind"], "run": key[0],
               "policy": key[1], "rule": key[2], "target": key[3], "mode": rec.get("mode")}
        if rec["kind"] == "transition":
            row.update(_transition_row(rec))
            last_transition[key] = row
        else:
            row.update(_action_row(rec, last_transition.get(key)))
        yield row


def is_dry_run_change(row: dict) -> bool:
    """An action a dry-run or alert-only run held back: what enforcing would have changed."""
    return row["kind"] == "action" and row.get("outcome") in DRY_RUN_OUTCOMES


@dataclass
class DecisionLog:
    """What the pages show of the decision log: its first ``cap`` rows and its
    first ``cap`` held-back actions, with how many there are in all."""

    cap: int
    rows: list[dict] = field(default_factory=list)
    dry_run: list[dict] = field(default_factory=list)
    total: int = 0
    dry_run_total: int = 0

    def add(self, row: dict) -> bool:
        """Count ``row``, keep it while there is room; True when it is a held-back action."""
        self.total += 1
        if len(self.rows) < self.cap:
            self.rows.append(row)
        dry = is_dry_run_change(row)
        if dry:
            self.dry_run_total += 1
            if len(self.dry_run) < self.cap:
                self.dry_run.append(row)
        return dry


def limit_groups(audit: Audit) -> list[dict]:
    """One entry per (run, policy, rule, target, reason) with count and first/last time."""
    groups: dict[tuple, dict] = {}
    for rec in sorted(audit.limits, key=lambda r: (r.get("run", 1), r["ts"])):
        key = (rec.get("run", 1), rec["policy"], rec["rule"], str(rec.get("target") or "*"),
               str(rec.get("reason") or "?"))
        group = groups.get(key)
        if group is None:
            groups[key] = {"run": key[0], "policy": key[1], "rule": key[2], "target": key[3], "reason": key[4],
                           "count": 1, "first": rec["ts"], "last": rec["ts"]}
        else:
            group["count"] += 1
            group["last"] = rec["ts"]
    return list(groups.values())
