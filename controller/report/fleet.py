"""One report across nodes: ``reflexarc report`` of several audit trails.

Give it audit files, or directories: every ``audit.jsonl`` under a directory
is one node's trail (its rotated files are read with it, ``audit.py``). Each
node gets the one-node report, unchanged, under ``nodes/NODE/``; the fleet's
own ``report.html``, ``report.json`` and ``report.md`` sit above them:

- **nodes**: each node's runs, time span, incidents by status, and the enforce
  changes the fleet refused (budget full, rollout stage, breaker open, store
  out of reach), with a link to its report;
- **incidents by job**: the incidents of every node grouped by the ``job``
  label of their target (the job a node found, ``docs/jobs.md``), else the
  one job their policy's selector matches (``match: {job: NAME}``), with the
  nodes each job's incidents came from and their policies and rules; the
  rest (a node-wide rule) are grouped as such;
- **budget and breaker**: the rollouts' ``widened`` and ``opened`` events one
  by one, and the refusals grouped by node, policy and reason (a refused
  change asks again every 10 s: one line per burst would drown the page).

A node is named by its ``run`` records' ``node`` (``reflexarc run
--node-name``, or the host name); an older trail without one by its
directory (``.../NODE/audit.jsonl``) or its file name. Two trails of one
name get ``-2``, ``-3``... so neither report overwrites the other; a name
that is not a safe directory name is one (``unique_name``) for its folder.

Example::

    paths = write_fleet_report(find_audits(["collected/"]), "out/fleet")
    paths["html"]      # out/fleet/report.html; out/fleet/nodes/gpu-a1/report.html ...

Overhead: each trail is read as for its own report (two passes), one at a
time; the fleet page holds a few counters per node and per job, and the
events it shows (``MAX_EVENTS``).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from reflexarc.core.input_files import check_regular
from reflexarc.core.outcomes import Outcome

from .audit import Audit, load_audit
from .fmt import Clock, duration, plural
from .incidents import status_rank
from .view_incidents import tone_of

AUDIT_NAME = "audit.jsonl"
MAX_AUDITS = 4096             # trails in one report: a fleet's collected audits, not a file system walk gone wrong
MAX_EVENTS = 200              # rollout events and refusal groups the pages list; report.json has them all
NO_JOB = "(no job label)"
_NODE_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


class FleetInputError(ValueError):
    """A path that holds no audit trail, or too many."""


def find_audits(paths: list[str | Path]) -> list[Path]:
    """The audit files ``paths`` name: a file as it is, a directory's every
    ``audit.jsonl`` below it (in path order). A directory without one, or
    more than ``MAX_AUDITS`` in all, is a ``FleetInputError``."""
    found: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            below = sorted(p for p in path.rglob(AUDIT_NAME) if not p.is_dir())
            if not below:
                raise FleetInputError(f"{path}: no {AUDIT_NAME} in it or below it")
            for p in below:
                check_regular(p)            # a FIFO or a device named audit.jsonl is refused, not read
            found.extend(below)
        else:
            check_regular(path)
            found.append(path)
        if len(found) > MAX_AUDITS:
            raise FleetInputError(f"more than {MAX_AUDITS} audit trails: report on fewer at a time")
    once: dict[Path, Path] = {}
    for p in found:
        once.setdefault(p.resolve(), p)        # once each, as first named
    return list(once.values())


def node_of(audit: Audit, path: Path) -> str:
    """The node a trail is from: its runs' ``node``, else its directory's or file's name."""
    named = [r.run.get("node") for r in audit.runs if r.run is not None and isinstance(r.run.get("node"), str)]
    if named and named[-1]:
        return named[-1]
    return path.parent.name if path.name == AUDIT_NAME and path.parent.name else path.stem


def job_of(target: str, policy_job: str | None = None) -> str:
    """The ``job`` label of a target key (``job=a,rank=0``), else ``policy_job``, else ``NO_JOB``."""
    for part in str(target).split(","):
        name, _, value = part.partition("=")
        if name.strip() == "job" and value:
            return value
    return policy_job or NO_JOB


def policy_jobs(audit: Audit) -> dict[str, str]:
    """Policy name -> the one job its selector matches, as the trail's runs described them."""
    return {name: d["job"] for run in audit.runs for name, d in run.policies.items()
            if isinstance(d, dict) and isinstance(d.get("job"), str)}


