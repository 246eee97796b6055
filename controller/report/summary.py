"""What happened, per run, rule and target, in numbers: the summary every report shares.

``summarize`` reduces an audit trail to one row per (run, policy, rule,
target): final state, firings, actions by outcome (the outcome names of the
audit: ``applied``, ``planned``, ``alerted``, ``notified``, ...), how often
dry-run/alert-only would have acted, the time from the breach that led to the
first action to that action and to ``remediated``, and a one-line verdict. A
file with several controller runs gets a summary per run (``runs``), each
checked against that run's own ``end`` record. ``format_summary_table`` prints
it for a terminal: the targets that did something, and one line per rule for
those that never fired.

Example::

    summary = summarize(load_audit("audit.jsonl"))     # or any iterable of record dicts
    print(format_summary_table(summary))
    summary["rules"][0]["verdict"]   # 'fired 1x; applied 1; remediated 34.0 s after the breach; remediated at the end'
    summary["runs"][1]["warnings"]   # what is wrong with the second run alone

Overhead: linear in the number of transitions and actions (evaluations are already folded).
"""
from __future__ import annotations

import bisect
from collections import Counter
from typing import Iterable

from reflexarc.core.outcomes import WOULD_HAVE_ACTED, Outcome

from .audit import Audit, Run, Track
from .fmt import Clock, duration, plural

# every action outcome the audit writes (docs/audit-format.md), in the order the pages list them
OUTCOMES = (Outcome.APPLIED, Outcome.PLANNED, Outcome.ALERTED, Outcome.NOTIFIED, Outcome.NOOP, Outcome.FAILED,
            Outcome.REFUSED, Outcome.REVERTED, Outcome.WOULD_REVERT, Outcome.KEPT, Outcome.ADOPTED,
            Outcome.TARGET_GONE, Outcome.RESOLVED)
OUTCOME_MEANING = {
    Outcome.APPLIED: "enforce: the change was made",
    Outcome.PLANNED: "dry-run: the change it would have made",
    Outcome.ALERTED: "alert-only: an alert instead of the change",
    Outcome.NOTIFIED: "an alert or log action was sent",
    Outcome.NOOP: "already in the desired state",
    Outcome.FAILED: "the actuator failed",
    Outcome.REFUSED: "enforce: the fleet budget gave no slot, nothing was changed",
    Outcome.REVERTED: "a change undone",
    Outcome.WOULD_REVERT: "dry-run: the undo it would have done",
    Outcome.KEPT: "rollback never: the change stays",
    Outcome.ADOPTED: "a restarted controller kept a change from its journal",
    Outcome.TARGET_GONE: "the process or object the change was for is gone",
    Outcome.RESOLVED: "an alert this rule raised, resolved",
}
ROLLBACK_OUTCOMES = (Outcome.REVERTED, Outcome.WOULD_REVERT, Outcome.KEPT, Outcome.TARGET_GONE, Outcome.RESOLVED,
                     Outcome.ADOPTED)
MANUAL_POLICY = "manual"


def outcome_order(outcome: str) -> int:
    return OUTCOMES.index(outcome) if outcome in OUTCOMES else len(OUTCOMES)


def ordered_outcomes(counts: dict) -> list[tuple[str, int]]:
    """(outcome, count) for the outcomes that occurred, in the pages' order."""
    return sorted(((o, n) for o, n in counts.items() if n), key=lambda kv: (outcome_order(kv[0]), kv[0]))


def declared_rules(run: Run) -> list[tuple[str, dict]]:
    """(policy name, rule dict) for every rule the run declared (its ``run``
    record, then successful reloads), in that order."""
    out = []
    for policy in run.policies.values():
        out.extend((str(policy.get("name")), rule) for rule in policy.get("rules") or () if isinstance(rule, dict))
    return out


def _ordered_tracks(run: Run) -> list[Track]:
    order = {}
    for i, (policy, rule) in enumerate(declared_rules(run)):
        order.setdefault((policy, str(rule.get("name"))), i)
    return sorted(run.tracks.values(),
                  key=lambda t: (order.get((t.policy, t.rule), len(order)), t.policy, t.rule, t.target))


