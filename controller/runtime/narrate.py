"""What the controller does, told as it happens: one short line per audited
event on stderr (journald keeps it), without ``-v``.

A ``Narrator`` listens to the audit log (``AuditLog(listeners=[...])``) and
turns each record into one line: when, the policy/rule, the target (its
``job``, ``rank`` and ``pod`` where its labels have them, else its key), what
changed (``ok -> pending``; ``sysctl applied: kernel.numa_balancing 1 -> 0``)
and the evidence in a few words (``step_time_ms 374 > 1.5x baseline 183``; a
condition that does not hold shows the negated operator: ``<= 300``). Node
events are told too: the start and the stop, reloads, limits (the kill switch
among them), the kill switch and pauses, an operator's rollbacks, changes
found altered behind the controller's back (``drift``), errors and journal
entries forgotten by hand. What ``run`` reconciled at start (actions noted
``reconciled at start``) is not told again: ``run`` prints it before the
audit opens, so it is said even when the audit cannot be written.

Every kind of record is told except those in ``QUIET``: ``eval`` (one per
rule-target and tick on the way to acting) and ``retire`` (bookkeeping of a
target whose series stopped while it held nothing). A kind without words of
its own here is told as its kind and fields, so no audited event is silent.

``--log-format json`` writes each event as one JSON object instead
(``ts``, ``level``, ``logger``, ``kind``, ``msg`` and the event's fields), and
``JsonFormatter`` writes the process's log records with the same ``ts``,
``level``, ``logger`` and ``msg``: a log shipper reads one format.
``configure_logging`` sets the process's logging up: warnings; ``-v`` adds
reflexarc's INFO lines; ``-vv`` everything at DEBUG, the ``transitions``
library's records included (kept at WARNING otherwise).

Example::

    audit = AuditLog(path, clock, listeners=[Narrator("text")])
    audit.write("transition", policy="slow-steps", rule="step-time", target="job=llama,rank=1",
                target_labels={"job": "llama", "rank": "1"}, ...)
    # 2024-05-02 14:03:11 slow-steps/step-time job=llama rank=1: ok -> pending: step_time_ms 500 > 300

Overhead: per record told, a few string formats and one write to stderr;
nothing per tick.
"""
from __future__ import annotations

import json
import logging
import math
import re
import sys
import time
from datetime import datetime, timezone

from reflexarc.core.outcomes import Outcome

from ..policy.model import change_words

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
LOGGER = "reflexarc.events"         # the ``logger`` of events in JSON
QUIET = frozenset({"eval", "retire"})
RECONCILED = "reconciled at start"  # the note of actions ``run`` already printed
TARGET_LABELS = ("job", "rank", "pod")
EVIDENCE_SHOWN = 2                  # evidence items on one line; the rest are counted
SUMMARY_CHARS = 160                 # of a change's summary on one line (the audit has all of it)
NEGATED = {">": "<=", ">=": "<", "<": ">=", "<=": ">", "==": "!=", "!=": "=="}
FACTOR = re.compile(r"(\S+)x baseline$")
LIMITS = {
    "kill_switch": "the kill switch is engaged: not acting until it is removed",
    "paused": "enforcement is paused (reflexarc pause): not acting until resumed",
    "cooldown": "cooling down: not acting yet",
    "max_actions": "the rule's max_actions is reached: not acting",
    "max_active": "the node already holds its --max-active remediations: not acting",
    "actions_per_hour": "the node's changes this hour (--actions-per-hour) are spent: not acting",
    "no_data": "its signals are silent: the change is held, not read as cleared",
}


