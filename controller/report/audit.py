"""Reading an audit trail (``audit.jsonl``, see ``docs/audit-format.md``) into one fold.

The reports never hold every record: ``eval`` records, by far the most numerous,
are folded into float arrays per condition as they are read; transitions, actions
and limits are kept as they are. Broken input never stops a report: lines that
are not JSON objects with a ``kind`` and a numeric ``ts`` are counted (with a few
examples), records of kinds this reader does not know are counted apart, and a
trail without an ``end`` record is reported as incomplete.

``Audit.records`` is where the fold came from and can be iterated again: an
``AuditFile`` re-reads the file on each pass, so nothing is held twice.

Example::

    audit = load_audit("runs/numa/audit.jsonl")
    audit.complete            # False when the controller died before writing `end`
    audit.malformed_count     # lines skipped
    for track in audit.tracks.values():   # one per (policy, rule, target)
        print(track.key, track.evals, len(track.actions))
    summarize(audit.records)  # a second pass over the file

Overhead: one pass over the file; about 32 bytes per evaluated condition.
"""
from __future__ import annotations

import json
import math
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from ..audit import rotated_paths

TRACKED_KINDS = ("eval", "transition", "action", "limit", "retire", "error")
KNOWN_KINDS = ("run", "end") + TRACKED_KINDS
MALFORMED_EXAMPLES = 20


