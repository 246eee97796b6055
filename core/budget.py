"""A fleet budget a policy declares (``budget:``): at most ``max_nodes`` nodes,
or ``max_percent`` % of the live ones, making the policy's enforce changes at
once, for the whole fleet (``per: policy``) or for each job apart (``per:
job``: a job on 64 nodes has its two slots, another job its own two). A
share is of the fleet's live nodes (``of: fleet``, the default), in each pool
alike, or, per job, of the nodes that run the job (``of: job``: each node
registers the jobs it found in the store, ``controller/fleet/budget.py``).

The node's command line (``run --fleet-max-nodes/--fleet-max-percent``) gives
the limit of every policy that declares none; a policy's own budget replaces
it for that policy. The slots live in etcd (``controller/fleet/budget.py``);
this module is the spec, the pool a change takes its slot in, and the
arithmetic of the limit, shared by the policy loader, the executor and the
fleet's client.

Example::

    spec = BudgetSpec(max_nodes=2, per="job")
    spec.pool("dataloader-numa", {"job": "llama-7b", "rank": "3"})   # 'policy:dataloader-numa:job:llama-7b'
    job_of_pool("policy:dataloader-numa:job:llama-7b")                 # 'llama-7b'
    BudgetSpec(max_percent=10).limit(live=45)                         # 5
    BudgetSpec(max_percent=25, per="job", of="job").limit(live=8)     # 2: 8 nodes run the job

Overhead: arithmetic on a few numbers.
"""
from __future__ import annotations

import math
import re
import urllib.parse
from dataclasses import dataclass

PER = ("policy", "job")
OF = ("fleet", "job")
JOB_POOL = ":job:"
PERCENT_PATTERN = r"^\s*([0-9]+(?:\.[0-9]+)?)\s*%\s*$"


def parse_percent(value, what: str = "a share") -> float:
    """``"10%"`` or a number, > 0 and <= 100; ValueError saying why, about ``what``."""
    if isinstance(value, bool):
        raise ValueError(f"{what} is a share such as '90%'")
    if isinstance(value, (int, float)):
        rate = float(value)
    else:
        match = re.match(PERCENT_PATTERN, str(value))
        if not match:
            raise ValueError(f"{what} is a share such as '90%', got {value!r}")
        rate = float(match.group(1))
    if not 0 < rate <= 100:
        raise ValueError(f"{what} of {rate:g} % is not > 0 % and <= 100 %")
    return rate


def limit(live: int, max_nodes: int | None, max_percent: float | None) -> int:
    """How many nodes may act at once with ``live`` nodes alive: the smaller of
    the count and the share (rounded up, at least 1; 0 of an empty fleet)."""
    limits = []
    if max_nodes is not None:
        limits.append(max_nodes)
    if max_percent is not None:
        limits.append(max(1, math.ceil(max_percent * live / 100 - 1e-9)) if live else 0)
    return min(limits)


@dataclass(frozen=True)
class BudgetSpec:
    max_nodes: int | None = None
    max_percent: float | None = None
    per: str = "policy"
    of: str = "fleet"          # a share of the fleet's live nodes, or (per job) of the job's

    def limit(self, live: int) -> int:
        """The limit with ``live`` nodes: the fleet's, or with ``of: job`` the job's."""
        return limit(live, self.max_nodes, self.max_percent)

    def pool(self, policy: str, labels: dict, job: str | None = None) -> str:
        """The pool a change of ``policy`` to a target of ``labels`` takes its
        slot in: the policy's, or (``per: job``) the policy's for the target's
        job: its ``job`` label, else ``job`` (the one its selector names). The
        loader sees that one of them exists; a target that still has neither
        shares one pool with every such target of the policy."""
        if self.per == "policy":
            return f"policy:{policy}"
        name = labels.get("job") or job
        return f"policy:{policy}{JOB_POOL}{quote_job(name)}" if name else f"policy:{policy}:no-job"

    def describe(self) -> str:
        parts = []
        if self.max_nodes is not None:
            parts.append(f"{self.max_nodes} node{'s' if self.max_nodes != 1 else ''}")
        if self.max_percent is not None:
            parts.append(f"{self.max_percent:g} % of " + ("the job's nodes" if self.of == "job" else "the live nodes"))
        return f"at most {' and '.join(parts)} at once" + (" per job" if self.per == "job" else "")

    def to_dict(self) -> dict:
        return {"max_nodes": self.max_nodes, "max_percent": self.max_percent, "per": self.per, "of": self.of}


def quote_job(job) -> str:
    """A job's name as it stands in pool names and etcd keys (no ``/``, no spaces)."""
    return urllib.parse.quote(str(job), safe="")


def job_of_pool(pool: str) -> str | None:
    """The job of a per-job pool (``BudgetSpec.pool``), quoted (``quote_job``);
    None for any other pool."""
    _, sep, quoted = pool.partition(JOB_POOL)
    return quoted or None if sep else None
