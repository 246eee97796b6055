"""The audit log: transitions, actions and their evidence, always; evaluations
as the chosen policy says.

Appends JSON lines in the format of ``docs/audit-format.md`` and flushes each
line, so a report can be written from a crashed run too.

Evaluations (``evals``):

- ``all``: every evaluation (simulations and tests: the report draws them).
- ``sampled`` (live runs): an evaluation is written when its result or state
  differs from the last one written for that rule-target, on every tick while
  the rule is on its way to acting (``pending``, ``firing``, ``verifying``),
  and otherwise at most once per ``sample_every`` seconds. The volume then
  follows what happens, not rules x targets x time.

The file rotates when it passes ``max_bytes``: ``audit.jsonl`` becomes
``audit.jsonl.1`` (older ones shift up to ``keep``; the oldest is dropped).
``report`` reads the rotated files first, oldest first.

Example::

    audit = AuditLog("out/audit.jsonl", clock, evals="sampled", sample_every=1200)
    audit.write("transition", policy="p", rule="r", target="pid=1", frm="ok", to="pending")
    if audit.eval_due("p/r/pid=1", "ok", False, now):
        audit.write("eval", ...)

Overhead: one ``json.dumps`` and one buffered write per record; a sampled
evaluation that is not due costs one dictionary look-up.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

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
                 max_bytes: int = 64 << 20, keep: int = 4) -> None:
        if evals not in EVAL_MODES:
            raise ValueError(f"evals must be one of {', '.join(EVAL_MODES)}")
        self.clock = clock
        self.evals = evals
        self.sample_every = sample_every
        self.max_bytes = max_bytes
        self.keep = keep
        self.path = Path(path) if path is not None else None
        self._fh = None
        self._size = 0
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._open()
        self._last_eval: dict[str, tuple] = {}   # rule-target -> (state, result, ts) last written
        self.counts = Counter()
        self.records: list[dict] = []   # kept in memory for in-process callers (tests, summaries)
        self.keep_in_memory = path is None

    def _open(self) -> None:
        self._fh = open(self.path, "a", encoding="utf-8")
        self._size = self._fh.tell()

    def _rotate(self) -> None:
        self._fh.close()
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
        self._open()

    def write(self, kind: str, **fields) -> dict:
        rec = {"ts": self.clock.now(), "kind": kind, **fields}
        self.counts[kind] += 1
        if kind == "action":
            self.counts["outcome:" + str(fields.get("outcome"))] += 1
        if self._fh is not None:
            line = json.dumps(rec, sort_keys=True, default=str, separators=(",", ":")) + "\n"
            self._fh.write(line)
            self._fh.flush()
            self._size += len(line)
            if self._size >= self.max_bytes:
                self._rotate()
        if self.keep_in_memory:
            self.records.append(rec)
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
        if self._fh is not None:
            self._fh.close()
            self._fh = None
