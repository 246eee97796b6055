"""Rules as the policy wrote them: the ``when`` expression with its nesting of
``all`` and ``any``, for the pages to show with the values that fired it.

A rule in a ``run`` (or ``reload``) record may carry ``when`` (and
``verify_when``): the expression as nested JSON, a condition's text or
``{"all": [...]}`` / ``{"any": [...]}`` (``when_tree`` builds it from a policy
model). An older record has only ``conditions``, the flat list of texts; then
the policy file the record names is read again, and its rule's expression is
used when its conditions are the same texts in the same order (the file may
have changed since the run). Failing both, the expression is unknown and the
pages list the conditions without joining them with a word they cannot know.
A rule's rollback reads as people write it: the record's ``on ['shutdown',
'ttl']`` is shown as ``on shutdown, ttl``, ``on []`` as ``on none`` (``as_written``).

Example::

    spec = rule_specs(run)[("dataloader-numa-repin", "loader-p99-remote")]
    spec.when        # {"all": ['max(...) > 3x baseline', {"any": ['delta(...) > 0', 'mean(...) > 0.5']}]}
    when_text(spec.when)   # 'all(max(...) > 3x baseline, any(delta(...) > 0, mean(...) > 0.5))'
    when_tree(rule.when)   # from a policy model (Condition | Combo) to that form

Overhead: one read of each named policy file that lacks ``when``, once per report.
"""
from __future__ import annotations

import logging
import os
import re
import stat
from dataclasses import dataclass
from functools import lru_cache

from ..policy.model import COMBINATORS, when_tree

log = logging.getLogger("reflexarc.report")

MAX_POLICY_BYTES = 1 << 20
_LIST_REPR = re.compile(r"\[('[^'\[\]]*'(?:, '[^'\[\]]*')*)?\](, )?")    # ['shutdown', 'ttl'], ... or []


def as_written(text: str) -> str:
    """``on ['shutdown', 'ttl'], ttl 3600s`` as ``on shutdown, ttl; ttl 3600s``; ``on []`` as ``on none``."""
    return _LIST_REPR.sub(lambda m: (", ".join(item.strip("'") for item in m.group(1).split(", "))
                                     if m.group(1) else "none") + ("; " if m.group(2) else ""), text)


def valid_tree(tree) -> bool:
    if isinstance(tree, str):
        return True
    if isinstance(tree, dict) and len(tree) == 1:
        (kind, items), = tree.items()
        return kind in COMBINATORS and isinstance(items, list) and bool(items) and all(map(valid_tree, items))
    return False


def leaves(tree) -> list[str]:
    """The condition texts of an expression, in order."""
    if isinstance(tree, str):
        return [tree]
    (_, items), = tree.items()
    return [text for item in items for text in leaves(item)]


def when_text(tree) -> str:
    """One line: ``all(a, any(b, c))``."""
    if isinstance(tree, str):
        return tree
    (kind, items), = tree.items()
    return f"{kind}(" + ", ".join(when_text(item) for item in items) + ")"


@dataclass(frozen=True)
class RuleSpec:
    policy: str
    rule: str
    mode: str
    file: str | None
    conditions: tuple[str, ...]
    when: object                 # the expression (see the module docstring), or None when unknown
    when_from: str               # "audit", "policy file" or "" (unknown)
    verify: str | None           # as the record words it: "cond, cond within 90s"
    verify_when: object
    actions: tuple[str, ...]
    rollback: str | None


def _regular(path: str) -> bool:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size <= MAX_POLICY_BYTES


@lru_cache(maxsize=64)
def _file_trees(path: str) -> dict:
    """(policy, rule) -> (when, verify_when) of a policy file, or {} when it does not load."""
    if not _regular(path):
        return {}
    try:
        from ..policy.loader import validate_paths
        policies, _ = validate_paths([path])
    except Exception as exc:  # noqa: BLE001 - a report never fails on a policy file it only looks at
        log.debug("policy file %s not read: %s", path, exc)
        return {}
    out = {}
    for policy in policies:
        for rule in policy.rules:
            out[(policy.name, rule.name)] = (when_tree(rule.when), when_tree(rule.verify.when) if rule.verify else None)
    return out


def _spec(policy: dict, rule: dict, override) -> RuleSpec:
    name, rule_name = str(policy.get("name")), str(rule.get("name"))
    conditions = tuple(str(c) for c in rule.get("conditions") or () if isinstance(c, str))
    when, source, verify_when = rule.get("when"), "", rule.get("verify_when")
    if valid_tree(when):
        source = "audit"
    else:
        when = None
        if isinstance(policy.get("file"), str):
            found = _file_trees(policy["file"]).get((name, rule_name))
            if found and found[0] is not None and tuple(leaves(found[0])) == conditions:
                when, source = found[0], "policy file"
                verify_when = verify_when if valid_tree(verify_when) else found[1]
    if not valid_tree(verify_when):
        verify_when = None
    if when is None and len(conditions) == 1:
        when, source = conditions[0], "audit"       # a single condition needs no combinator
    return RuleSpec(name, rule_name, str(override or policy.get("mode") or "?"),
                    policy.get("file") if isinstance(policy.get("file"), str) else None, conditions, when, source,
                    rule.get("verify") if isinstance(rule.get("verify"), str) else None, verify_when,
                    tuple(str(a) for a in rule.get("actions") or ()),
                    as_written(rule["rollback"]) if isinstance(rule.get("rollback"), str) else None)


def rule_specs(run) -> dict[tuple[str, str], RuleSpec]:
    """Every rule a run declared (its ``run`` record and successful ``reload``s), by (policy, rule)."""
    override = (run.run or {}).get("mode_override")
    out = {}
    for policy in run.policies.values():
        for rule in policy.get("rules") or ():
            if isinstance(rule, dict):
                spec = _spec(policy, rule, override)
                out[(spec.policy, spec.rule)] = spec
    return out
