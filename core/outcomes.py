"""The outcomes of an actuator step, as one Enum every layer compares against.

Values are the words written to the audit log, the journal and the metrics
(``StrEnum``: an outcome *is* its string, so records stay plain JSON).

Example::

    res.outcome is Outcome.APPLIED
    Outcome("would-revert")          # Outcome.WOULD_REVERT
    Outcome.PLANNED in WOULD_HAVE_ACTED

Overhead: none beyond a string comparison.
"""
from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    APPLIED = "applied"            # enforce: the change is on the system
    PLANNED = "planned"            # dry-run: the change that would have been made
    ALERTED = "alerted"            # alert-only: an alert describes the change instead
    NOOP = "noop"                  # the system already was as asked
    NOTIFIED = "notified"          # a notification (alert, log) was sent
    FAILED = "failed"
    REVERTED = "reverted"
    WOULD_REVERT = "would-revert"  # dry-run or alert-only counterpart of a revert
    RESOLVED = "resolved"          # an alert this controller raised was resolved
    ADOPTED = "adopted"            # a restarted controller kept a change (on_restart: adopt)
    KEPT = "kept"                  # rollback: never; the journal entry is closed
    TARGET_GONE = "target-gone"    # the process or object the change was made for no longer exists
    FORGOTTEN = "forgotten"        # an operator closed the entry without a revert (rollback --forget)
    REFUSED = "refused"            # enforce: the fleet's budget gave no slot; nothing was applied


WOULD_HAVE_ACTED = frozenset({Outcome.PLANNED, Outcome.ALERTED})
"""Outcomes that count as an action held back by the mode."""

TAKEN = frozenset({Outcome.APPLIED, Outcome.PLANNED, Outcome.ALERTED})
"""Outcomes that count against the node's action limits."""