def declared_modes(run: Run) -> dict[str, str]:
    """Policy name -> the mode it ran in, from the ``run`` record (override applied)."""
    override = (run.run or {}).get("mode_override")
    return {name: str(override or p.get("mode") or "?") for name, p in run.policies.items()}


def _track_mode(track: Track, declared: dict[str, str]) -> str:
    for rec in reversed(track.actions + track.transitions):
        if isinstance(rec.get("mode"), str):
            return rec["mode"]
    return declared.get(track.policy, "?")


def episodes(transitions: list[dict]) -> list[tuple[float, float]]:
    """(onset, fired) of each firing: onset is the ``pending`` that led to it
    (the last one not cleared before it fired), or the firing itself."""
    out, pending = [], None
    for t in transitions:
        to = t.get("to")
        if to == "pending":
            pending = t["ts"]
        elif to == "ok" and t.get("from") in ("pending", "firing"):
            pending = None
        elif to == "firing":
            out.append((pending if pending is not None else t["ts"], t["ts"]))
            pending = None
    return out


def _onset_of(eps: list[tuple[float, float]], fired: list[float], ts: float) -> float | None:
    i = bisect.bisect_right(fired, ts) - 1
    return eps[i][0] if i >= 0 else None


def _row(track: Track, declared: dict[str, str], complete: bool) -> dict:
    transitions = sorted(track.transitions, key=lambda r: r["ts"])
    actions = sorted(track.actions, key=lambda r: r["ts"])
    outcomes = Counter(str(a.get("outcome") or "?") for a in actions)
    eps = episodes(transitions)
    fired = [e[1] for e in eps]
    first = next(((a["ts"], o) for a in actions
                  if a.get("outcome") not in ROLLBACK_OUTCOMES
                  and (o := _onset_of(eps, fired, a["ts"])) is not None), None)
    remediated = next((t["ts"] for t in transitions if t.get("to") == "remediated"), None)
    remediated_onset = _onset_of(eps, fired, remediated) if remediated is not None else None
    onset = first[1] if first else (eps[0][0] if eps else (transitions[0]["ts"] if transitions else None))
    final = str(transitions[-1].get("to") or "?") if transitions else (track.last_eval_state or "ok")
    row = {
        "run": track.run, "policy": track.policy, "rule": track.rule, "target": track.target,
        "target_labels": track.labels, "mode": _track_mode(track, declared),
        "final_state": final, "evals": track.evals, "transitions": len(transitions),
        "firings": len(eps),
        "actions": dict(sorted(outcomes.items())),
        "actuators": sorted({str(a.get("actuator") or "?") for a in actions}),
        "would_have_acted": sum(outcomes[o] for o in WOULD_HAVE_ACTED),
        "limits": dict(sorted(Counter(str(lim.get("reason") or "?") for lim in track.limits).items())),
        "errors": track.errors,
        "onset": onset,
        "first_action_s": first[0] - first[1] if first else None,
        "remediated_s": remediated - remediated_onset if remediated_onset is not None else None,
        "retired_at": track.retired_at,
        "active": track.active,
    }
    row["verdict"] = verdict(row, complete)
    return row


def verdict(row: dict, complete: bool = True) -> str:
    """One line a person reads first: what the rule did for this target, in the audit's words."""
    acts = row["actions"]
    if row["transitions"] == 0 and not acts and not row.get("errors"):
        gone = "; target gone" if row.get("retired_at") is not None else ""
        return f"never fired ({plural(row['evals'], 'evaluation')}){gone}"
    parts = [f"fired {row['firings']}x"] if row["firings"] else [f"reached {row['final_state']}"]
    parts += [f"{outcome} {n}" for outcome, n in ordered_outcomes(acts)]
    if row["limits"]:
        parts.append("held back " + ", ".join(f"{n}x {r}" for r, n in row["limits"].items()))
    if row.get("errors"):
        parts.append(f"raised {row['errors']}x")
    if row["remediated_s"] is not None:
        parts.append(f"remediated {duration(row['remediated_s'])} after the breach")
    end = "when the audit stops" if not complete else "at the end"
    parts.append(f"{row['final_state']} {end}")
    return "; ".join(parts)


