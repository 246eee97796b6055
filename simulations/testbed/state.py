"""What the controller could have changed on the testbed, as a snapshot to diff:
the tc state of every testbed namespace (qdiscs, classes, filters, tcx links),
reflexarc's pins under bpffs, the journal's open entries, the CPU affinity of
the job's processes and the DataLoader settings each rank reports.

A closed-loop run takes one snapshot before the controller starts and one after
it stopped; ``diff`` of the two must be empty: every change was rolled back.

Example::

    before = snapshot(tb, job, state_dir)
    ...                                  # controller runs, acts, shuts down
    diff(before, snapshot(tb, job, state_dir))    # [] when nothing was left behind

Overhead: a few ``tc``/``bpftool`` calls per interface (~50 ms in all).
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from .controller import open_changes
from .handle import Job
from .topology import Testbed

PIN_ROOT = Path("/sys/fs/bpf/reflexarc")


def _json(*argv: str):
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if r.returncode != 0 or not r.stdout.strip():
        return None
    return json.loads(r.stdout)


def _links(netns: str) -> list[str]:
    return [link["ifname"] for link in _json("ip", "-n", netns, "-j", "link", "show") or []]


def _text(*argv: str) -> list[str]:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    return r.stdout.splitlines() if r.returncode == 0 else []


def _tc(netns: str, iface: str) -> dict:
    """tc's own listing (no statistics), line by line: its JSON output does not cover classes here."""
    tc = ("tc", "-n", netns)
    return {
        "qdiscs": _text(*tc, "qdisc", "show", "dev", iface),
        "classes": _text(*tc, "class", "show", "dev", iface),
        "egress": _text(*tc, "filter", "show", "dev", iface, "egress"),
        "ingress": _text(*tc, "filter", "show", "dev", iface, "ingress"),
    }


def _tcx(netns: str) -> list:
    return _json("ip", "netns", "exec", netns, "bpftool", "-j", "net", "show") or []


def _affinity(pid: int) -> list[str]:
    """The distinct CPU sets of a process's threads."""
    masks = set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            masks.add(",".join(map(str, sorted(os.sched_getaffinity(int(tid))))))
    except OSError:
        return []
    return sorted(masks)


def _loader(job: Job) -> dict:
    out = {}
    for rank in job.ranks:
        steps = [line for line in rank.lines() if line.get("step") is not None]
        if steps:
            out[str(rank.rank)] = {"workers": steps[-1].get("workers"), "prefetch": steps[-1].get("prefetch")}
    return out


def snapshot(tb: Testbed, job: Job | None, state_dir: Path) -> dict:
    namespaces = [tb.rank_netns(i) for i in range(tb.ranks)] + [tb.switch_netns, tb.spine_netns, tb.store_netns]
    tc = {f"{ns}:{iface}": _tc(ns, iface) for ns in namespaces for iface in _links(ns)}
    pins = sorted(str(p.relative_to(PIN_ROOT)) for p in PIN_ROOT.rglob("*")) if PIN_ROOT.exists() else []
    return {
        "tc": tc,
        "tcx": {ns: _tcx(ns) for ns in namespaces},
        "pins": pins,
        "journal_open": open_changes(state_dir),
        "affinity": {str(pid): _affinity(pid) for pid in (job.pids if job else [])},
        "loader": _loader(job) if job else {},
    }


def diff(before: dict, after: dict, path: str = "") -> list[str]:
    """Human-readable differences, one line each ("tc/rxtb1r0:rxtb1e0/egress: [] -> [...]")."""
    if isinstance(before, dict) and isinstance(after, dict):
        out = []
        for key in sorted(set(before) | set(after)):
            where = f"{path}/{key}" if path else key
            if key not in before:
                out.append(f"{where}: added {json.dumps(after[key])[:300]}")
            elif key not in after:
                out.append(f"{where}: removed {json.dumps(before[key])[:300]}")
            else:
                out += diff(before[key], after[key], where)
        return out
    if before != after:
        return [f"{path}: {json.dumps(before)[:300]} -> {json.dumps(after)[:300]}"]
    return []