@dataclass
class NodeLine:
    node: str
    audit: str                     # the trail's path
    link: str                      # its report, relative to the fleet's
    runs: int
    first: float | None
    last: float | None
    complete: bool
    malformed: int
    wall: bool
    statuses: Counter = field(default_factory=Counter)
    refused: Counter = field(default_factory=Counter)     # reason -> count


@dataclass
class JobLine:
    job: str
    nodes: set = field(default_factory=set)
    statuses: Counter = field(default_factory=Counter)
    rules: set = field(default_factory=set)               # "policy/rule"
    first: float | None = None
    last: float | None = None

    def add(self, node: str, incident: dict) -> None:
        self.nodes.add(node)
        self.statuses[incident.get("status") or "open"] += 1
        self.rules.add(f"{incident.get('policy')}/{incident.get('rule')}")
        onset, last = incident.get("onset"), incident.get("last_ts")
        if isinstance(onset, (int, float)):
            self.first = onset if self.first is None else min(self.first, onset)
        if isinstance(last, (int, float)):
            self.last = last if self.last is None else max(self.last, last)


@dataclass
class FleetFold:
    """What the fleet page shows, gathered node by node."""

    nodes: list[NodeLine] = field(default_factory=list)
    jobs: dict[str, JobLine] = field(default_factory=dict)
    rollout_events: list[dict] = field(default_factory=list)    # {ts, node, policy, event, stage, detail}
    refusals: dict[tuple, dict] = field(default_factory=dict)   # (node, policy, reason) -> {count, first, last}

    def incident(self, node: NodeLine, incident: dict, jobs: dict[str, str]) -> None:
        node.statuses[incident.get("status") or "open"] += 1
        job = job_of(incident.get("target", ""), jobs.get(incident.get("policy")))
        self.jobs.setdefault(job, JobLine(job)).add(node.node, incident)

    def trail(self, node: NodeLine, audit: Audit) -> None:
        """The rollout events and refusals of one node's trail."""
        for rec in audit.hands:
            if rec.get("kind") == "rollout":
                self.rollout_events.append({"ts": rec["ts"], "node": node.node, "policy": rec.get("policy"),
                                            "event": rec.get("event"), "stage": rec.get("stage"),
                                            "detail": rec.get("detail")})
        for (_, policy, _rule, _target), track in audit.tracks.items():
            for action in track.actions:
                if action.get("outcome") != Outcome.REFUSED:
                    continue
                reason = str(action.get("refusal") or "other")
                node.refused[reason] += 1
                group = self.refusals.setdefault((node.node, policy, reason),
                                                 {"count": 0, "first": action["ts"], "last": action["ts"]})
                group["count"] += 1
                group["first"] = min(group["first"], action["ts"])
                group["last"] = max(group["last"], action["ts"])


def unique_name(node: str, taken: set[str]) -> str:
    """``node`` made safe as a directory name, with ``-2``, ``-3``... when taken."""
    base = _NODE_SAFE.sub("_", node).strip("._") or "node"
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}-{n}"
    taken.add(name)
    return name


def fold_fleet(audits: list[Path], out: Path, full: bool, write_node) -> FleetFold:
    """Write each trail's own report under ``out/nodes/`` (``write_node(audit,
    dir, full, on_incident)``: the one-node writer) and fold what the fleet page shows."""
    fold, taken, seen = FleetFold(), set(), Counter()
    for path in audits:
        audit = load_audit(path)
        name = node_of(audit, path)
        folder = unique_name(name, taken)
        seen[name] += 1
        line = NodeLine(name if seen[name] == 1 else f"{name}-{seen[name]}", str(path),
                        f"nodes/{folder}/report.html", len(audit.runs), audit.first_ts, audit.last_ts,
                        audit.complete, audit.malformed_count, audit.wall_clock)
        jobs = policy_jobs(audit)
        write_node(audit, out / "nodes" / folder, full,
                   lambda incident, line=line, jobs=jobs: fold.incident(line, incident, jobs))
        fold.trail(line, audit)
        fold.nodes.append(line)
    fold.rollout_events.sort(key=lambda e: e["ts"])
    return fold


# --- the view ---------------------------------------------------------------------------------------
@dataclass
class Chip:
    text: str
    tone: str


def chips(statuses: Counter) -> list[Chip]:
    return [Chip(f"{n:,} {s}", tone_of(s)) for s, n in sorted(statuses.items(), key=lambda kv: status_rank(kv[0]))]


