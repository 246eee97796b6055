"""``reflexarc validate FILE|DIR... [--node]``: check policy files
(``file:line:col: error: ...``), then what keeps them from working on this
node (``policy.readiness``); a user who is not root gets the checks that need
no node, with a note, unless ``--node``. Exit 1 on an error (``--strict``: on
a warning too).

Example::

    reflexarc validate policies/ --promql-config promql.yaml

Overhead: reading the policy files; as root, a look at the node's devices and jobs.
"""
from __future__ import annotations

import sys

from .shared import _node_findings, _note_unseen, _promql


def cmd_validate(args) -> int:
    from ..policy.loader import validate_paths
    policies, diags = validate_paths(args.paths)
    promql = _promql(args)
    diags = diags + promql.diagnostics
    if not any(d.is_error for d in diags):
        facts, found = _node_findings(args, policies, promql=promql.config)
        _note_unseen(facts)
        diags = sorted(diags + found)
    for d in diags:
        print(d)
    errors = [d for d in diags if d.is_error]
    if errors:
        print(f"error: {len(errors)} error(s) in {len(args.paths)} path(s)", file=sys.stderr)
        return 1
    print(f"ok: {len(policies)} policies, {sum(len(p.rules) for p in policies)} rules")
    return 0
