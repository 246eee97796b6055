"""``reflexarc jobs``: the training jobs discovery finds on this node
(``reflexarc.core.jobs``), as a table or JSON, with the evidence each was found
by and the processes it skipped, by reason.

Example::

    print(format_jobs(discovery.jobs(), discovery.skipped))

Overhead: formatting only.
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping

from reflexarc.core.jobs import OWN_EVIDENCE, Job

NOT_FOUND = "(no job found)"


def _where(rank: dict) -> str:
    return f"pod {rank['pod']}" if rank["pod"] else rank["cgroup"] or "-"


def format_jobs(jobs: list[Job], skipped: Mapping[str, int]) -> str:
    rows = [("JOB", "RANK", "LOCAL", "WORLD", "PID", "PROCS", "LAUNCHER", "POD / CGROUP")]
    for job in jobs:
        for r in job.as_dict()["ranks"]:
            shown = lambda v: "-" if v is None else str(v)    # noqa: E731
            rows.append((job.name or NOT_FOUND, shown(r["rank"]), shown(r["local_rank"]), shown(r["world_size"]),
                         str(r["pid"]), str(len(r["processes"])), r["launcher"] or "-", _where(r)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    if len(rows) == 1:
        lines.append("no training job on this node")
    for job in jobs:
        if job.evidence == [OWN_EVIDENCE]:
            lines.append(f"{job.name}: found by process (owner of DataLoader workers; no launcher, pod or Slurm job)")
        elif job.name:
            lines.append(f"{job.name}: found by {', '.join(job.evidence)}")
        else:
            lines.append(f"{NOT_FOUND}: training processes whose environment could not be read (see skipped)")
    if any(skipped.values()):
        lines.append("skipped: " + ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.items()) if n))
    return "\n".join(lines)


def jobs_json(jobs: list[Job], skipped: Mapping[str, int]) -> str:
    return json.dumps({"jobs": [j.as_dict() for j in jobs], "skipped": dict(skipped)}, indent=2, sort_keys=True)


def cmd_jobs(args) -> int:
    from reflexarc.core.jobs import Discovery
    if os.geteuid() != 0:
        print("warning: not root: other users' processes cannot be read, so their jobs are not listed",
              file=sys.stderr)
    discovery = Discovery(args.proc_root, fallback=args.job)
    discovery.refresh()
    jobs = discovery.jobs()
    print(jobs_json(jobs, discovery.skipped) if args.json else format_jobs(jobs, discovery.skipped))
    return 0
