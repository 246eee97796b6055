"""``reflexarc status``, ``reflexarc pause``, ``reflexarc resume``: what the
running controller is doing (mode, rules that are not ok and their evidence,
changes held, limits used, enforcement, its fleet slots and rollouts, probes), asked over its control
socket, or the journal's open changes when none runs; and holding or
resuming its enforcement, audited with who asked.

Example::

    reflexarc status --json
    reflexarc pause --reason "NIC firmware upgrade" --for 30m
    reflexarc resume

Overhead: one control-socket request.
"""
from __future__ import annotations

import json

from .shared import CliError, _ask, _journal, _when


def cmd_status(args) -> int:
    reply = _ask(args, {"verb": "status"})
    if reply is None:
        print(f"controller: not running on {args.state_dir}")
        journal = _journal(args)
        entries = journal.open_entries()
        journal.close()
        print(f"journal: {len(entries)} open change(s)" + (" (reflexarc journal lists them; the next start or "
                                                           "reflexarc rollback reverts them)" if entries else ""))
        return 0
    if args.json:
        print(json.dumps({k: v for k, v in reply.items() if k != "ok"}, indent=2, sort_keys=True))
        return 0
    print(_status_text(reply))
    return 0


def _status_text(st: dict) -> str:
    from .top import changes_and_rules
    held, pause, lim = st["enforcement"]["held"], st["enforcement"]["paused"], st["limits"]
    lines = [f"controller: running; mode {st['mode']}; {len(st['policies'])} policies, {st['targets']} targets"]
    if held == "kill_switch":
        lines.append(f"enforcement: HELD by the kill switch {st['enforcement']['kill_switch']} "
                     "(no change is made; remove the file to resume)")
    elif pause is not None:
        until = f" until {_when(pause['until'])}" if pause["until"] else " until 'reflexarc resume'"
        lines.append(f"enforcement: PAUSED{until}, by uid {pause['by'].get('uid', '?')}: {pause['reason']}")
    else:
        lines.append("enforcement: on")
    lines.append(f"limits: {lim['active']} of {lim['max_active']} active changes; {lim['actions_last_hour']} of "
                 f"{lim['actions_per_hour']} actions in the last hour")
    fleet = st.get("fleet")
    if fleet is not None:
        state = "registered" if fleet["registered"] else "NOT registered (the store is out of reach: enforce " \
                                                           "changes are refused)"
        held = "; ".join(f"{pool} ({len(holders)} change(s))" for pool, holders in sorted(fleet["held"].items()))
        lines.append(f"fleet: node {fleet['node']} {state} at {fleet['store']}; slots held: {held or 'none'}")
        for policy, r in fleet["rollouts"].items():
            lines.append(f"  rollout {policy}: stage {r['stage']}, breaker {'OPEN' if r['open'] else 'closed'}"
                         + (f" (reflexarc fleet reset {policy} --reason TEXT)" if r["open"] else ""))
    lines += changes_and_rules(st)
    if st["probes"]:
        lines.append("probes: " + ", ".join(f"{name} {state}" for name, state in sorted(st["probes"].items())))
    return "\n".join(lines)


def cmd_pause(args) -> int:
    reason = (args.reason or "").strip()
    if not reason:
        raise CliError("pause needs --reason TEXT: why enforcement is held (it is audited)")
    reply = _ask(args, {"verb": "pause", "reason": reason, **({"for": args.for_} if args.for_ else {})})
    if reply is None:
        raise CliError(f"no controller is running on {args.state_dir}; to keep one from acting when it starts, "
                       f"touch the kill switch (default /run/reflexarc/disable)")
    until = f" until {_when(reply['until'])}" if reply.get("until") else " until 'reflexarc resume'"
    print(f"enforcement paused{until}: no change is made; changes already applied stay as they are "
          "('reflexarc rollback' reverts them)")
    return 0


def cmd_resume(args) -> int:
    reply = _ask(args, {"verb": "resume", "reason": (args.reason or "").strip() or "resumed by an operator"})
    if reply is None:
        raise CliError(f"no controller is running on {args.state_dir}")
    if reply["held"] == "kill_switch":
        print("pause ended, but the kill switch still holds enforcement: remove its file to resume")
    else:
        print("enforcement resumed" if reply["was_paused"] else "enforcement was not paused")
    return 0
