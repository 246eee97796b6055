"""Target keys: the one text form of a target's labels, used by the journal,
the audit log, metrics and reports.

Example::

    target_key({"trainer": "4242", "rank": "0"})   # "rank=0,trainer=4242"
    target_key({})                                 # "*": the policy as a whole

Overhead: a sort and a join of a few labels.
"""
from __future__ import annotations


def target_key(labels: dict) -> str:
    """``k=v`` pairs sorted by label name and joined by commas; ``*`` for no labels."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "*"
