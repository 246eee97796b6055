"""Reading an audit trail (``audit.jsonl``, see ``docs/audit-format.md``) into one fold.

The reports never hold every record: ``eval`` records, by far the most numerous,
are folded into float arrays per condition as they are read; of transitions,
actions and limits only the few fields the summary and the timelines read are
kept (short strings shared), not their evidence, parameters or changes. The
decision log reads those from the file again (``decisions.iter_decisions``).
Broken input never stops a report: lines that are not JSON objects with a
``kind`` and a numeric ``ts`` are counted (with a few examples), as are lines
longer than ``MAX_LINE_CHARS``; records of kinds this reader does not know are
counted apart, and a run without an ``end`` record is reported as incomplete.
Only regular files are read (``input_files``): a FIFO or a device is refused.

One file may hold several controller runs (a restarted controller appending to
the same file): each ``run`` record starts a ``Run`` with its own targets,
counts and ``end``; records before the first ``run`` (its start rotated away) or
after an ``end`` (``reflexarc act`` by hand) form a run of their own without a
``run`` record. An action a restarted controller wrote for a change it found in
its journal (``note: reconciled at start``) may lack its policy and rule; it is
given those of the action that made the change, by ``journal_id``.

``Audit.records`` is where the fold came from and can be iterated again: an
``AuditFile`` re-reads the file on each pass, so nothing is held twice.

Example::

    audit = load_audit("runs/numa/audit.jsonl")
    audit.complete            # False when a run stopped before writing `end`
    audit.malformed_count     # lines skipped
    for run in audit.runs:    # one per controller start
        for track in run.tracks.values():   # one per (policy, rule, target)
            print(run.index, track.key, track.evals, len(track.actions), track.active)
    summarize(audit.records)  # a second pass over the file

Overhead: one pass over the file; about 32 bytes per evaluated condition, and
about 250 bytes per transition, action and limit.
"""
from __future__ import annotations

import bisect
import json
import math
import sys
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from reflexarc.core.input_files import open_regular

from ..engine.audit import rotated_paths

TRACKED_KINDS = ("eval", "transition", "action", "limit", "retire", "error")
HAND_KINDS = ("forget", "kill_switch", "pause", "resume", "operator", "drift", "rollout")   # an operator's hand,
                                                                                          # node and fleet events
KNOWN_KINDS = ("run", "end", "reload") + HAND_KINDS + TRACKED_KINDS
EVENT_KINDS = ("transition", "action")
MALFORMED_EXAMPLES = 20
MAX_LINE_CHARS = 8 << 20      # an audit record is a few kB; longer lines are counted as malformed
SHARED_CHARS = 80             # strings up to this long are shared between the records kept


