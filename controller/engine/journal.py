"""Write-ahead journal of every change to the system: intent -> applied -> reverted.

Each step is one JSON line, written and fsynced *before* the controller acts on
it, so a controller killed at any instant leaves a journal that says what may be
applied. On start the controller reconciles: every entry still at ``intent`` or
``applied`` is reverted (or adopted, if its rule says so).

Example::

    j = Journal("/var/lib/reflexarc/journal.jsonl")
    jid = j.intent(change, policy="p", rule="r", on_restart="revert")
    actuator.apply(change); j.mark(jid, "applied")
    actuator.revert(change); j.mark(jid, "reverted")
    j.open_entries()        # -> entries neither reverted nor closed
    j.warnings              # -> ["/var/lib/reflexarc/journal.jsonl:3: warning: not JSON: skipped"]

Every intent carries the journal's format version (``"v": FORMAT``); a
journal holding a newer one (written by a newer reflexarc) is refused as a
whole (``JournalTooNew``) rather than read in part. An entry this version
cannot revert (an actuator it does not know) stays open until ``reflexarc
rollback --forget ID --reason TEXT`` closes it as ``forgotten`` (audited).

Damage never hides an open change:

- every append starts on a line of its own: a torn last line (a write cut
  short) is ended first, and reported when the journal is opened;
- a line that is not a usable step (not UTF-8, not JSON, fields missing or of the
  wrong type) is skipped and listed in ``damaged`` and ``warnings``
  (``<path>:<line>: warning: ...``); a step whose policy, rule or on_restart
  is unusable is kept, with those fields at their defaults (on_restart: revert);
- a file that cannot be written (immutable, read-only filesystem) is still read:
  ``unwritable`` says why, and ``intent``/``mark`` raise ``JournalWriteError``
  instead of writing, so the executor refuses a change it cannot journal first.

The journal, its lock file and the compaction's temporary file are opened
with ``O_NOFOLLOW`` and created 0600: a link planted in the state directory
is refused, never written through (``reflexarc run`` also refuses a state directory
other users may write to).

Overhead: one small write + fsync per step (~0.1-2 ms on an SSD), plus an fstat
and a one-byte read to check the last line is ended; nothing per tick. An
exclusive flock on ``<journal>.lock`` stops two controllers sharing one journal.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from reflexarc.core.input_files import InputFileError, check_regular, open_regular
from reflexarc.core.outcomes import Outcome

from ..policy.model import ON_RESTART

OPEN_STATES = ("intent", Outcome.APPLIED)
STATES = frozenset({"intent", Outcome.APPLIED, Outcome.FAILED, Outcome.REVERTED, Outcome.TARGET_GONE, Outcome.KEPT,
                    Outcome.FORGOTTEN})
FORMAT = 1          # the journal's format (major) version: every intent carries it as "v"
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC   # the journal, its lock and its compaction are never links
JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
              type(None): "null"}
log = logging.getLogger("reflexarc.journal")


class JournalLocked(RuntimeError):
    pass


class JournalTooNew(InputFileError):
    """The journal was written by a newer reflexarc, in a format this one cannot
    be sure to revert from."""


class JournalWriteError(Exception):
    """A step could not be written (and fsynced): nothing of it is in the journal."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"journal {path} cannot be written ({reason})")


@dataclass
class Entry:
    id: str
    state: str
    change: dict
    policy: str = ""
    rule: str = ""
    on_restart: str = "revert"
    history: list = field(default_factory=list)


@dataclass(frozen=True)
class Damage:
    """A line that is not a usable step, kept as it was read (compaction keeps it)."""
    line: int
    why: str
    raw: bytes


def _change_problem(change) -> str | None:
    """What keeps ``change`` from being rebuilt as an actuator ``Change``, or None."""
    if not isinstance(change, dict):
        return "no change" if change is None else f"the change is {JSON_KINDS.get(type(change), 'not an object')}"
    if not (isinstance(change.get("actuator"), str) and change["actuator"]):
        return "the change names no actuator"
    target = change.get("target")
    if not isinstance(target, dict):
        return "the change has no target object"
    for where, key in ((target, "labels"), (target, "selector"), (change, "params")):
        if not isinstance(where.get(key, {}), dict):
            return f"the change's {key} is not an object"
    if not isinstance(change.get("summary", ""), str):
        return "the change's summary is not a string"
    return None