def _names(names, limit: int = 6) -> str:
    names = sorted(names)
    more = len(names) - limit
    return ", ".join(names[:limit]) + (f" and {more} more" if more > 0 else "")


def _refused_text(refused: Counter) -> str:
    return ", ".join(f"{n:,} {r}" for r, n in refused.most_common()) or "-"


def fleet_view(fold: FleetFold) -> dict:
    """The fleet page's model: plain values, rendered by ``fleet.html.j2`` and ``fleet.md.j2``."""
    wall = any(n.wall for n in fold.nodes) or not fold.nodes
    clock = Clock(wall)
    firsts = [n.first for n in fold.nodes if n.first is not None]
    lasts = [n.last for n in fold.nodes if n.last is not None]
    incidents = sum((n.statuses for n in fold.nodes), Counter())
    refused = sum((n.refused for n in fold.nodes), Counter())
    opened = [e for e in fold.rollout_events if e["event"] == "opened"]
    head = [plural(len(fold.nodes), "node"), plural(sum(n.runs for n in fold.nodes), "controller run"),
            (f"{clock.stamp(min(firsts))} – {clock.stamp(max(lasts))} ({duration(max(lasts) - min(firsts))})"
             if firsts and lasts else "no records"),
            plural(sum(incidents.values()), "incident"), plural(sum(refused.values()), "refused change")]
    warnings = [f"{n.node}: its trail has no end record (the controller stopped without writing it, or still "
                f"runs)" for n in fold.nodes if not n.complete]
    warnings += [f"{n.node}: {plural(n.malformed, 'line')} skipped as malformed" for n in fold.nodes if n.malformed]
    warnings += [f"breaker of {e['policy']} opened by {e['node']} at {clock.stamp(e['ts'])}: {e['detail']}"
                 for e in opened]
    nodes = [{"node": n.node, "link": n.link, "audit": n.audit, "runs": n.runs,
              "span": f"{clock.at(n.first)} – {clock.at(n.last)}", "chips": chips(n.statuses),
              "refusals": _refused_text(n.refused), "complete": n.complete}
             for n in sorted(fold.nodes, key=lambda n: n.node)]
    jobs = sorted(fold.jobs.values(), key=lambda j: (j.job == NO_JOB, -sum(j.statuses.values()), j.job))
    job_rows = [{"job": j.job, "nodes": f"{len(j.nodes)}: {_names(j.nodes)}", "chips": chips(j.statuses),
                 "rules": _names(j.rules, 4), "first": clock.at(j.first), "last": clock.at(j.last)} for j in jobs]
    events = [{"ts": e["ts"], "at": clock.at(e["ts"]), "node": e["node"], "policy": e["policy"],
               "what": str(e["event"]),
               "detail": f"stage {e['stage']}: {e['detail']}", "tone": "bad" if e["event"] == "opened" else "good"}
              for e in fold.rollout_events]
    events += [{"at": clock.at(g["first"]), "node": node, "policy": policy, "what": f"refused: {reason}",
                "detail": f"{g['count']:,} time(s), {clock.at(g['first'])} – {clock.at(g['last'])}",
                "tone": "busy", "ts": g["first"]}
               for (node, policy, reason), g in fold.refusals.items()]
    events.sort(key=lambda e: e["ts"])
    return {"title": f"reflexarc fleet report: {plural(len(fold.nodes), 'node')}", "head": head,
            "warnings": warnings, "incidents": chips(incidents), "nodes": nodes, "jobs": job_rows,
            "events": events[:MAX_EVENTS], "events_more": max(0, len(events) - MAX_EVENTS)}


def fleet_json(fold: FleetFold) -> dict:
    """``report.json`` of the fleet: every node, job, rollout event and refusal group."""
    return {"nodes": [{"node": n.node, "audit": n.audit, "report": n.link, "runs": n.runs, "first_ts": n.first,
                       "last_ts": n.last, "complete": n.complete, "malformed": n.malformed,
                       "incidents": dict(n.statuses), "refused_by_reason": dict(n.refused)} for n in fold.nodes],
            "jobs": [{"job": j.job, "nodes": sorted(j.nodes), "incidents": dict(j.statuses),
                      "rules": sorted(j.rules), "first_ts": j.first, "last_ts": j.last}
                     for j in sorted(fold.jobs.values(), key=lambda j: j.job)],
            "rollout_events": fold.rollout_events,
            "refusals": [{"node": node, "policy": policy, "reason": reason, **g}
                         for (node, policy, reason), g in sorted(fold.refusals.items())]}
