"""The audit log: every evaluation, transition and action with its evidence.

Appends JSON lines in the format of ``docs/audit-format.md`` and flushes each
line, so a report can be written from a crashed run too.

Example::

    audit = AuditLog("out/audit.jsonl", clock)
    audit.write("transition", policy="p", rule="r", target="pid=1", frm="ok", to="pending")

Overhead: one ``json.dumps`` and one buffered write per record.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path


class AuditLog:
    def __init__(self, path: str | Path | None, clock, evals: str = "all") -> None:
        """``evals``: ``all`` writes every evaluation, ``changes`` only when the
        result or state differs from the previous one (for long live runs)."""
        self.clock = clock
        self.evals = evals
        self._fh = None
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(path, "a", encoding="utf-8")
        self._last_eval: dict[str, tuple] = {}
        self.counts = Counter()
        self.records: list[dict] = []   # kept in memory for in-process callers (tests, summaries)
        self.keep_in_memory = path is None

    def write(self, kind: str, **fields) -> dict:
        rec = {"ts": self.clock.now(), "kind": kind, **fields}
        self.counts[kind] += 1
        if kind == "action":
            self.counts["outcome:" + str(fields.get("outcome"))] += 1
        if self._fh is not None:
            self._fh.write(json.dumps(rec, sort_keys=True, default=str) + "\n")
            self._fh.flush()
        if self.keep_in_memory:
            self.records.append(rec)
        return rec

    def eval(self, target_key: str, state: str, result: bool, **fields) -> None:
        sig = (state, result)
        if self.evals == "changes" and self._last_eval.get(target_key) == sig:
            return
        self._last_eval[target_key] = sig
        self.write("eval", state=state, result=result, **fields)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
