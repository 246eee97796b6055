"""The whole fleet as its store holds it, in one read: the live nodes, each
pool's slots and queue (``budget.py``), the nodes each job is registered on,
each policy's rollout and breaker (``rollout.py``). ``reflexarc fleet status``
prints it.

Example::

    view = fleet_view(EtcdStore(endpoints), "/reflexarc")
    view["nodes"]                   # ["node-0", "node-1"]
    view["pools"]["policy:p"]       # {"slots": [{"slot": 0, "node": "node-0", ...}], "waiting": [...]}
    view["rollouts"]["p"]           # {"stage": 1, "open": False, "seats": [...], ...}
    view["jobs"]["llama"]           # ["node-0", "node-3"]: the nodes that registered the job

Overhead: one range read of the prefix.
"""
from __future__ import annotations

import json
import urllib.parse

from .rollout import State
from .store import EtcdStore


def _json(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        return {"unreadable": text[:200]}
    return value if isinstance(value, dict) else {"value": value}


def fleet_view(store: EtcdStore, prefix: str) -> dict:
    prefix = prefix.rstrip("/")
    nodes, pools, rollouts, jobs = [], {}, {}, {}
    for e in store.prefix(f"{prefix}/"):
        parts = e.key[len(prefix) + 1:].split("/")
        if parts[0] == "nodes" and len(parts) == 2:
            nodes.append(parts[1])
        elif parts[0] == "pools" and len(parts) == 4:
            pool = pools.setdefault(parts[1], {"slots": [], "waiting": []})
            if parts[2] == "slots":
                pool["slots"].append({"slot": parts[3], **_json(e.value)})
            elif parts[2] == "waiting":
                pool["waiting"].append({"node": parts[3], "created": e.created, **_json(e.value)})
        elif parts[0] == "jobs" and len(parts) == 3:
            jobs.setdefault(urllib.parse.unquote(parts[1]), []).append(parts[2])
        elif parts[0] == "rollouts" and len(parts) >= 3:
            rollout = rollouts.setdefault(parts[1], {"seats": []})
            if parts[2] == "state":
                try:
                    rollout.update(vars(State.parse(e.value)))
                except (ValueError, TypeError) as exc:
                    rollout["unreadable"] = str(exc)
            elif parts[2] == "seats" and len(parts) == 4:
                rollout["seats"].append({"node": parts[3], **_json(e.value)})
    for pool in pools.values():
        pool["waiting"].sort(key=lambda w: w["created"])
    return {"prefix": prefix, "nodes": sorted(nodes), "pools": pools, "rollouts": rollouts,
            "jobs": {job: sorted(on) for job, on in jobs.items()}}