def _counts(run_or_runs, rows: list[dict]) -> dict:
    runs = run_or_runs if isinstance(run_or_runs, list) else [run_or_runs]
    outcomes = Counter(str(a.get("outcome") or "?") for run in runs for a in run.actions)
    return {
        "records": sum(r.record_count for r in runs), "evals": sum(r.evals for r in runs),
        "transitions": sum(len(r.transitions) for r in runs),
        "actions": dict(sorted(outcomes.items())),
        "would_have_acted": sum(outcomes[o] for o in WOULD_HAVE_ACTED),
        "limits": dict(sorted(Counter(str(lim.get("reason") or "?") for r in runs for lim in r.limits).items())),
        "errors": sum(len(r.errors) for r in runs),
        "targets": len(rows), "active_targets": sum(1 for row in rows if row["active"]),
        "retired": sum(r.retired for r in runs),
        "reloads": sum(len(r.reloads) for r in runs),
    }


def _manual_only(run: Run) -> bool:
    return run.run is None and run.end is None and all(t.policy == MANUAL_POLICY for t in run.tracks.values())


def _run_warnings(audit: Audit, run: Run, counts: dict, clock: Clock) -> list[str]:
    out = []
    following = audit.runs[run.index] if run.index < len(audit.runs) else None
    if run.run is None and not _manual_only(run):
        if run.index == 1:
            out.append("no `run` record: source, modes and policies are unknown (the start of this run may "
                       "be in a rotated file no longer here)")
        else:
            out.append(f"records after the `end` of run {run.index - 1} without a `run` record of their own")
    if run.record_count and not run.complete and not _manual_only(run):
        if following is not None and following.run is not None:
            out.append(f"no `end` record before the next start at {clock.stamp(following.first_ts)} (last record "
                       f"at {clock.stamp(run.last_ts)}): the controller stopped without finishing (crash or kill)")
        else:
            out.append(f"the audit ends without an `end` record (last record at {clock.stamp(run.last_ts)}): "
                       "the controller stopped before finishing (crash or kill); counts cover what it wrote")
    end = (run.end or {}).get("summary")
    if isinstance(end, dict) and run.run is not None:
        claims = {"transitions": counts["transitions"], "would_have_acted": counts["would_have_acted"],
                  Outcome.APPLIED: counts["actions"].get(Outcome.APPLIED, 0),
                  Outcome.REVERTED: counts["actions"].get(Outcome.REVERTED, 0)}
        for name, seen in claims.items():
            if name in end and end[name] != seen:
                out.append(f"the controller's end summary says {name}={end[name]}, the records show {seen}")
        if isinstance(end.get("actions"), dict) and end["actions"] != counts["actions"]:
            out.append(f"the controller's end summary says actions={end['actions']}, "
                       f"the records show {counts['actions']}")
    seen_rules = {(t.policy, t.rule) for t in run.tracks.values()}
    for policy, rule in declared_rules(run):
        if (policy, str(rule.get("name"))) not in seen_rules:
            out.append(f"rule {policy}/{rule.get('name')} was never evaluated")
    return out


def _file_warnings(audit: Audit) -> list[str]:
    out = []
    if audit.record_count == 0:
        out.append("the audit holds no readable record")
    if audit.malformed_count:
        first = audit.malformed[0]
        out.append(f"{audit.malformed_count} malformed line(s) skipped "
                   f"(first: line {first['line']}, {first['reason']})")
    for kind, n in sorted(audit.unknown_kinds.items()):
        out.append(f"{n} record(s) of unknown kind '{kind}' ignored")
    for f in audit.forgotten:
        out.append(f"journal entry {f['journal_id']} ({f['actuator']}: {f['summary']}) was forgotten by uid "
                   f"{f['user']}, not reverted: {f['reason']}")
    return out


