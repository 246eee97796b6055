"""Which values and timestamps a signal's samples may carry.

The valid range of a value follows from its signal's unit in the catalogue
(``signals.py``), declared here once per unit rather than by each source:
durations (``us``, ``ms``), byte and event counts (``bytes``, ``1``), rates
(``1/s``) and percentages (``%``) are never negative, a percentage is at
most ``MAX_PERCENT`` (it may read above 100: the demand offered to a shaped
link, over its nominal speed), a ``ratio`` lies in [0, 1]; a signal may be
narrower than its unit (``SIGNAL_RANGES``: a GPU is busy at most 100% of the
time); no value may be NaN or infinite (a unit missing here admits any
finite value, and ``tests/test_load_and_values.py`` fails until it is
declared). A timestamp must be finite, at most ``MAX_AHEAD`` seconds ahead
of the controller's clock and newer than the bus retention (an older one would
be expired at once). What is refused is a ``Refusal``, the ``reason`` of
``reflexarc_samples_rejected_total``.

Example::

    value_fault("dataloader_read_latency_us", -3.0)      # Refusal.BELOW_RANGE
    value_fault("numa_remote_ratio", 1.5)                # Refusal.ABOVE_RANGE
    value_fault("step_time_ms", 180.0)                   # None
    timestamp_fault(float("nan"), now=100.0, past=900)   # Refusal.TIMESTAMP_NOT_FINITE

Overhead: a dictionary look-up and up to three comparisons per sample.
"""
from __future__ import annotations

import math
from enum import StrEnum

from .catalogue import CATALOGUE

MAX_AHEAD = 60.0        # seconds a sample's own timestamp may run ahead of the clock

NEVER_NEGATIVE = (0.0, math.inf)
MAX_PERCENT = 10_000.0  # a hundred times a nominal capacity: beyond it a percentage is a broken source
UNIT_RANGES: dict[str, tuple[float, float]] = {
    "us": NEVER_NEGATIVE,
    "ms": NEVER_NEGATIVE,
    "bytes": NEVER_NEGATIVE,
    "1": NEVER_NEGATIVE,
    "1/s": NEVER_NEGATIVE,
    "%": (0.0, MAX_PERCENT),
    "ratio": (0.0, 1.0),
}
ANY_FINITE = (-math.inf, math.inf)
SIGNAL_RANGES: dict[str, tuple[float, float]] = {
    "gpu_utilization_pct": (0.0, 100.0),
    "dataloader_read_amplification_ratio": NEVER_NEGATIVE,   # bytes per byte: above 1 when the disks read more
}
RANGES: dict[str, tuple[float, float]] = {name: SIGNAL_RANGES.get(name, UNIT_RANGES.get(spec.unit, ANY_FINITE))
                                          for name, spec in CATALOGUE.items()}


class Refusal(StrEnum):
    NOT_FINITE = "not_finite"
    BELOW_RANGE = "below_range"
    ABOVE_RANGE = "above_range"
    TIMESTAMP_NOT_FINITE = "timestamp_not_finite"
    TIMESTAMP_FUTURE = "timestamp_future"
    TIMESTAMP_PAST = "timestamp_past"


def value_fault(name: str, value: float) -> Refusal | None:
    """Why ``value`` cannot be a sample of signal ``name``, or None."""
    if not math.isfinite(value):
        return Refusal.NOT_FINITE
    lo, hi = RANGES.get(name, ANY_FINITE)
    if value < lo:
        return Refusal.BELOW_RANGE
    if value > hi:
        return Refusal.ABOVE_RANGE
    return None


def timestamp_fault(ts: float, now: float, past: float) -> Refusal | None:
    """Why a sample stamped ``ts`` cannot be placed at ``now`` on a bus that keeps
    ``past`` seconds, or None."""
    if not math.isfinite(ts):
        return Refusal.TIMESTAMP_NOT_FINITE
    if ts > now + MAX_AHEAD:
        return Refusal.TIMESTAMP_FUTURE
    if ts <= now - past:
        return Refusal.TIMESTAMP_PAST
    return None