def _step_problem(rec) -> str | None:
    """What keeps the parsed line ``rec`` from being a journal step, or None."""
    if not isinstance(rec, dict):
        return f"{JSON_KINDS.get(type(rec), 'a value')}, not a journal step"
    jid, state = rec.get("id"), rec.get("state")
    if not (isinstance(jid, str) and jid):
        return "a journal step without a string id"
    if not (isinstance(state, str) and state in STATES):
        return f"step of {jid} with an unknown state {state!r}"
    if state == "intent" or "change" in rec:
        problem = _change_problem(rec.get("change"))
        if problem:
            return f"{state} step of {jid}: {problem}"
    return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class Journal:
    def __init__(self, path: str | Path, clock=None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._clock = clock
        if self.path.is_symlink():
            raise InputFileError(self.path, "is a symbolic link, not followed: the journal is written "
                                            "where it is, never through a link")
        lock_path = self.path.with_name(self.path.name + ".lock")
        try:
            self._lock = os.fdopen(os.open(lock_path, NOFOLLOW | os.O_RDWR | os.O_CREAT, 0o600), "r+")
        except OSError:                         # a read-only filesystem: an existing lock file still locks
            self._lock = os.fdopen(os.open(lock_path, NOFOLLOW | os.O_RDONLY), "r")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._lock.read(32).strip()
            self._lock.close()
            raise JournalLocked(f"{self.path} is in use by another reflexarc process"
                                + (f" (pid {holder})" if holder.isdigit() else "")) from None
        with contextlib.suppress(OSError, ValueError):    # who holds it, for the next one to name
            self._lock.seek(0)
            self._lock.truncate()
            self._lock.write(str(os.getpid()))
            self._lock.flush()
        self._fd: int | None = None
        self.unwritable: str | None = None    # why the last attempt to write failed; None once one works
        if os.path.lexists(self.path):
            try:
                check_regular(self.path)      # a FIFO would block its reader, /dev/zero never ends
            except InputFileError:
                self._lock.close()
                raise
        try:
            self._writer()
        except OSError as exc:
            self.unwritable = exc.strerror or str(exc)
        try:
            self._load()
        except InputFileError:
            self.close()
            raise

    # --- reading ---------------------------------------------------------
    def _load(self) -> None:
        self._entries: dict[str, Entry] = {}
        self.damaged: list[Damage] = []
        self.warnings: list[str] = []
        try:
            with open_regular(self.path, follow=False) as fh:
                data = fh.read()
        except InputFileError:
            if not os.path.lexists(self.path):    # not writable and never written: nothing journaled
                return
            raise
        lines = data.split(b"\n")
        torn = lines.pop()                # b"" when the file ends with a newline
        for n, raw in enumerate(lines, 1):
            self._read_line(n, raw, "")
        if torn:
            self._read_line(len(lines) + 1, torn, "torn last line (a write cut short?); the next step starts "
                                                  "on a line of its own")

    def _warn(self, n: int, why: str) -> None:
        self.warnings.append(f"{self.path}:{n}: warning: {why}")

    def _read_line(self, n: int, raw: bytes, torn: str) -> None:
        if not raw.strip():
            return
        try:
            rec = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            problem = "not UTF-8 text"
        except (ValueError, RecursionError):
            problem = torn or "not JSON"
        else:
            problem = _step_problem(rec)
        if problem:
            self.damaged.append(Damage(n, problem, raw))
            self._warn(n, f"{problem}: skipped")
            return
        version = rec.get("v", 1)
        if not isinstance(version, int) or isinstance(version, bool) or version > FORMAT:
            raise JournalTooNew(self.path, f"line {n}: journal format {version!r}, written by a newer reflexarc "
                                           f"(this one reads format {FORMAT}); run that version's "
                                           f"'reflexarc rollback --all', or upgrade")
        if rec["state"] == "intent":
            self._drop_unusable(n, rec)
        self._fold(rec)

    def _drop_unusable(self, n: int, intent: dict) -> None:
        """An intent's policy, rule or on_restart of the wrong kind falls back to
        its default (on_restart: revert): the change stays revertible."""
        usable = {"policy": lambda v: isinstance(v, str), "rule": lambda v: isinstance(v, str),
                  "on_restart": lambda v: v in ON_RESTART}
        for key, ok in usable.items():
            if key in intent and not ok(intent[key]):
                value = intent.pop(key)
                self._warn(n, f"intent of {intent['id']}: {key} {value!r} is unusable: "
                              + ("treated as revert" if key == "on_restart" else "left empty"))

    def _fold(self, rec: dict) -> None:
        jid = rec["id"]
        if rec["state"] == "intent":
            self._entries[jid] = Entry(jid, "intent", rec["change"], rec.get("policy", ""),
                                       rec.get("rule", ""), rec.get("on_restart", "revert"))
        entry = self._entries.get(jid)
        if entry is None:
            return
        entry.state = rec["state"]
        if "change" in rec and rec["state"] != "intent":
            entry.change = rec["change"]
        entry.history.append({k: rec[k] for k in ("state", "ts", "note") if k in rec})

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    def get(self, jid: str) -> Entry:
        return self._entries[jid]

    def open_entries(self) -> list[Entry]:
        return [e for e in self._entries.values() if e.state in OPEN_STATES]

    # --- writing ---------------------------------------------------------
    def _writer(self) -> int:
        """The append descriptor, opened on first need (again after a failure to)."""
        if self._fd is None:
            self._fd = os.open(self.path, NOFOLLOW | os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        return self._fd

    def _write(self, rec: dict) -> None:
        rec["ts"] = self._clock.wall() if self._clock else time.time()
        line = (json.dumps(rec, sort_keys=True, default=str) + "\n").encode()
        try:
            fd = self._writer()
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line           # end a torn last line first
            _write_all(fd, line)
            os.fsync(fd)
        except OSError as exc:
            if self.unwritable is None:       # once, when a journal that took steps stops taking them
                log.error("journal %s cannot be written (%s): no new change is applied until it can",
                          self.path, exc.strerror or exc)
            self.unwritable = exc.strerror or str(exc)
            raise JournalWriteError(self.path, self.unwritable) from None
        self.unwritable = None
        self._fold(rec)

    def intent(self, change: dict, policy: str = "", rule: str = "", on_restart: str = "revert") -> str:
        jid = uuid.uuid4().hex[:12]
        self._write({"id": jid, "state": "intent", "v": FORMAT, "change": change, "policy": policy,
                     "rule": rule, "on_restart": on_restart})
        return jid

    def mark(self, jid: str, state: str, note: str = "", change: dict | None = None) -> None:
        rec = {"id": jid, "state": state}
        if note:
            rec["note"] = note
        if change is not None:
            rec["change"] = change
        self._write(rec)

    def forget(self, jid: str, reason: str) -> Entry:
        """Close the open entry ``jid`` without reverting it, journaled as
        ``forgotten`` with ``reason``; the entry. LookupError when no open entry
        has that id, JournalWriteError when the step cannot be written."""
        entry = next((e for e in self.open_entries() if e.id == jid), None)
        if entry is None:
            raise LookupError(f"no open journal entry '{jid}' (see 'reflexarc journal')")
        self.mark(entry.id, Outcome.FORGOTTEN, note=f"forgotten by an operator: {reason}")
        return entry

    def compact(self) -> str | None:
        """Rewrite the file with the open entries and the lines it could not read,
        atomically: a temporary file in the same directory, fsynced, renamed over
        the journal, the directory fsynced. A file that cannot be replaced
        (append-only or immutable, a read-only directory) is kept as it is, with
        one warning: compaction only saves space. None when it compacted, else why not."""
        tmp = self.path.with_name(self.path.name + ".compacting")
        records = []
        for e in self.open_entries():
            records.append({"id": e.id, "state": "intent", "v": FORMAT, "change": e.change, "policy": e.policy,
                            "rule": e.rule, "on_restart": e.on_restart, "ts": 0})
            if e.state != "intent":
                records.append({"id": e.id, "state": e.state, "ts": 0})
        data = b"".join([d.raw + b"\n" for d in self.damaged]
                        + [(json.dumps(r, sort_keys=True, default=str) + "\n").encode() for r in records])
        try:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()                  # whatever is there (a planted link) is not written through
            fd = os.open(tmp, NOFOLLOW | os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            why = exc.strerror or str(exc)
            log.warning("journal %s not compacted (%s): going on with it uncompacted", self.path, why)
            return why
        if self._fd is not None:
            os.close(self._fd)                # it points at the replaced file
            self._fd = None
        try:
            dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:                # the old file and the new one list the same open changes
            log.warning("journal %s compacted, its directory not synced: %s", self.path, exc.strerror or exc)
        self._load()
        return None

    def close(self) -> None:
        if self._lock.closed:
            return
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._lock.close()
