"""``reflexarc journal [--check]``: every change the journal holds, with its
id, state, actuator, policy/rule and what it changed; ``--check`` reads back
each open change and names those the system no longer shows (drift), exit 1
when any has drifted. A running controller is asked, else the journal file
is read.

Example::

    reflexarc journal
    reflexarc journal --check

Overhead: reading the journal; with ``--check``, one read per open change.
"""
from __future__ import annotations

from .shared import CliError, _actuator_config, _ask, _journal, _when


def _journal_line(jid, state, actuator, policy, rule, summary, history) -> str:
    first = history[0].get("ts") if history else None
    last = history[-1].get("ts") if history else None
    return (f"{jid} {state:9s} {actuator or '?':14s} {_when(first)} {_when(last)[11:] if last != first else '':8s}  "
            f"{policy}/{rule}  {summary}")


def _check(args) -> int:
    """``journal --check``: read back every open change; exit 1 naming those
    the system no longer shows."""
    from reflexarc.actuators.registry import build_registry

    from ..engine.clock import WallClock
    from ..engine.executor import Executor
    reply = _ask(args, {"verb": "check"})
    if reply is not None:
        opened, drifted = reply["open"], reply["drifted"]
        names = {e["id"]: e["actuator"] for e in (_ask(args, {"verb": "journal"}) or {"entries": []})["entries"]}
    else:
        journal = _journal(args, WallClock())
        entries = journal.open_entries()
        opened, names = len(entries), {e.id: e.change.get("actuator") for e in entries}
        drifted, unreadable = Executor(build_registry(_actuator_config(args)), journal, WallClock()).drifts()
        journal.close()
        for jid, why in sorted(unreadable.items()):
            print(f"{jid} {names.get(jid) or '?':14s} cannot be read back: {why}")
    for jid, differs in sorted(drifted.items()):
        print(f"{jid} {names.get(jid) or '?':14s} drifted: {differs}")
    print(f"{opened} open change(s), {len(drifted)} drifted")
    if drifted:
        raise CliError(f"{len(drifted)} open change(s) no longer hold as journaled: someone changed them behind "
                       "the controller's back (reflexarc rollback ID restores what was there before)")
    return 0


def cmd_journal(args) -> int:
    if args.check:
        return _check(args)
    reply = _ask(args, {"verb": "journal"})
    if reply is not None:
        rows = [(e["id"], e["state"], e["actuator"], e["policy"], e["rule"], e["summary"], e["history"])
                for e in reply["entries"]]
    else:
        journal = _journal(args)
        rows = [(e.id, e.state, e.change.get("actuator"), e.policy, e.rule, e.change.get("summary", ""), e.history)
                for e in journal.entries()]
        journal.close()
    if rows:
        print(f"{'id':12s} {'state':9s} {'actuator':14s} {'journaled':19s} {'last step':9s} policy/rule  change")
    for row in rows:
        print(_journal_line(*row))
    return 0
