"""Write-ahead journal of every change to the system: intent -> applied -> reverted.

Each step is one JSON line, flushed and fsynced *before* the controller acts on
it, so a controller killed at any instant leaves a journal that says what may be
applied. On start the controller reconciles: every entry still at ``intent`` or
``applied`` is reverted (or adopted, if its rule says so).

Example::

    j = Journal("/var/lib/reflexarc/journal.jsonl")
    jid = j.intent(change, policy="p", rule="r", on_restart="revert")
    actuator.apply(change); j.mark(jid, "applied")
    actuator.revert(change); j.mark(jid, "reverted")
    j.open_entries()        # -> entries neither reverted nor closed

Overhead: one small write + fsync per step (~0.1-2 ms on an SSD); nothing per tick.
An exclusive flock on ``<journal>.lock`` stops two controllers sharing one journal.
Damage never hides an open change: a torn last line is ended before the next
step is appended, and a line that is not a usable step is skipped and listed in
``damaged`` (``reflexarc journal`` and ``run`` say so).
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

OPEN_STATES = ("intent", "applied")
log = logging.getLogger("reflexarc.journal")


def _is_change(value) -> bool:
    return isinstance(value, dict) and isinstance(value.get("actuator"), str) and isinstance(value.get("target"), dict)


class JournalLocked(RuntimeError):
    pass


@dataclass
class Entry:
    id: str
    state: str
    change: dict
    policy: str = ""
    rule: str = ""
    on_restart: str = "revert"
    history: list = field(default_factory=list)


class Journal:
    def __init__(self, path: str | Path, clock=None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self._lock = open(self.path.with_name(self.path.name + ".lock"), "a")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise JournalLocked(f"{self.path} is in use by another reflexarc process") from None
        self._fh = open(self.path, "a+", encoding="utf-8")
        self._entries: dict[str, Entry] = {}
        self.damaged: list[str] = []     # "line N: why" for every line that was skipped
        self._load()

    # --- reading ---------------------------------------------------------
    def _load(self) -> None:
        self._fh.seek(0)
        text = self._fh.read()
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            problem = self._fold_line(line)
            if problem:
                self.damaged.append(f"line {n}: {problem}")
        if text and not text.endswith("\n"):
            # a torn last write (a crash mid-line): end it, so the next step starts a line of its own
            self._fh.write("\n")
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def _fold_line(self, line: str) -> str | None:
        """Fold one line; what is wrong with it when it cannot be used."""
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            return "not JSON (a torn write?)"
        if not (isinstance(rec, dict) and isinstance(rec.get("id"), str) and isinstance(rec.get("state"), str)):
            return "not a journal step (no id and state)"
        if rec["state"] == "intent" and not _is_change(rec.get("change")):
            return f"intent {rec['id']} without a change"
        if "change" in rec and not _is_change(rec["change"]):
            return f"step of {rec['id']} with a malformed change"
        self._fold(rec)
        return None

    def _fold(self, rec: dict) -> None:
        jid = rec["id"]
        if rec["state"] == "intent":
            self._entries[jid] = Entry(jid, "intent", rec["change"], str(rec.get("policy", "")),
                                       str(rec.get("rule", "")), str(rec.get("on_restart", "revert")))
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
    def _write(self, rec: dict) -> None:
        rec["ts"] = self._clock.now() if self._clock else time.time()
        self._fh.write(json.dumps(rec, sort_keys=True, default=str) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fold(rec)

    def intent(self, change: dict, policy: str = "", rule: str = "", on_restart: str = "revert") -> str:
        jid = uuid.uuid4().hex[:12]
        self._write({"id": jid, "state": "intent", "change": change, "policy": policy,
                     "rule": rule, "on_restart": on_restart})
        return jid

    def mark(self, jid: str, state: str, note: str = "", change: dict | None = None) -> None:
        rec = {"id": jid, "state": state}
        if note:
            rec["note"] = note
        if change is not None:
            rec["change"] = change
        self._write(rec)

    def compact(self) -> bool:
        """Rewrite the file with only the open entries (atomic rename). A file that
        cannot be replaced (immutable or append-only, a read-only directory) is
        kept as it is: compaction only saves space. Returns whether it compacted."""
        tmp = self.path.with_suffix(".tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as out:
                for e in self.open_entries():
                    out.write(json.dumps({"id": e.id, "state": "intent", "change": e.change, "policy": e.policy,
                                          "rule": e.rule, "on_restart": e.on_restart, "ts": 0},
                                         sort_keys=True) + "\n")
                    if e.state != "intent":
                        out.write(json.dumps({"id": e.id, "state": e.state, "ts": 0}) + "\n")
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("journal %s not compacted: %s", self.path, exc.strerror or exc)
            tmp.unlink(missing_ok=True)
            return False
        self._fh.close()
        self._fh = open(self.path, "a+", encoding="utf-8")
        self._entries = {}
        self.damaged = []
        self._load()
        return True

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