def _by(rec: dict) -> str:
    by = rec.get("by") or {}
    return f"uid {by.get('uid', '?')}" if by else "itself"


def _hands(audit: Audit, clock: Clock) -> list[str]:
    """What an operator did, what held enforcement and what the fleet's rollouts did, in the order it happened."""
    out = []
    for rec in audit.hands:
        kind, at = rec["kind"], clock.at(rec["ts"])
        if kind == "kill_switch":
            out.append(f"{at} kill switch {'engaged' if rec.get('engaged') else 'released'} ({rec.get('path')})"
                       + (": no change was made while it was" if rec.get("engaged") else ""))
        elif kind == "pause":
            length = f" for {rec['duration']:g} s" if isinstance(rec.get("duration"), (int, float)) else ""
            out.append(f"{at} enforcement paused{length} by {_by(rec)}: {rec.get('reason')}")
        elif kind == "resume":
            out.append(f"{at} enforcement resumed by {_by(rec)}: {rec.get('reason')}")
        elif kind == "operator":
            done = ", ".join(f"{r.get('id')} {r.get('outcome')}" for r in rec.get("results") or []) or "nothing"
            out.append(f"{at} {rec.get('verb')} by {_by(rec)}: {done}")
        elif kind == "drift":
            out.append(f"{at} journal entry {rec.get('journal_id')} ({rec.get('actuator')}) was changed behind the "
                       f"controller's back: {rec.get('differs')}")
        elif kind == "rollout" and rec.get("event") == "opened":
            alert = rec.get("alert") or {}
            out.append(f"{at} the fleet breaker of {rec.get('policy')} opened: {rec.get('detail')}; no node enforces "
                       f"it until 'reflexarc fleet reset' (alert: {alert.get('error') or alert.get('outcome')})")
        elif kind == "rollout":
            out.append(f"{at} the fleet rollout of {rec.get('policy')} widened: {rec.get('detail')}")
    return out


def _run_summary(audit: Audit, run: Run, rows: list[dict], clock: Clock) -> dict:
    declared = declared_modes(run)
    counts = _counts(run, rows)
    modes = list(dict.fromkeys([*declared.values(), *(r["mode"] for r in rows)]))
    start, end = run.first_ts, run.last_ts
    return {
        "index": run.index, "source": run.source if run.run is not None else
        ("manual" if _manual_only(run) else "unknown"),
        "started_at": (run.run or {}).get("started_at"),
        "mode_override": (run.run or {}).get("mode_override"),
        "modes": [m for m in modes if m != "?"],
        "start": start, "end": end,
        "duration": end - start if start is not None and end is not None else None,
        "complete": run.complete, "has_run_record": run.run is not None,
        "counts": counts,
        "end_summary": (run.end or {}).get("summary"),
        "reloads": run.reloads,
        "warnings": _run_warnings(audit, run, counts, clock),
    }


def summarize(records: Iterable[dict] | Audit) -> dict:
    """The summary of an audit trail given as record dicts (in file order), an
    ``AuditFile`` or an already folded ``Audit``."""
    audit = records if isinstance(records, Audit) else Audit.from_records(records)
    clock = Clock(audit.wall_clock)
    rows, runs = [], []
    for run in audit.runs:
        declared = declared_modes(run)
        run_rows = [_row(t, declared, run.complete) for t in _ordered_tracks(run)]
        runs.append(_run_summary(audit, run, run_rows, clock))
        rows += run_rows
    counts = _counts(audit.runs, rows)
    counts["malformed"] = audit.malformed_count
    warnings = _file_warnings(audit)
    several = len(runs) > 1
    for run in runs:
        warnings += [f"run {run['index']}: {w}" if several else w for w in run["warnings"]]
    modes = list(dict.fromkeys(m for run in runs for m in run["modes"]))
    first = next((r for r in runs if r["has_run_record"]), runs[0] if runs else None)
    start, end = audit.first_ts, audit.last_ts
    return {
        "source": audit.source,
        "started_at": first["started_at"] if first else None,
        "mode_override": first["mode_override"] if first else None,
        "modes": modes,
        "wall_clock": audit.wall_clock,
        "start": start, "end": end,
        "duration": end - start if start is not None and end is not None else None,
        "complete": audit.complete,
        "counts": counts,
        "end_summary": (audit.end or {}).get("summary"),
        "warnings": warnings,
        "file_warnings": _file_warnings(audit),
        "hands": _hands(audit, clock),
        "runs": runs,
        "rules": rows,
    }