def as_float(value) -> float | None:
    """A finite float, or None for null, text and NaN/inf."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else value


def _number(value) -> float:
    """``as_float`` with NaN for None, fast for the usual float and null."""
    if value is None:
        return math.nan
    if type(value) is float and -math.inf < value < math.inf:
        return value
    return _nan_if_none(as_float(value))


def _shared(value):
    """One copy of a short string for every record that repeats it (states, modes, outcomes)."""
    return sys.intern(value) if type(value) is str and len(value) <= SHARED_CHARS else value


def record_problem(rec) -> str | None:
    """Why a decoded line is not a usable audit record, or None."""
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
    change_points: set = field(default_factory=set)   # a change condition's: where each shift began

    def add(self, ts: float, item: dict) -> None:
        self.ts.append(ts)
        self.value.append(_number(item.get("value")))
        self.threshold.append(_number(item.get("threshold")))
        self.baseline.append(_number(item.get("baseline")))
        at = item.get("change_at")
        if isinstance(at, (int, float)) and math.isfinite(at):
            self.change_points.add(float(at))

    def gap(self, ts: float) -> None:
        """The condition is not evaluated from ``ts`` on (a verify condition once
        verifying ends): its last value holds until here, not beyond."""
        if self.ts and not (math.isnan(self.value[-1]) and math.isnan(self.threshold[-1])):
            self.ts.append(ts)
            self.value.append(math.nan)
            self.threshold.append(math.nan)
            self.baseline.append(math.nan)


@dataclass
class Track:
    """What the summary and the timelines need of one rule for one target in one run.
    ``transitions`` hold ``ts, from, to, mode``; ``actions`` hold ``ts, mode,
    step, actuator, outcome, summary`` (of the change), ``error`` and
    ``journal_id``; ``limits`` hold ``ts, policy, rule, target, reason``."""

    policy: str
    rule: str
    target: str
    labels: dict = field(default_factory=dict)
    run: int = 1
    series: dict[str, Series] = field(default_factory=dict)
    evals: int = 0
    first_eval_ts: float | None = None
    last_eval_state: str | None = None
    transitions: list[dict] = field(default_factory=list)
    actions: list[dict] = field(default_factory=list)
    limits: list[dict] = field(default_factory=list)
    errors: int = 0
    retired_at: float | None = None   # the controller dropped it: its target fell silent
    _conditions: tuple = field(default=(), repr=False)   # condition texts of the last evaluation

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.policy, self.rule, self.target)

    @property
    def active(self) -> bool:
        """It did something: changed state, acted, was held back or raised."""
        return bool(self.transitions or self.actions or self.limits or self.errors)

    def add_eval(self, rec: dict, ts: float) -> None:
        self.evals += 1
        if self.first_eval_ts is None:
            self.first_eval_ts = ts
        state = rec.get("state")
        if isinstance(state, str):
            self.last_eval_state = _shared(state)
        values = rec.get("values")
        texts = []
        known = self.series
        for item in values if type(values) is list else ():
            if type(item) is not dict:
                continue
            text = item.get("condition")
            if type(text) is not str or not text:
                text = str(text or item.get("signal") or "?")
            series = known.get(text)
            if series is None:
                series = known[text] = Series(text, str(item.get("signal") or ""),
                                              str(item.get("agg") or ""), str(item.get("op") or ""))
            series.add(ts, item)
            texts.append(text)
        texts = tuple(texts)
        if texts != self._conditions:
            for text in self._conditions:
                if text not in texts:
                    self.series[text].gap(ts)
            self._conditions = texts


@dataclass
class Run:
    """The records of one controller run: from its ``run`` record to its ``end``
    (``run`` None: records outside any controller start that this file holds)."""

    index: int                        # 1-based, in file order
    first_line: int = 0
    run: dict | None = None
    end: dict | None = None
    tracks: dict[tuple[str, str, str], Track] = field(default_factory=dict)
    transitions: list[dict] = field(default_factory=list)
    actions: list[dict] = field(default_factory=list)
    limits: list[dict] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)      # rule runs that raised (contained)
    reloads: list[dict] = field(default_factory=list)     # {ts, reason, outcome, added, removed, changed, errors}
    policies: dict[str, dict] = field(default_factory=dict)   # name -> as the run (or a reload) described it
    evals: int = 0
    record_count: int = 0
    retired: int = 0
    first_ts: float | None = None
    last_ts: float | None = None

    @property
    def complete(self) -> bool:
        return self.end is not None

    @property
    def source(self) -> str:
        if self.run is None:
            return "unknown"
        return str(self.run.get("source") or "unknown")

    def track(self, rec: dict) -> Track:
        key = (rec["policy"], rec["rule"], str(rec.get("target") or "*"))
        track = self.tracks.get(key)
        if track is None:
            labels = rec.get("target_labels")
            track = self.tracks[key] = Track(*(_shared(part) for part in key),
                                             labels=labels if isinstance(labels, dict) else {}, run=self.index)
        return track

    def describe(self, policies) -> None:
        for policy in policies if isinstance(policies, list) else ():
            if isinstance(policy, dict) and isinstance(policy.get("name"), str):
                self.policies[policy["name"]] = policy


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

    def numbered(self, only: Sequence[int] | None = None) -> Iterator[tuple[int, dict | Unreadable]]:
        """(line number, record) for every non-blank line, or for the lines
        ``only`` lists (ascending; the others are not decoded); numbers run on
        across the rotated files. InputFileError when one is not a regular file."""
        wanted = None if only is None else iter(only)
        want = None if wanted is None else next(wanted, None)
        if wanted is not None and want is None:
            return
        line_no = 0
        for path in self.paths:
            with open_regular(path, text=True) as fh:
                for line in _lines(fh):
                    line_no += 1
                    if wanted is not None:
                        if line_no != want:
                            continue
                        want = next(wanted, None)
                    if line is None:
                        yield line_no, Unreadable(f"longer than {MAX_LINE_CHARS} characters", "")
                        continue
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        yield line_no, json.loads(line)
                    except ValueError as exc:
                        yield line_no, Unreadable(f"not JSON ({getattr(exc, 'msg', exc)})", line)
                    if wanted is not None and want is None:
                        return

    def __iter__(self) -> Iterator[dict | Unreadable]:
        return (rec for _, rec in self.numbered())


def _lines(fh) -> Iterator[str | None]:
    """The lines of ``fh``; None for a line longer than ``MAX_LINE_CHARS``, read
    past in pieces so it is never held whole."""
    while True:
        line = fh.readline(MAX_LINE_CHARS)
        if not line:
            return
        if len(line) == MAX_LINE_CHARS and not line.endswith("\n"):
            while line and not line.endswith("\n"):
                line = fh.readline(MAX_LINE_CHARS)
            yield None
        else:
            yield line


@dataclass
class Audit:
    """The fold of one audit trail. Build with ``load_audit`` or ``Audit.from_records``."""

    records: Iterable = ()          # the source: an AuditFile, or the records given
    runs: list[Run] = field(default_factory=list)
    events_in_order: bool = True      # transitions and actions come in time order (a clock step breaks it)
    event_lines: array = field(default_factory=lambda: array("q"))   # where they are, to read them again
    attributed: dict[int, tuple] = field(default_factory=dict)   # line -> (policy, rule, target) given by journal id
    evals: int = 0
    record_count: int = 0
    first_ts: float | None = None
    last_ts: float | None = None
    malformed_count: int = 0
    malformed: list[dict] = field(default_factory=list)   # first examples: {line, reason, text}
    unknown_kinds: Counter = field(default_factory=Counter)
    forgotten: list[dict] = field(default_factory=list)   # journal entries an operator closed unreverted
    hands: list[dict] = field(default_factory=list)       # kill switch, pauses, operators' rollbacks, drift
    _last_event_ts: float | None = field(default=None, repr=False)
    _journal: dict = field(default_factory=dict, repr=False)   # journal id -> (policy, rule, target, labels)

    @property
    def complete(self) -> bool:
        """Every controller run in the file wrote its ``end``."""
        controller = [r for r in self.runs if r.run is not None or r.end is not None]
        return bool(controller) and all(r.complete for r in controller)

    @property
    def run(self) -> dict | None:
        """The first ``run`` record."""
        return next((r.run for r in self.runs if r.run is not None), None)

    @property
    def end(self) -> dict | None:
        """The last ``end`` record."""
        return next((r.end for r in reversed(self.runs) if r.end is not None), None)

    @property
    def source(self) -> str:
        sources = list(dict.fromkeys(r.source for r in self.runs if r.run is not None))
        return ", ".join(sources) or "unknown"

    @property
    def wall_clock(self) -> bool:
        """True when ``ts`` is Unix time (live runs), False for simulated seconds."""
        run = self.run
        if run is not None and isinstance(run.get("source"), str):
            return not run["source"].startswith("simulation")
        return (self.first_ts or 0.0) > 1e9

    @property
    def tracks(self) -> dict[tuple[int, str, str, str], Track]:
        """Every run's tracks, by (run index, policy, rule, target)."""
        return {(run.index, *key): track for run in self.runs for key, track in run.tracks.items()}

    @property
    def transitions(self) -> list[dict]:
        return [t for run in self.runs for t in run.transitions]

    @property
    def actions(self) -> list[dict]:
        return [a for run in self.runs for a in run.actions]

    @property
    def limits(self) -> list[dict]:
        return [lim for run in self.runs for lim in run.limits]

    @property
    def errors(self) -> list[dict]:
        return [err for run in self.runs for err in run.errors]

    @classmethod
    def from_records(cls, records: Iterable) -> "Audit":
        """Fold record dicts (line numbers count from 1) or an ``AuditFile``; the
        decision log iterates ``records`` again, so give a list, not a generator."""
        audit = cls(records=records)
        numbered = records.numbered() if isinstance(records, AuditFile) else enumerate(records, 1)
        for line_no, rec in numbered:
            audit.add(rec, line_no)
        audit._journal.clear()
        return audit

    def event_records(self) -> Iterator[dict]:
        """The transition and action records, read again in full (from a file,
        only the lines the fold found them on are decoded), each with ``run``
        (the index of its run) and the policy, rule and target the fold gave it."""
        if isinstance(self.records, AuditFile):
            numbered = self.records.numbered(only=self.event_lines)
        else:
            numbered = enumerate(self.records, 1)
        starts = [run.first_line for run in self.runs]
        for line_no, rec in numbered:
            if record_problem(rec) is None and rec["kind"] in EVENT_KINDS:   # an Unreadable is no dict
                run = self.runs[max(0, bisect.bisect_right(starts, line_no) - 1)].index if self.runs else 1
                rec = dict(rec, ts=as_float(rec["ts"]), run=run)
                given = self.attributed.get(line_no)
                if given is not None:
                    rec.update(policy=given[0], rule=given[1], target=given[2], attributed=True)
                yield rec

    def bad(self, line_no: int | None, reason: str, text: str = "") -> None:
        self.malformed_count += 1
        if len(self.malformed) < MALFORMED_EXAMPLES:
            self.malformed.append({"line": line_no, "reason": reason, "text": text[:200]})

    def _run_for(self, kind: str, line_no: int) -> Run:
        current = self.runs[-1] if self.runs else None
        if kind == "run" or current is None or (current.end is not None and kind != "end") \
                or (kind == "end" and current.end is not None):
            current = Run(index=len(self.runs) + 1, first_line=line_no)
            self.runs.append(current)
        return current

    def add(self, rec, line_no: int | None = None) -> None:
        """Fold one decoded record; anything unusable is counted, never raised."""
        if isinstance(rec, Unreadable):
            self.bad(line_no, rec.reason, rec.text)
            return
        problem = record_problem(rec)
        if problem:
            self.bad(line_no, problem, json.dumps(rec, default=str))
            return
        if rec["kind"] not in KNOWN_KINDS:
            self.unknown_kinds[rec["kind"]] += 1
            return
        kind, ts = rec["kind"], as_float(rec["ts"])
        if kind == "forget":                 # written by 'rollback --forget', outside any run
            self.record_count += 1
            self.forgotten.append({k: rec.get(k) for k in ("journal_id", "actuator", "summary", "reason", "user")})
            return
        if kind in HAND_KINDS:
            self.record_count += 1
            self.hands.append(dict(rec, ts=ts))
            return
        line_no = line_no or 0
        run = self._run_for(kind, line_no)
        self.record_count += 1
        run.record_count += 1
        self.first_ts = ts if self.first_ts is None else min(self.first_ts, ts)
        self.last_ts = ts if self.last_ts is None else max(self.last_ts, ts)
        run.first_ts = ts if run.first_ts is None else min(run.first_ts, ts)
        run.last_ts = ts if run.last_ts is None else max(run.last_ts, ts)
        if kind == "run":
            run.run = dict(rec, ts=ts)
            run.describe(rec.get("policies"))
        elif kind == "end":
            run.end = dict(rec, ts=ts)
        elif kind == "reload":
            run.reloads.append({"ts": ts, "reason": rec.get("reason"), "outcome": rec.get("outcome"),
                                **{k: rec.get(k) or [] for k in ("added", "removed", "changed", "errors")}})
            if rec.get("outcome") == "ok":
                run.describe(rec.get("policies"))
        else:
            if kind in EVENT_KINDS:
                self.event_lines.append(line_no)
                if self._last_event_ts is not None and ts < self._last_event_ts:
                    self.events_in_order = False
                self._last_event_ts = ts
            if kind == "action":
                rec = self._attribute(rec, line_no)
            self._add_tracked(run, kind, rec, ts)

    def _attribute(self, rec: dict, line_no: int) -> dict:
        """An action without policy or rule (a change a restarted controller found in
        its journal) gets those of the action that made it, by journal id."""
        jid = rec.get("journal_id")
        if not isinstance(jid, str) or not jid:
            return rec
        if rec["policy"] and rec["rule"]:
            if jid not in self._journal:
                self._journal[jid] = (rec["policy"], rec["rule"], str(rec.get("target") or "*"),
                                      rec.get("target_labels"))
            return rec
        known = self._journal.get(jid)
        if known is None:
            return rec
        self.attributed[line_no] = known[:3]
        return dict(rec, policy=known[0], rule=known[1], target=known[2],
                    target_labels=rec.get("target_labels") or known[3])

    def _add_tracked(self, run: Run, kind: str, rec: dict, ts: float) -> None:
        track = run.track(rec)
        if kind == "eval":
            self.evals += 1
            run.evals += 1
            track.add_eval(rec, ts)
        elif kind == "transition":
            kept = {"ts": ts, "from": _shared(rec.get("from")), "to": _shared(rec.get("to")),
                    "mode": _shared(rec.get("mode"))}
            run.transitions.append(kept)
            track.transitions.append(kept)
        elif kind == "action":
            change = rec.get("change")
            kept = {"ts": ts, "mode": _shared(rec.get("mode")), "step": rec.get("step"),
                    "actuator": _shared(rec.get("actuator")), "outcome": _shared(rec.get("outcome")),
                    "summary": _shared(change.get("summary")) if isinstance(change, dict) else None,
                    "error": rec.get("error"), "journal_id": rec.get("journal_id"),
                    "refusal": _shared(rec.get("refusal"))}
            run.actions.append(kept)
            track.actions.append(kept)
        elif kind == "retire":
            track.retired_at = ts
            run.retired += 1
        elif kind == "error":
            track.errors += 1
            run.errors.append(dict(rec, ts=ts))
        else:
            kept = {"ts": ts, "policy": track.policy, "rule": track.rule, "target": track.target,
                    "reason": _shared(rec.get("reason")), "run": run.index}
            run.limits.append(kept)
            track.limits.append(kept)


def load_audit(path: str | Path) -> Audit:
    """Stream the file at ``path`` into a new ``Audit``."""
    return Audit.from_records(AuditFile(path))