def _number(value) -> str:
    value = float(value)
    if not math.isfinite(value):
        return str(value)
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def evidence_text(item) -> str:
    """One evidence item in a few words: ``step_time_ms 374 > 1.5x baseline 183``."""
    if not isinstance(item, dict):
        return str(item)
    signal = item.get("signal") or item.get("condition") or "?"
    if item.get("agg") == "change":
        return f"{signal} {change_words(item, _number)}"
    if item.get("value") is None:
        return f"{signal} no data"
    op = item.get("op") or "?"
    if not item.get("ok"):
        op = NEGATED.get(op, f"not {op}")
    threshold, baseline = item.get("threshold"), item.get("baseline")
    factor = FACTOR.search(item.get("condition") or "")
    if baseline is not None:
        shown = factor.group(1) if factor else f"{threshold / baseline:g}" if baseline else "?"
        rhs = f"{shown}x baseline {_number(baseline)}"
    elif threshold is None:
        return f"{signal} {_number(item['value'])} (no baseline yet)"
    else:
        rhs = _number(threshold)
    return f"{signal} {_number(item['value'])} {op} {rhs}"


def evidence_words(items) -> str:
    """The items that hold (what breached or verified), else all, at most ``EVIDENCE_SHOWN``."""
    items = [i for i in (items or []) if i is not None]
    holding = [i for i in items if isinstance(i, dict) and i.get("ok")]
    shown = holding or items
    text = ", ".join(evidence_text(i) for i in shown[:EVIDENCE_SHOWN])
    return text + (f" (+{len(shown) - EVIDENCE_SHOWN} more)" if len(shown) > EVIDENCE_SHOWN else "")


def target_text(rec: dict) -> str:
    """``job=llama rank=1`` from the target's labels, else the target key."""
    labels = rec.get("target_labels") or {}
    named = [f"{k}={labels[k]}" for k in TARGET_LABELS if labels.get(k) not in (None, "")]
    return " ".join(named) or str(rec.get("target") or "")


def _subject(rec: dict) -> str:
    if rec.get("policy") or rec.get("rule"):
        who = f"{rec.get('policy') or '?'}/{rec.get('rule') or '?'}"
    elif rec.get("journal_id"):
        who = f"journal {rec['journal_id']}"
    else:
        who = "reflexarc"
    target = target_text(rec)
    return f"{who} {target}" if target else who


def _names(names, most: int = 6) -> str:
    names = list(names or [])
    return ", ".join(names) if len(names) <= most else f"{', '.join(names[:most])} and {len(names) - most} more"


def _transition(rec: dict) -> str:
    text = f"{rec.get('from')} -> {rec.get('to')}"
    if rec.get("note"):
        text += f" ({rec['note']})"
    evidence = evidence_words(rec.get("evidence"))
    return f"{_subject(rec)}: {text}" + (f": {evidence}" if evidence else "")


def _action(rec: dict) -> str:
    text = f"{rec.get('actuator') or '?'} {rec.get('outcome')}"
    summary = (rec.get("change") or {}).get("summary")
    if summary:
        text += f": {summary[:SUMMARY_CHARS - 3]}..." if len(summary) > SUMMARY_CHARS else f": {summary}"
    if rec.get("error"):
        text += f"; error: {rec['error']}"
    if rec.get("note"):
        text += f" ({rec['note']})"
    return f"{_subject(rec)}: {text}"


def _run(rec: dict) -> str:
    policies = rec.get("policies") or []
    override = rec.get("mode_override")
    names = _names(p.get("name") if override else f"{p.get('name')} ({p.get('mode')})" for p in policies)
    return (f"reflexarc started ({rec.get('source')}): {len(policies)} polic{'y' if len(policies) == 1 else 'ies'}"
            + (f" in {override}" if override else "") + (f": {names}" if names else ""))


RELOAD_REFUSED = "refused"    # a reload's outcome, spelled as Outcome.REFUSED but not an action's


def _reload(rec: dict) -> str:
    if rec.get("outcome") == RELOAD_REFUSED:
        errors = rec.get("errors") or []
        first = f"; first: {errors[0]}" if errors else ""
        return (f"reflexarc reload refused ({rec.get('reason')}): {len(errors)} error(s){first}; "
                f"still running {_names(rec.get('running')) or 'no policy'}")
    parts = [f"{key} {_names(rec.get(key))}" for key in ("added", "removed", "changed") if rec.get(key)]
    return f"reflexarc policies reloaded ({rec.get('reason')}): {'; '.join(parts) or 'no rule changed'}"


