"""What happened, per rule and target, in numbers: the summary every report shares.

``summarize`` reduces an audit trail to one row per (policy, rule, target): final
state, firings, actions by outcome, how often dry-run/alert-only would have acted,
time from the first state change to the first action and to ``remediated``, and
a one-line verdict. ``format_summary_table`` prints it for a terminal.

Example::

    summary = summarize(load_audit("audit.jsonl"))     # or any iterable of record dicts
    print(format_summary_table(summary))
    summary["rules"][0]["verdict"]   # 'fired 1x; applied 1; remediated 34.0 s after onset; remediated at the end'

Overhead: linear in the number of transitions and actions (evaluations are already folded).
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable

from .audit import Audit, Track
from .fmt import Clock, duration

WOULD_ACT = ("planned", "alerted")
HEADLINE_OUTCOMES = ("applied", "planned", "alerted", "reverted", "failed")


def declared_rules(audit: Audit) -> list[tuple[str, dict]]:
    """(policy name, rule dict) for every rule the ``run`` record lists, in its order."""
    out = []
    for policy in (audit.run or {}).get("policies") or ():
        if isinstance(policy, dict):
            out.extend((str(policy.get("name")), rule) for rule in policy.get("rules") or ()
                       if isinstance(rule, dict))
    return out


def _ordered_tracks(audit: Audit) -> list[Track]:
    order = {}
    for i, (policy, rule) in enumerate(declared_rules(audit)):
        order.setdefault((policy, str(rule.get("name"))), i)
    return sorted(audit.tracks.values(),
                  key=lambda t: (order.get((t.policy, t.rule), len(order)), t.policy, t.rule, t.target))


def declared_modes(audit: Audit) -> dict[str, str]:
    """Policy name -> the mode it ran in, from the ``run`` record (override applied)."""
    run = audit.run or {}
    override = run.get("mode_override")
    return {p.get("name"): str(override or p.get("mode") or "?")
            for p in run.get("policies") or () if isinstance(p, dict)}


def _track_mode(track: Track, declared: dict[str, str]) -> str:
    for rec in reversed(track.actions + track.transitions):
        if isinstance(rec.get("mode"), str):
            return rec["mode"]
    return declared.get(track.policy, "?")


def _row(track: Track, declared: dict[str, str], complete: bool) -> dict:
    transitions = sorted(track.transitions, key=lambda r: r["ts"])
    actions = sorted(track.actions, key=lambda r: r["ts"])
    outcomes = Counter(str(a.get("outcome") or "?") for a in actions)
    onset = transitions[0]["ts"] if transitions else None
    remediated = next((t["ts"] for t in transitions if t.get("to") == "remediated"), None)
    final = str(transitions[-1].get("to") or "?") if transitions else (track.last_eval_state or "ok")
    row = {
        "policy": track.policy, "rule": track.rule, "target": track.target,
        "target_labels": track.labels, "mode": _track_mode(track, declared),
        "final_state": final, "evals": track.evals, "transitions": len(transitions),
        "firings": sum(1 for t in transitions if t.get("to") == "firing"),
        "actions": dict(sorted(outcomes.items())),
        "actuators": sorted({str(a.get("actuator") or "?") for a in actions}),
        "would_have_acted": sum(outcomes[o] for o in WOULD_ACT),
        "limits": dict(sorted(Counter(str(lim.get("reason") or "?") for lim in track.limits).items())),
        "onset": onset,
        "first_action_s": actions[0]["ts"] - onset if actions and onset is not None else None,
        "remediated_s": remediated - onset if remediated is not None and onset is not None else None,
    }
    row["verdict"] = verdict(row, complete)
    return row


def verdict(row: dict, complete: bool = True) -> str:
    """One line a person reads first: what the rule did for this target."""
    acts = row["actions"]
    if row["transitions"] == 0 and not acts:
        return f"never fired ({row['evals']} evaluations)"
    parts = [f"fired {row['firings']}x"] if row["firings"] else [f"reached {row['final_state']}"]
    for outcome, words in (("applied", "applied"), ("failed", "failed"), ("reverted", "reverted"),
                           ("notified", "notified"), ("noop", "already in place")):
        if acts.get(outcome):
            parts.append(f"{words} {acts[outcome]}")
    if row["would_have_acted"]:
        parts.append(f"would have acted {row['would_have_acted']}x")
    if acts.get("would-revert"):
        parts.append(f"would have reverted {acts['would-revert']}")
    if row["limits"]:
        parts.append("held back " + ", ".join(f"{n}x {r}" for r, n in row["limits"].items()))
    if row["remediated_s"] is not None:
        parts.append(f"remediated {duration(row['remediated_s'])} after onset")
    end = "when the audit stops" if not complete else "at the end"
    parts.append(f"{row['final_state']} {end}")
    return "; ".join(parts)


def _warnings(audit: Audit, counts: dict, clock: Clock) -> list[str]:
    out = []
    if audit.run is None:
        out.append("no `run` record: source, modes and policies are unknown")
    if audit.record_count == 0:
        out.append("the audit holds no readable record")
    elif not audit.complete:
        out.append(f"the audit ends without an `end` record (last record at {clock.stamp(audit.last_ts)}): "
                   "the controller stopped before finishing (crash or kill); counts cover what it wrote")
    if audit.malformed_count:
        first = audit.malformed[0]
        out.append(f"{audit.malformed_count} malformed line(s) skipped (first: line {first['line']}, {first['reason']})")
    for kind, n in sorted(audit.unknown_kinds.items()):
        out.append(f"{n} record(s) of unknown kind '{kind}' ignored")
    end = (audit.end or {}).get("summary")
    if isinstance(end, dict):
        claims = {"transitions": counts["transitions"], "would_have_acted": counts["would_have_acted"],
                  "applied": counts["actions"].get("applied", 0), "reverted": counts["actions"].get("reverted", 0)}
        for name, seen in claims.items():
            if name in end and end[name] != seen:
                out.append(f"the controller's end summary says {name}={end[name]}, the records show {seen}")
        if isinstance(end.get("actions"), dict) and end["actions"] != counts["actions"]:
            out.append(f"the controller's end summary says actions={end['actions']}, "
                       f"the records show {counts['actions']}")
    seen_rules = {(t.policy, t.rule) for t in audit.tracks.values()}
    for policy, rule in declared_rules(audit):
        if (policy, str(rule.get("name"))) not in seen_rules:
            out.append(f"rule {policy}/{rule.get('name')} was never evaluated")
    return out


def summarize(records: Iterable[dict] | Audit) -> dict:
    """The summary of an audit trail given as record dicts (in file order), an
    ``AuditFile`` or an already folded ``Audit``."""
    audit = records if isinstance(records, Audit) else Audit.from_records(records)
    clock = Clock(audit.wall_clock)
    declared = declared_modes(audit)
    rows = [_row(t, declared, audit.complete) for t in _ordered_tracks(audit)]
    outcomes = Counter(str(a.get("outcome") or "?") for a in audit.actions)
    counts = {
        "records": audit.record_count, "evals": audit.evals, "transitions": len(audit.transitions),
        "actions": dict(sorted(outcomes.items())),
        "would_have_acted": sum(outcomes[o] for o in WOULD_ACT),
        "limits": dict(sorted(Counter(str(lim.get("reason") or "?") for lim in audit.limits).items())),
        "malformed": audit.malformed_count,
    }
    modes = list(dict.fromkeys([*declared.values(), *(r["mode"] for r in rows)]))
    start, end = audit.first_ts, audit.last_ts
    return {
        "source": audit.source,
        "started_at": (audit.run or {}).get("started_at"),
        "mode_override": (audit.run or {}).get("mode_override"),
        "modes": [m for m in modes if m != "?"],
        "wall_clock": audit.wall_clock,
        "start": start, "end": end,
        "duration": end - start if start is not None and end is not None else None,
        "complete": audit.complete,
        "counts": counts,
        "end_summary": (audit.end or {}).get("summary"),
        "warnings": _warnings(audit, counts, clock),
        "rules": rows,
    }


def _actions_cell(actions: dict) -> str:
    return " ".join(f"{k}:{v}" for k, v in actions.items()) or "-"


def format_summary_table(summary: dict) -> str:
    """A plain-text table with aligned columns, then totals and warnings."""
    header = ("POLICY", "RULE", "TARGET", "MODE", "STATE", "FIRED", "ACTIONS", "WOULD-ACT",
              "1ST-ACTION", "REMEDIATED")
    rows = [(r["policy"], r["rule"], r["target"], r["mode"], r["final_state"], str(r["firings"]),
             _actions_cell(r["actions"]), str(r["would_have_acted"]),
             duration(r["first_action_s"]), duration(r["remediated_s"])) for r in summary["rules"]]
    widths = [max(len(cells[i]) for cells in [header, *rows]) for i in range(len(header))]
    numeric = {5, 7, 8, 9}
    lines = ["  ".join(c.rjust(w) if i in numeric else c.ljust(w)
                       for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
             for cells in [header, *rows]]
    if not rows:
        lines.append("(no rule was evaluated)")
    c = summary["counts"]
    totals = " ".join(f"{o}={c['actions'].get(o, 0)}" for o in HEADLINE_OUTCOMES)
    lines.append(f"{summary['source']}: {c['transitions']} transitions, actions {totals}, "
                 f"would have acted {c['would_have_acted']}x, {sum(c['limits'].values())} held back")
    lines.extend(f"! {w}" for w in summary["warnings"])
    return "\n".join(lines)
