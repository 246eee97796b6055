"""The audit log: transitions, actions and their evidence, always; evaluations
as the chosen policy says.

Appends JSON lines in the format of ``docs/audit-format.md``, one ``write(2)``
each, so a report can be written from a crashed run too.

The audit may lose records; it never stops the controller. A record that
cannot be written (a full disk, an I/O error, a file that cannot be opened)
is dropped, counted in ``dropped`` by reason (the errno's name:
``ENOSPC``...; ``reflexarc_audit_records_dropped_total``) and reported on
stderr once per reason and stretch of failures; writing resumes when it can.
Shutdown, reverts and the journal's reconcile go on regardless: the journal,
not the audit, is what must not be lost (``journal.py``). The file is opened
with ``O_NOFOLLOW`` (a planted link is refused, not followed) and created
0600: it holds the training processes' command lines.

Evaluations (``evals``):

- ``all``: every evaluation (``simulate --all-evals``, tests): the report draws
  each one.
- ``sampled`` (live runs and simulations): an evaluation is written when its
  result or state differs from the last one written for that rule-target, on
  every tick while the rule is on its way to acting (``pending``, ``firing``,
  ``verifying``), and otherwise at most once per ``sample_every`` seconds. The
  volume then follows what happens, not rules x targets x time.

The file rotates when it passes ``max_bytes``: ``audit.jsonl`` becomes
``audit.jsonl.1`` (older ones shift up to ``keep``; the oldest is dropped).
``report`` reads the rotated files first, oldest first.

Listeners (``listeners``, callables taking the record) hear every record as it
is written, whether or not the file took it: ``narrate.Narrator`` tells them
on stderr. A listener that raises is logged once and counted in
``listener_errors``; the record and the controller go on.

Example::

    audit = AuditLog("out/audit.jsonl", clock, evals="sampled", sample_every=1200, listeners=[print])
    audit.write("transition", policy="p", rule="r", target="pid=1", frm="ok", to="pending")
    if audit.eval_due("p/r/pid=1", "ok", False, now):
        audit.write("eval", ...)

Overhead: one ``json.dumps`` and one ``write(2)`` per record, plus what its
listeners cost; a sampled evaluation that is not due costs one dictionary look-up.
"""
from __future__ import annotations

import errno
import json
import logging
import os
from collections import Counter
from pathlib import Path

log = logging.getLogger("reflexarc.audit")
OPEN_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC

EVAL_MODES = ("all", "sampled")
EVERY_TICK_STATES = frozenset({"pending", "firing", "verifying"})


def rotated_paths(path: str | Path) -> list[Path]:
    """``path`` and its rotated predecessors, oldest first."""
    path = Path(path)
    older = []
    for candidate in path.parent.glob(path.name + ".*"):
        suffix = candidate.name[len(path.name) + 1:]
        if suffix.isdigit():
            older.append((int(suffix), candidate))
    return [p for _, p in sorted(older, reverse=True)] + ([path] if path.exists() else [])


class AuditLog:
    def __init__(self, path: str | Path | None, clock, evals: str = "all", sample_every: float = 1200.0,
                 max_bytes: int = 64 << 20, keep: int = 4, listeners=()) -> None:
        if evals not in EVAL_MODES:
            raise ValueError(f"evals must be one of {', '.join(EVAL_MODES)}")
        self.clock = clock
        self.evals = evals
        self.sample_every = sample_every
        self.max_bytes = max_bytes
        self.keep = keep
        self.path = Path(path) if path is not None else None
        self._fd: int | None = None
        self._size = 0
        self._failing: str | None = None     # the reason writes are failing for, reported once
        self._last_reason = ""
        self.dropped = Counter()             # records not written, by reason (errno name)
        self.listeners = list(listeners)     # called with each record
        self.listener_errors = 0
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError:
                pass                          # the open fails and says why
            self._open()
        self._last_eval: dict[str, tuple] = {}   # rule-target -> (state, result, ts) last written
        self.counts = Counter()
        self.records: list[dict] = []   # kept in memory for in-process callers (tests, summaries)
        self.keep_in_memory = path is None

    def _open(self) -> bool:
        try:
            self._fd = os.open(self.path, OPEN_FLAGS, 0o600)
            self._size = os.fstat(self._fd).st_size
        except OSError as exc:
            self._fd = None
            self._failed(exc, "cannot be opened")
            return False
        return True

    def _failed(self, exc: OSError, what: str) -> None:
        reason = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
        if exc.errno == errno.ELOOP:
            what += " (a symbolic link: refused)"
        if self._failing != reason:
            log.error("audit %s %s (%s): records are dropped and counted until it can be written",
                      self.path, what, exc.strerror or exc)
            self._failing = reason
        self._last_reason = reason

    def _rotate(self) -> None:
        os.close(self._fd)
        self._fd = None
        for n in range(self.keep, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            if older.exists():
                if n == self.keep:
                    older.unlink()
                else:
                    os.replace(older, self.path.with_name(f"{self.path.name}.{n + 1}"))
        if self.keep > 0:
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink()

    def _append(self, line: bytes) -> None:
        """Write one record; a failure drops it (counted), never raises."""
        if self._fd is None and not self._open():
            self.dropped[self._last_reason] += 1
            return
        try:
            written = os.write(self._fd, line)
            if written != len(line):          # a short write: the rest would not fit either
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as exc:
            self._failed(exc, "cannot be written")
            self.dropped[self._last_reason] += 1
            return
        if self._failing is not None:
            log.warning("audit %s is written again (%d record(s) dropped so far)", self.path,
                        sum(self.dropped.values()))
            self._failing = None
        self._size += len(line)
        if self._size >= self.max_bytes:
            try:
                self._rotate()
            except OSError as exc:
                self._failed(exc, "cannot be rotated")
            self._open()

    def write(self, kind: str, **fields) -> dict:
        rec = {"ts": self.clock.wall(), "kind": kind, **fields}   # a timestamp for people
        self.counts[kind] += 1
        if kind == "action":
            self.counts["outcome:" + str(fields.get("outcome"))] += 1
        if self.path is not None:
            self._append((json.dumps(rec, sort_keys=True, default=str, separators=(",", ":")) + "\n").encode())
        if self.keep_in_memory:
            self.records.append(rec)
        for listener in self.listeners:
            try:
                listener(rec)
            except Exception:            # telling about a record never stops recording nor the controller
                if not self.listener_errors:
                    log.exception("audit listener %r failed; its later failures are only counted", listener)
                self.listener_errors += 1
        return rec

    def eval_due(self, key: str, state: str, result: bool, now: float) -> bool:
        """Whether an evaluation of rule-target ``key`` is to be written; if so it
        counts as written."""
        if self.evals == "sampled":
            last = self._last_eval.get(key)
            if (last is not None and last[0] == state and last[1] == result
                    and state not in EVERY_TICK_STATES and now - last[2] < self.sample_every):
                return False
        self._last_eval[key] = (state, result, now)
        return True

    def forget(self, key: str) -> None:
        """Drop what is remembered of a retired rule-target."""
        self._last_eval.pop(key, None)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
