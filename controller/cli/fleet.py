"""``reflexarc fleet status`` and ``reflexarc fleet reset``: the fleet's budget,
rollouts and breakers as etcd holds them (``controller/fleet/``), and an
operator's reset of a policy's breaker, written to the rollout's history with
the reason and who asked.

Example::

    reflexarc fleet status --fleet-etcd http://10.0.0.11:2379 [--json]
    reflexarc fleet reset demote-bulk --reason "threshold raised to 400 ms" --fleet-etcd ...
    reflexarc fleet reset demote-bulk --reason "new version" --from-start --fleet-etcd ...

Overhead: one read (status), a read and a transaction (reset).
"""
from __future__ import annotations

import getpass
import json
import os
import socket
import time

from .shared import CliError, _fleet_store


def _clock(t) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if t else "?"


def cmd_fleet(args) -> int:
    from ..fleet.store import StoreError, StoreUnavailable
    store = _fleet_store(args)
    try:
        if args.action == "status":
            return _status(args, store)
        return _reset(args, store)
    except (StoreUnavailable, StoreError) as exc:
        raise CliError(f"fleet store: {exc}") from None
    finally:
        store.close()


def _status(args, store) -> int:
    from reflexarc.core.rollout import parse_stage

    from ..fleet.view import fleet_view
    view = fleet_view(store, args.fleet_prefix)
    if args.json:
        print(json.dumps(view, indent=2, sort_keys=True))
        return 0
    print(f"fleet {view['prefix']}: {len(view['nodes'])} node(s) alive" +
          (f": {', '.join(view['nodes'])}" if view["nodes"] else ""))
    for job, on in sorted(view["jobs"].items()):
        print(f"job {job}: on {len(on)} node(s): {', '.join(on)}")
    for name, pool in sorted(view["pools"].items()):
        held = ", ".join(f"{s.get('node', '?')} (slot {s['slot']}, " + (
            f"parked at {_clock(s['parked'])}: its node stopped with the change applied)" if "parked" in s
            else f"since {_clock(s.get('since'))})") for s in pool["slots"]) or "none"
        waiting = ", ".join(w["node"] for w in pool["waiting"])
        print(f"pool {name}: held by {held}" + (f"; waiting: {waiting}" if waiting else ""))
    for name, r in sorted(view["rollouts"].items()):
        if "unreadable" in r:
            print(f"rollout {name}: unreadable state ({r['unreadable']})")
            continue
        stages = r.get("spec", {}).get("stages") or ["all"]
        stage = r.get("stage", 0)
        try:
            size = parse_stage(stages[min(stage, len(stages) - 1)]).text()
        except ValueError:
            size = str(stages[min(stage, len(stages) - 1)])
        outcomes = [o["ok"] for o in r.get("recent", [])]
        seats = ", ".join(s["node"] for s in r["seats"]) or "none"
        recent = (f"last {len(outcomes)} outcome(s): {sum(outcomes)} verified, {len(outcomes) - sum(outcomes)} failed"
                  if outcomes else "no outcome in its window yet")
        version = f" (version {r['version'][:12]})" if r.get("version") else ""
        print(f"rollout {name}{version}: stage {stage + 1} of {len(stages)} ({size}), "
              f"{r.get('verified_in_stage', 0)} verified in it of {r.get('spec', {}).get('promote_after', '?')} "
              f"to widen; seats: {seats}; {recent}")
        if r.get("open"):
            print(f"  BREAKER OPEN since {_clock(r.get('opened_at'))}, opened by {r.get('opened_by', '?')}: "
                  f"{r.get('reason', '')}")
            print(f"  no node enforces {name}; after a fix: reflexarc fleet reset {name} --reason TEXT")
        else:
            print("  breaker closed")
    if not view["pools"] and not view["rollouts"]:
        print("no pool and no rollout yet (a node takes a slot or a seat at its first enforce change)")
    return 0


def _who() -> str:
    user = os.environ.get("SUDO_USER") or getpass.getuser()
    return f"{user}@{socket.gethostname()}"


def _reset(args, store) -> int:
    from ..fleet.rollout import reset
    if args.policy is None:
        raise CliError("fleet reset needs the POLICY whose breaker to reset ('reflexarc fleet status' lists them)")
    if not args.reason or not args.reason.strip():
        raise CliError("fleet reset needs --reason TEXT: it is written to the rollout's history")
    try:
        state = reset(store, args.fleet_prefix, args.policy, args.reason.strip(), _who(), args.from_start)
    except KeyError:
        raise CliError(f"no rollout of policy {args.policy!r} under {args.fleet_prefix} "
                       f"('reflexarc fleet status' lists them)") from None
    last = state.history[-1]
    was = "was open" if last["was_open"] else "was not open"
    print(f"{args.policy}: breaker closed ({was}); stage {state.stage + 1}"
          + (" (back to the first: seats emptied)" if args.from_start else "") + f"; by {last['by']}")
    return 0
