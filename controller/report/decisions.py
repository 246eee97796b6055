"""The decision log: every transition and action, with why and what it changed.

Each row carries its time, the rule and target, the trigger and evidence (an
action inherits them from the transition that led to it), the mode, the outcome
and the change as ``before``/``after`` plus a unified diff. ``dry_run_changes``
picks what dry-run and alert-only runs would have done; ``limit_groups`` folds
``limit`` records into one line per (rule, target, reason).

Example::

    rows = decisions(audit)
    [r for r in rows if r["kind"] == "action" and r["outcome"] == "applied"]
    dry_run_changes(rows)     # planned / alerted / would-revert actions only

Overhead: linear in the number of transitions and actions.
"""
from __future__ import annotations

from .audit import Audit
from .fmt import Clock, diff_lines, evidence_text

DRY_RUN_OUTCOMES = ("planned", "alerted", "would-revert")


def _evidence(items) -> list[dict]:
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def _transition_row(rec: dict) -> dict:
    evidence = _evidence(rec.get("evidence"))
    return {"from": rec.get("from"), "to": rec.get("to"), "trigger": rec.get("trigger"),
            "note": rec.get("note"), "evidence": evidence,
            "evidence_text": [evidence_text(i) for i in evidence]}


def _action_row(rec: dict, cause: dict | None) -> dict:
    change = rec.get("change") if isinstance(rec.get("change"), dict) else None
    row = {"step": rec.get("step"), "actuator": rec.get("actuator"), "params": rec.get("params"),
           "outcome": rec.get("outcome"), "journal_id": rec.get("journal_id"), "error": rec.get("error"),
           "summary": (change or {}).get("summary"), "has_change": change is not None,
           "before": (change or {}).get("before"), "after": (change or {}).get("after"),
           "diff": diff_lines(change.get("before"), change.get("after")) if change else [],
           "trigger": None, "cause": None, "evidence": [], "evidence_text": []}
    if cause is not None:
        row.update(trigger=cause["trigger"], evidence=cause["evidence"], evidence_text=cause["evidence_text"],
                   cause=f"{cause['from']} -> {cause['to']}")
    return row


def decisions(audit: Audit) -> list[dict]:
    """Transitions and actions of the whole trail in time order (file order on ties)."""
    rows, last_transition = [], {}
    clock = Clock(audit.wall_clock)
    for rec in sorted(audit.events, key=lambda r: r["ts"]):
        key = (rec["policy"], rec["rule"], str(rec.get("target") or "*"))
        row = {"ts": rec["ts"], "time": clock.at(rec["ts"]), "kind": rec["kind"],
               "policy": key[0], "rule": key[1], "target": key[2], "mode": rec.get("mode")}
        if rec["kind"] == "transition":
            row.update(_transition_row(rec))
            last_transition[key] = row
        else:
            row.update(_action_row(rec, last_transition.get(key)))
        rows.append(row)
    return rows


def dry_run_changes(rows: list[dict]) -> list[dict]:
    """The actions a dry-run or alert-only run held back: what enforcing would have changed."""
    return [r for r in rows if r["kind"] == "action" and r.get("outcome") in DRY_RUN_OUTCOMES]


def limit_groups(audit: Audit) -> list[dict]:
    """One entry per (policy, rule, target, reason) with count and first/last time."""
    groups: dict[tuple, dict] = {}
    for rec in sorted(audit.limits, key=lambda r: r["ts"]):
        key = (rec["policy"], rec["rule"], str(rec.get("target") or "*"), str(rec.get("reason") or "?"))
        group = groups.get(key)
        if group is None:
            groups[key] = {"policy": key[0], "rule": key[1], "target": key[2], "reason": key[3],
                           "count": 1, "first": rec["ts"], "last": rec["ts"]}
        else:
            group["count"] += 1
            group["last"] = rec["ts"]
    return list(groups.values())
