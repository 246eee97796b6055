"""What keeps a valid policy from working on this node, said before it runs:
a signal nothing here produces, an alert with no receiver to send it to, a
policy that needs a device this node lacks.

``validate`` prints these findings (warnings; errors under ``--strict``) and
``run`` prints the same at start, so a policy that can never fire is seen when
it is installed, not after the incident it was meant to catch. A policy that
declares ``requires: [gpu]`` (or ``rdma``) on a node without one, or
``requires: [promql]`` where no PromQL source is configured, is idle here: a
note, not a warning, and ``run`` leaves it out.

Example::

    for finding in findings(policies, NodeFacts(), receiver=False):
        print(finding)
    # policies/x.yaml:9:15: warning: signal 'gpu_utilization_pct' has no producer on this node:
    #   NVML: no GPU (no /dev/nvidia<N>); a PromQL source: no PromQL source configured

Overhead: see ``producers.py``; a walk over the policies' conditions.
"""
from __future__ import annotations

from .evaluate import conditions_of
from .policy.diagnostics import Diagnostic
from .policy.model import Loc, Policy
from .producers import NodeFacts, why_unproduced

NOTE, WARNING, ERROR = "note", "warning", "error"


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
        mode = mode_override or policy.mode
        if not receiver and sends_alerts(policy, mode):
            out.append(_at(policy.loc, severity, f"policy {policy.name} ({mode}) sends alerts, but no alert "
                                                 "receiver is configured: give --alertmanager-url or --webhook-url"))
    return sorted(set(out))


def _at(loc: Loc | None, severity: str, message: str) -> Diagnostic:
    return Diagnostic(loc.file if loc else "<policy>", loc.line if loc else 1, loc.col if loc else 1,
                      severity, message)