def _limit(rec: dict) -> str:
    reason = rec.get("reason")
    return f"{_subject(rec)}: limit {reason}: {LIMITS.get(reason, 'held back')}"


def _error(rec: dict) -> str:
    return f"{_subject(rec)}: error in {rec.get('state') or 'its run'}: {rec.get('error')}; it goes to failed"


def _forget(rec: dict) -> str:
    return (f"journal {rec.get('journal_id')}: {rec.get('actuator')} forgotten by uid {rec.get('user')}, "
            f"not reverted: {rec.get('reason')}")


def _by(rec: dict) -> str:
    by = rec.get("by") or {}
    return f"uid {by.get('uid', '?')} (pid {by.get('pid', '?')})" if by else "itself"


def _kill_switch(rec: dict) -> str:
    if rec.get("engaged"):
        return (f"reflexarc kill switch engaged ({rec.get('path')}): no change is made, refreshes included, "
                "until it is removed; applied changes stay ('reflexarc rollback' reverts them)")
    return f"reflexarc kill switch released ({rec.get('path')}): enforcement resumes"


def _pause(rec: dict) -> str:
    until = "" if rec.get("duration") is None else f" for {_number(rec['duration'])} s"
    return f"reflexarc enforcement paused{until} by {_by(rec)}: {rec.get('reason')}"


def _resume(rec: dict) -> str:
    return (f"reflexarc enforcement resumed by {_by(rec)} after {_number(rec.get('paused_for'))} s: "
            f"{rec.get('reason')}")


def _operator(rec: dict) -> str:
    results = rec.get("results") or []
    what = "every open change" if rec.get("all") else f"journal {rec.get('id')}"
    done = ", ".join(f"{r.get('id')} {r.get('outcome')}" for r in results) or "nothing open"
    return f"reflexarc {rec.get('verb')} of {what} asked by {_by(rec)}: {done}"


def _drift(rec: dict) -> str:
    return (f"{_subject(rec)}: {rec.get('actuator')} changed behind the controller's back: {rec.get('differs')} "
            "('reflexarc rollback ID' restores what was there before it)")


def _rollout(rec: dict) -> str:
    if rec.get("event") == "opened":
        alert = rec.get("alert") or {}
        return (f"fleet breaker of {rec.get('policy')} OPENED by this node: {rec.get('detail')}; no node enforces "
                f"it until 'reflexarc fleet reset {rec.get('policy')} --reason TEXT' (alert: "
                f"{alert.get('error') or alert.get('outcome')})")
    return f"fleet rollout of {rec.get('policy')} widened to {rec.get('detail')}"


def _end(rec: dict) -> str:
    summary = rec.get("summary") or {}
    actions = ", ".join(f"{k} {v}" for k, v in sorted((summary.get("actions") or {}).items())) or "none"
    return f"reflexarc stopped: {summary.get('transitions', 0)} transition(s); actions: {actions}"


def _scalars(rec: dict) -> dict:
    return {k: v for k, v in rec.items()
            if k not in ("ts", "kind") and (v is None or isinstance(v, (str, int, float, bool)))}


def _other(rec: dict) -> str:
    fields = {k: v for k, v in _scalars(rec).items() if k not in ("policy", "rule", "target", "journal_id")}
    return f"{_subject(rec)}: {rec.get('kind')}" + (
        ": " + ", ".join(f"{k}={v}" for k, v in sorted(fields.items())) if fields else "")


TELLERS = {"transition": _transition, "action": _action, "run": _run, "reload": _reload, "limit": _limit,
           "error": _error, "forget": _forget, "end": _end, "kill_switch": _kill_switch, "pause": _pause,
           "resume": _resume, "operator": _operator, "drift": _drift, "rollout": _rollout}

