"""What keeps a valid policy from working on this node, said before it runs:
a signal nothing here produces, an alert with no receiver to send it to, a
policy that needs a device this node lacks.

``validate`` prints these findings (warnings; errors under ``--strict``) and
``run`` prints the same at start, so a policy that can never fire is seen when
it is installed, not after the incident it was meant to catch. A policy that
declares ``requires: [gpu]`` (or ``rdma``) on a node without one, or
``requires: [promql]`` where no PromQL source is configured, is idle here: a
note, not a warning, and ``run`` leaves it out.

``validate`` and ``explain`` run by a user who is not root (linting policies
anywhere) do not look at the node, whose probes' attach points only root may
read: ``CatalogueFacts`` judges from the signal catalogue alone, and
``note()`` is the one line saying which checks were skipped and why.

Example::

    for finding in findings(policies, NodeFacts(), receiver=False):
        print(finding)
    # policies/x.yaml:9:15: warning: signal 'gpu_utilization_pct' has no producer on this node:
    #   NVML: no GPU (no /dev/nvidia<N>); a PromQL source: no PromQL source configured

Overhead: see ``producers.py``; a walk over the policies' conditions.
"""
from __future__ import annotations

import fnmatch
import os

from reflexarc.core.diagnostics import Diagnostic

from ..signals.catalogue import why_unproduced
from ..signals.producers import PROMQL, NodeFacts, Producer
from .model import Loc, Policy, conditions_of

NETNS_DIR = "/run/netns"            # where ip netns keeps the named namespaces

NOTE, WARNING, ERROR = "note", "warning", "error"
NODE_CHECKS = ("whether each signal's producers can run here, required devices, interfaces and network "
               "namespaces, running jobs")


class CatalogueFacts(NodeFacts):
    """The node unseen: every catalogued producer counts as able to run and every
    required device as present; only the PromQL configuration, which is given,
    is checked. ``reason``: why the node is not looked at, e.g. "not root"."""

    def __init__(self, reason: str, promql: bool | frozenset[str] = False) -> None:
        super().__init__(promql=promql)
        self.reason = reason

    def why_not(self, producer: Producer, signal: str = "") -> str | None:
        return super().why_not(producer, signal) if producer.kind == PROMQL else None

    def missing(self, requirement: str) -> str | None:
        return super().missing(requirement) if requirement == PROMQL else None

    def note(self) -> str:
        return (f"note: {self.reason}: this node's checks skipped ({NODE_CHECKS}): judged from the signal "
                f"catalogue; --node checks this node")


def idle_reason(policy: Policy, facts: NodeFacts) -> str | None:
    """Why ``policy`` stays idle on this node (a device or source it requires is missing), or None."""
    missing = [m for m in (facts.missing(kind) for kind in policy.requires) if m]
    return "; ".join(missing) or None


def sends_alerts(policy: Policy, mode: str) -> bool:
    return mode != "dry-run" and (mode == "alert-only" or any(
        a.actuator == "alert" for r in policy.rules for a in r.actions))


def findings(policies: list[Policy], facts: NodeFacts, receiver: bool, mode_override: str | None = None,
             strict: bool = False) -> list[Diagnostic]:
    """Located findings, in file order; ``strict`` makes warnings errors."""
    severity = ERROR if strict else WARNING
    out = []
    for policy in policies:
        idle = idle_reason(policy, facts)
        if idle:
            out.append(_at(policy.loc, NOTE, f"policy {policy.name} requires {', '.join(policy.requires)}: "
                                             f"idle on this node: {idle}"))
            continue
        for rule in policy.rules:
            verify = rule.verify.when if rule.verify else None
            for cond in conditions_of(rule.when) + conditions_of(verify):
                reason = why_unproduced(cond.signal, facts)
                if reason:
                    out.append(_at(cond.loc or rule.loc, severity,
                                   f"signal '{cond.signal}' has no producer on this node: {reason}"))
        for missing in _places_missing(policy, facts):
            out.append(_at(policy.selector.loc or policy.loc, severity, f"policy {policy.name}: {missing}"))
        unseen = _jobs_not_running(policy, facts.jobs)
        if unseen:
            out.append(_at(policy.selector.loc or policy.loc, NOTE,
                           f"policy {policy.name} names {unseen}, and no such job runs on this node now "
                           f"(running: {', '.join(facts.jobs) or 'none'}; reflexarc jobs lists them): it "
                           f"reads nothing until one starts"))
        mode = mode_override or policy.mode
        if not receiver and sends_alerts(policy, mode):
            out.append(_at(policy.loc, severity, f"policy {policy.name} ({mode}) sends alerts, but no alert "
                                                 "receiver is configured: give --alertmanager-url or --webhook-url"))
    return sorted(set(out))


def _places_missing(policy: Policy, facts: NodeFacts) -> list[str]:
    """The selector's network namespace, or its interfaces in the controller's
    own namespace, that do not exist here (interfaces inside another namespace
    are checked when the probe attaches there)."""
    if isinstance(facts, CatalogueFacts):
        return []
    s = policy.selector
    if s.netns:
        path = s.netns if s.netns.startswith("/") else os.path.join(NETNS_DIR, s.netns)
        return [] if os.path.exists(path) else [f"network namespace {s.netns} does not exist (no {path})"]
    net = os.path.join(facts.devices.sys_root, "class", "net")
    gone = [i for i in s.interfaces if not os.path.exists(os.path.join(net, i))]
    return [f"no interface {', '.join(gone)} on this node (nothing in {net}); set the selector's interfaces"] \
        if gone else []


def _jobs_not_running(policy: Policy, jobs: tuple[str, ...] | None) -> str:
    """The job names or globs of the policy's selector that no running job
    matches, in words; "" when all match or the jobs were not looked at."""
    if jobs is None:
        return ""
    s = policy.selector
    wanted = list(s.jobs)
    job_match = s.match.get("job")
    if job_match and not job_match.startswith(("~", "!")):
        wanted.append(job_match)
    missing = [w for w in wanted if not any(fnmatch.fnmatchcase(j, w) for j in jobs)]
    return ", ".join(f"job '{w}'" for w in missing)


def _at(loc: Loc | None, severity: str, message: str) -> Diagnostic:
    return Diagnostic(loc.file if loc else "<policy>", loc.line if loc else 1, loc.col if loc else 1,
                      severity, message)