def as_float(value) -> float | None:
    """A finite float, or None for null, text and NaN/inf."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else value


@dataclass
class Series:
    """The evaluated value of one condition over time, with its threshold and baseline
    (NaN where the evidence had none)."""

    condition: str
    signal: str
    agg: str
    op: str
    ts: array = field(default_factory=lambda: array("d"))
    value: array = field(default_factory=lambda: array("d"))
    threshold: array = field(default_factory=lambda: array("d"))
    baseline: array = field(default_factory=lambda: array("d"))

    def add(self, ts: float, item: dict) -> None:
        self.ts.append(ts)
        self.value.append(_nan_if_none(as_float(item.get("value"))))
        self.threshold.append(_nan_if_none(as_float(item.get("threshold"))))
        self.baseline.append(_nan_if_none(as_float(item.get("baseline"))))


@dataclass
class Track:
    """Everything the trail says about one rule for one target."""

    policy: str
    rule: str
    target: str
    labels: dict = field(default_factory=dict)
    series: dict[str, Series] = field(default_factory=dict)
    evals: int = 0
    last_eval_state: str | None = None
    transitions: list[dict] = field(default_factory=list)
    actions: list[dict] = field(default_factory=list)
    limits: list[dict] = field(default_factory=list)
    retired_at: float | None = None   # the controller dropped it: its target fell silent

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.policy, self.rule, self.target)

    def add_eval(self, rec: dict) -> None:
        self.evals += 1
        state = rec.get("state")
        if isinstance(state, str):
            self.last_eval_state = state
        values = rec.get("values")
        for item in values if isinstance(values, list) else ():
            if not isinstance(item, dict):
                continue
            text = str(item.get("condition") or item.get("signal") or "?")
            series = self.series.get(text)
            if series is None:
                series = self.series[text] = Series(text, str(item.get("signal") or ""),
                                                    str(item.get("agg") or ""), str(item.get("op") or ""))
            series.add(rec["ts"], item)


@dataclass(frozen=True)
class Unreadable:
    """A line of an audit file that is not JSON."""

    reason: str
    text: str


class AuditFile:
    """The records of an audit file and of its rotated predecessors
    (``audit.jsonl.N`` ... ``audit.jsonl.1``, oldest first), read anew on every
    iteration; unreadable lines come out as ``Unreadable``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.paths = rotated_paths(self.path) or [self.path]

    def numbered(self) -> Iterator[tuple[int, dict | Unreadable]]:
        """(line number, record) for every non-blank line; numbers run on across
        the rotated files."""
        line_no = 0
        for path in self.paths:
            with open(path, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    line_no += 1
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        yield line_no, json.loads(line)
                    except ValueError as exc:
                        yield line_no, Unreadable(f"not JSON ({exc.msg})", line)

    def __iter__(self) -> Iterator[dict | Unreadable]:
        return (rec for _, rec in self.numbered())


@dataclass
class Audit:
    """The fold of one audit trail. Build with ``load_audit`` or ``Audit.from_records``."""

    records: Iterable = ()          # the source: an AuditFile, or the records given
    run: dict | None = None
    end: dict | None = None
    tracks: dict[tuple[str, str, str], Track] = field(default_factory=dict)
    transitions: list[dict] = field(default_factory=list)
    actions: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)      # transitions and actions, in file order
    limits: list[dict] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)      # runs that raised (contained)
    evals: int = 0
    record_count: int = 0
    first_ts: float | None = None
    last_ts: float | None = None
    malformed_count: int = 0
    malformed: list[dict] = field(default_factory=list)   # first examples: {line, reason, text}
    unknown_kinds: Counter = field(default_factory=Counter)

    @property
    def complete(self) -> bool:
        return self.end is not None

    @property
    def source(self) -> str:
        return str((self.run or {}).get("source") or "unknown")

    @property
    def wall_clock(self) -> bool:
        """True when ``ts`` is Unix time (live runs), False for simulated seconds."""
        if self.run is not None and isinstance(self.run.get("source"), str):
            return not self.run["source"].startswith("simulation")
        return (self.first_ts or 0.0) > 1e9

    @classmethod
    def from_records(cls, records: Iterable) -> "Audit":
        """Fold record dicts (line numbers count from 1) or an ``AuditFile``."""
        audit = cls(records=records)
        numbered = records.numbered() if isinstance(records, AuditFile) else enumerate(records, 1)
        for line_no, rec in numbered:
            audit.add(rec, line_no)
        return audit

    def bad(self, line_no: int | None, reason: str, text: str = "") -> None:
        self.malformed_count += 1
        if len(self.malformed) < MALFORMED_EXAMPLES:
            self.malformed.append({"line": line_no, "reason": reason, "text": text[:200]})

    def add(self, rec, line_no: int | None = None) -> None:
        """Fold one decoded record; anything unusable is counted, never raised."""
        if isinstance(rec, Unreadable):
            self.bad(line_no, rec.reason, rec.text)
            return
        problem = self._problem(rec)
        if problem:
            self.bad(line_no, problem, json.dumps(rec, default=str))
            return
        if rec["kind"] not in KNOWN_KINDS:
            self.unknown_kinds[rec["kind"]] += 1
            return
        kind, ts = rec["kind"], as_float(rec["ts"])
        rec = dict(rec, ts=ts)
        self.record_count += 1
        self.first_ts = ts if self.first_ts is None else min(self.first_ts, ts)
        self.last_ts = ts if self.last_ts is None else max(self.last_ts, ts)
        if kind == "run":
            self.run = rec
        elif kind == "end":
            self.end = rec
        else:
            self._add_tracked(kind, rec)

    @staticmethod
    def _problem(rec) -> str | None:
        if not isinstance(rec, dict):
            return f"not a JSON object ({type(rec).__name__})"
        if not isinstance(rec.get("kind"), str):
            return "no 'kind'"
        if as_float(rec.get("ts")) is None:
            return "no numeric 'ts'"
        if rec["kind"] in TRACKED_KINDS and not (isinstance(rec.get("policy"), str)
                                                 and isinstance(rec.get("rule"), str)):
            return f"'{rec['kind']}' record without policy and rule"
        return None

    def _add_tracked(self, kind: str, rec: dict) -> None:
        target = str(rec.get("target") or "*")
        key = (rec["policy"], rec["rule"], target)
        track = self.tracks.get(key)
        if track is None:
            labels = rec.get("target_labels")
            track = self.tracks[key] = Track(*key, labels=labels if isinstance(labels, dict) else {})
        if kind == "eval":
            self.evals += 1
            track.add_eval(rec)
        elif kind == "transition":
            self.transitions.append(rec)
            self.events.append(rec)
            track.transitions.append(rec)
        elif kind == "action":
            self.actions.append(rec)
            self.events.append(rec)
            track.actions.append(rec)
        elif kind == "retire":
            track.retired_at = rec["ts"]
        elif kind == "error":
            self.errors.append(rec)
        else:
            self.limits.append(rec)
            track.limits.append(rec)


def load_audit(path: str | Path) -> Audit:
    """Stream the file at ``path`` into a new ``Audit``."""
    return Audit.from_records(AuditFile(path))