def quiet_groups(rows: list[dict]) -> list[dict]:
    """One entry per (run, policy, rule) for its targets that never fired: how
    many, their evaluations, how many are gone (retired)."""
    groups: dict[tuple, dict] = {}
    for r in rows:
        if r["active"]:
            continue
        key = (r["run"], r["policy"], r["rule"])
        g = groups.get(key)
        if g is None:
            g = groups[key] = {"run": key[0], "policy": key[1], "rule": key[2], "mode": r["mode"], "targets": 0,
                               "evals": 0, "retired": 0, "examples": []}
        g["targets"] += 1
        g["evals"] += r["evals"]
        g["retired"] += r["retired_at"] is not None
        if len(g["examples"]) < 3:
            g["examples"].append(r["target"])
    return list(groups.values())


def quiet_line(g: dict) -> str:
    """'dataloader-io / worker-read-slow: 404 targets never fired (1,212 evaluations; 398 gone), e.g. pid=1, pid=2'."""
    n = g["targets"]
    gone = f"; {g['retired']:,} gone" if g["retired"] else ""
    examples = ", ".join(g["examples"]) + (", ..." if n > len(g["examples"]) else "")
    return (f"{g['policy']} / {g['rule']}: {plural(n, 'target')} never fired "
            f"({plural(g['evals'], 'evaluation')}{gone}), e.g. {examples}")


def _actions_cell(actions: dict) -> str:
    return " ".join(f"{k}:{v}" for k, v in ordered_outcomes(actions)) or "-"


def counts_line(c: dict) -> str:
    """'10 transitions; applied 2, notified 1, reverted 2; 3 held back' in the audit's outcome names."""
    acts = ", ".join(f"{o} {n}" for o, n in ordered_outcomes(c["actions"])) or "no action"
    held = sum(c["limits"].values())
    return f"{c['transitions']} transitions; {acts}" + (f"; {held} held back" if held else "")


def format_summary_table(summary: dict) -> str:
    """A plain-text table of the targets that did something (aligned columns), one
    line per rule for the targets that never fired, then totals and warnings."""
    header = ("POLICY", "RULE", "TARGET", "MODE", "STATE", "FIRED", "ACTIONS", "WOULD-ACT",
              "1ST-ACTION", "REMEDIATED")
    several = len(summary.get("runs") or ()) > 1
    if several:
        header = ("RUN",) + header
    active = [r for r in summary["rules"] if r["active"]]
    rows = [((str(r["run"]),) if several else ()) + (
             r["policy"], r["rule"], r["target"], r["mode"], r["final_state"], str(r["firings"]),
             _actions_cell(r["actions"]), str(r["would_have_acted"]),
             duration(r["first_action_s"]), duration(r["remediated_s"])) for r in active]
    widths = [max(len(cells[i]) for cells in [header, *rows]) for i in range(len(header))]
    numeric = {i + several for i in (5, 7, 8, 9)}
    lines = ["  ".join(c.rjust(w) if i in numeric else c.ljust(w)
                       for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
             for cells in [header, *rows]]
    if not summary["rules"]:
        lines.append("(no rule was evaluated)")
    elif not active:
        lines.append("(no target fired)")
    for g in quiet_groups(summary["rules"]):
        lines.append((f"run {g['run']}: " if several else "") + quiet_line(g))
    for run in summary.get("runs") or ():
        label = f"run {run['index']} ({run['source']})" if several else summary["source"]
        lines.append(f"{label}: {counts_line(run['counts'])}")
    lines.extend(f"! {w}" for w in summary["warnings"])
    return "\n".join(lines)
