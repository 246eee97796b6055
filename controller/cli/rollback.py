"""``reflexarc rollback ID|--all``, ``reflexarc rollback --forget ID --reason
TEXT``: revert changes the journal lists open, or close one without
reverting it (one this version cannot revert), journaled and audited. A
controller running on the state directory is asked to do it, so that its
rules follow; a change that cannot be reverted stays open, and the exit
status is 1.

Example::

    reflexarc rollback --all
    reflexarc rollback --forget 3f2a9c1d0b7e --reason "actuator removed in 2.0"

Overhead: one revert per change; reading and compacting the journal.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from reflexarc.core.outcomes import Outcome

from .shared import CliError, _actuator_config, _ask, _journal


def cmd_rollback(args) -> int:
    from reflexarc.actuators.registry import build_registry

    from ..engine.clock import WallClock
    from ..engine.executor import Executor
    if args.forget:
        return _forget(args)
    if not args.all and not args.id:
        raise CliError("name a journal id or --all")
    if args.all and args.id:
        raise CliError("name a journal id or --all, not both")
    reply = _ask(args, {"verb": "rollback", **({"all": True} if args.all else {"id": args.id})})
    if reply is not None:                  # through the running controller: its rules follow
        return _rolled_back(reply["results"])
    journal = _journal(args, WallClock())
    ex = Executor(build_registry(_actuator_config(args)), journal, WallClock())
    entries = journal.open_entries()
    if args.id:
        entries = [e for e in entries if e.id == args.id]
        if not entries:
            journal.close()
            raise CliError(f"no open journal entry '{args.id}' (see 'reflexarc journal')")
    failed = unrecorded = 0
    for e in entries:
        res = ex.revert_entry(e)
        summary = e.change.get("summary") or ""
        print(f"{e.id} {e.change['actuator']:14s} {res.outcome}" + (f": {res.error}" if res.error else "")
              + (f"; {res.unrecorded}" if res.unrecorded else "") + (f"  ({summary})" if summary else ""))
        failed += res.outcome is Outcome.FAILED
        unrecorded += res.unrecorded is not None
    journal.close()
    if not entries:
        print("nothing to roll back")
    problems = [f"{failed} change(s) could not be reverted; they stay in the journal"] if failed else []
    if unrecorded:
        problems.append(f"{journal.path}: {unrecorded} revert(s) could not be recorded; the journal still "
                        "lists them open, the next start or rollback reverts them again")
    for problem in problems[:-1]:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        raise CliError(problems[-1])
    return 0


def _rolled_back(results: list[dict]) -> int:
    for r in results:
        print(f"{r['id']} {r['actuator'] or '?':14s} {r['outcome']}" + (f": {r['error']}" if r["error"] else "")
              + (f"  ({r['summary']})" if r["summary"] else ""))
    if not results:
        print("nothing to roll back")
    failed = sum(r["outcome"] == Outcome.FAILED for r in results)
    if failed:
        raise CliError(f"{failed} change(s) could not be reverted; they stay in the journal")
    return 0


def _forget(args) -> int:
    """``rollback --forget ID --reason TEXT``: close an open entry without reverting
    it (one this version cannot revert), journaled and audited."""
    from ..engine.audit import AuditLog
    from ..engine.clock import WallClock
    if args.all or args.id:
        raise CliError("--forget names the one entry to close: rollback --forget ID --reason TEXT")
    reason = (args.reason or "").strip()
    if not reason:
        raise CliError("--forget needs --reason TEXT: why the change may stay as it is (it is audited)")
    reply = _ask(args, {"verb": "forget", "id": args.forget, "reason": reason})
    if reply is not None:
        print(f"{reply['id']} {reply['actuator'] or '?':14s} forgotten: the change was not reverted; "
              f"whatever it changed stays as it is")
        return 0
    from ..engine.journal import JournalWriteError
    clock = WallClock()
    journal = _journal(args, clock)
    try:
        try:
            entry = journal.forget(args.forget, reason)
        except (LookupError, JournalWriteError) as exc:
            raise CliError(str(exc)) from None
    finally:
        journal.close()
    audit = AuditLog(Path(args.state_dir) / "audit.jsonl", clock)
    audit.write("forget", journal_id=entry.id, actuator=entry.change.get("actuator"), policy=entry.policy,
                rule=entry.rule, summary=entry.change.get("summary", ""), reason=reason, user=os.getuid())
    audit.close()
    print(f"{entry.id} {entry.change.get('actuator', '?'):14s} forgotten: the change was not reverted; "
          f"whatever it changed stays as it is")
    return 0