FIELDS = {   # the fields of an event in JSON beyond ts, level, logger, kind, msg, policy, rule, target, labels
    "transition": ("from", "to", "trigger", "note"),
    "action": ("actuator", "outcome", "mode", "journal_id", "error", "note"),
    "run": ("source", "mode_override"),
    "reload": ("reason", "outcome", "added", "removed", "changed", "errors"),
    "limit": ("reason",),
    "error": ("error", "state"),
    "forget": ("journal_id", "actuator", "reason", "user"),
    "end": (),
    "kill_switch": ("engaged", "path"),
    "pause": ("reason", "duration", "by"),
    "resume": ("reason", "paused_for", "by"),
    "operator": ("verb", "by", "id", "all", "results"),
    "drift": ("journal_id", "actuator", "differs"),
    "rollout": ("event", "stage", "detail", "node", "alert"),
}


def describe(rec: dict) -> str | None:
    """The record in one line, without its time; None for a kind in ``QUIET``."""
    kind = rec.get("kind")
    if kind in QUIET or (kind == "action" and rec.get("note") == RECONCILED):
        return None
    return TELLERS.get(kind, _other)(rec)


def _level(rec: dict) -> str:
    kind, outcome = rec.get("kind"), rec.get("outcome")
    if kind == "error" or outcome == Outcome.FAILED or (kind == "reload" and outcome == RELOAD_REFUSED) \
            or (kind == "rollout" and rec.get("event") == "opened"):
        return "ERROR"
    if kind == "action" and outcome == Outcome.REFUSED:      # the fleet budget: nothing applied, tried again
        return "WARNING"
    return "WARNING" if kind in ("limit", "kill_switch", "pause", "drift") else "INFO"


def event(rec: dict, text: str) -> dict:
    """The record as one JSON event: its line (``msg``) and its fields."""
    kind = rec.get("kind")
    out = {"ts": _iso(rec.get("ts")), "level": _level(rec), "logger": LOGGER, "kind": kind, "msg": text}
    for key in ("policy", "rule", "target"):
        if rec.get(key):
            out[key] = rec[key]
    if rec.get("target_labels"):
        out["labels"] = rec["target_labels"]
    if kind not in FIELDS:
        out.update(_scalars(rec))
        return out
    out.update((key, rec[key]) for key in FIELDS[kind] if rec.get(key) not in (None, ""))
    if kind == "action" and (rec.get("change") or {}).get("summary"):
        out["summary"] = rec["change"]["summary"]
    if kind == "end":
        summary = rec.get("summary") or {}
        out.update(transitions=summary.get("transitions", 0), actions=summary.get("actions") or {})
    return out


def _iso(ts) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Narrator:
    """An audit listener that tells each record (``describe``) on ``stream``
    (stderr when None, looked up at each line), as text or JSON (``LOG_FORMATS``)."""

    def __init__(self, fmt: str = "text", stream=None) -> None:
        if fmt not in LOG_FORMATS:
            raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}")
        self.fmt = fmt
        self.stream = stream

    def __call__(self, rec: dict) -> None:
        text = describe(rec)
        if text is None:
            return
        if self.fmt == "json":
            line = json.dumps(event(rec, text), sort_keys=True, default=str)
        else:
            line = f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(rec.get('ts') or 0))} {text}"
        stream = self.stream or sys.stderr
        stream.write(line + "\n")
        stream.flush()


class JsonFormatter(logging.Formatter):
    """A log record as one JSON object: ``ts``, ``level``, ``logger``, ``msg``
    (and ``exc``, the traceback, when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": _iso(record.created), "level": record.levelname, "logger": record.name,
               "msg": record.getMessage()}
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, sort_keys=True, default=str)


def configure_logging(verbosity: int, fmt: str = "text") -> None:
    """The process's log records on stderr as ``fmt``: warnings; with
    ``verbosity`` 1 (``-v``) reflexarc's INFO lines too; 2 (``-vv``) every
    record at DEBUG, the ``transitions`` library's included."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    level = logging.DEBUG if verbosity >= 2 else logging.INFO if verbosity else logging.WARNING
    logging.basicConfig(level=level, handlers=[handler])
    logging.getLogger("transitions").setLevel(logging.NOTSET if verbosity >= 2 else logging.WARNING)
