"""``reflexarc explain FILE|DIR... [--policy-name NAME]``: say in plain words
what each policy will do, when, and what it needs on this node
(``policy.explain``), the node judged as ``validate`` and ``run`` judge it.

Example::

    reflexarc explain policies/ --policy-name dataloader-starvation

Overhead: reading the policy files; as root, a look at the node's devices.
"""
from __future__ import annotations

import sys

from .shared import CliError, _load_policies, _node_findings, _note_unseen, _promql


def cmd_explain(args) -> int:
    from reflexarc.core.signals import suggest

    from ..policy.explain import explain
    policies = _load_policies(args.paths)
    if args.policy_name:
        names = [p.name for p in policies]
        policies = [p for p in policies if p.name == args.policy_name]
        if not policies:
            hint = suggest(args.policy_name, names)
            raise CliError(f"no policy '{args.policy_name}' in {', '.join(args.paths)}"
                           + (f"; did you mean '{hint}'?" if hint else f" (there: {', '.join(names)})"))
    promql = _promql(args)
    for finding in promql.diagnostics:
        print(finding, file=sys.stderr)
    if any(d.is_error for d in promql.diagnostics):
        raise CliError(f"{sum(d.is_error for d in promql.diagnostics)} error(s) in {args.promql_config}")
    facts, _ = _node_findings(args, [], promql=promql.config)   # the node as validate and run see it
    _note_unseen(facts)
    print(explain(policies, facts, receiver=bool(args.alertmanager_url or args.webhook_url)), end="")
    return 0
