"""Durations as people write them: ``250ms``, ``30s``, ``5m``, ``1h30m``, ``2d``.

One grammar for policies, scenarios, policy tests, actuator parameters and the
command line. Units run from large to small, each at most once; a bare number
(YAML number or numeric string) is seconds. Negative, infinite and NaN durations
are rejected. ``DURATION_PATTERN`` is the same grammar as a regular expression,
for the JSON Schema.

Example::

    parse_duration("1h30m")   # 5400.0
    parse_duration("250ms")   # 0.25
    parse_duration(90)        # 90.0
    parse_duration("5 min")   # DurationError: ... e.g. '250ms', '30s', '5m', '1h30m' ...
    format_duration(5400)     # "1 h 30 m", for people (explain, actuator phrases)

Overhead: one regular-expression match per call.
"""
from __future__ import annotations

import math
import re

UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_NUMBER = r"[0-9]+(?:\.[0-9]+)?"
# Largest unit first; "ms" after "m" so that regex backtracking reads "5ms" as milliseconds.
_UNIT_GROUPS = "".join(f"(?:({_NUMBER}){unit})?" for unit in UNITS)
DURATION_PATTERN = rf"^(?:{_NUMBER}|(?=[0-9]){_UNIT_GROUPS})$"
_DURATION_RE = re.compile(DURATION_PATTERN)

EXAMPLES = "e.g. '250ms', '30s', '5m', '1h30m', '2d' (a bare number is seconds)"


class DurationError(ValueError):
    """A duration that does not parse; the message shows what would."""


def parse_duration(value: str | int | float) -> float:
    """Seconds in ``value``; raises ``DurationError`` with an example on bad input."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise DurationError(f"expected a duration, {EXAMPLES}; got {type(value).__name__} {value!r}")
    if isinstance(value, str):
        seconds = _parse_text(value)
    else:
        seconds = float(value)
    if math.isnan(seconds) or math.isinf(seconds):
        raise DurationError(f"duration {value!r} is not finite; use a number of seconds or {EXAMPLES}")
    if seconds < 0:
        raise DurationError(f"duration {value!r} is negative; durations are >= 0, {EXAMPLES}")
    return seconds


def _parse_text(text: str) -> float:
    stripped = text.strip()
    if stripped.startswith("-") and _DURATION_RE.match(stripped[1:]):
        raise DurationError(f"duration '{text}' is negative; durations are >= 0, {EXAMPLES}")
    match = _DURATION_RE.match(stripped)
    if not match:
        raise DurationError(f"bad duration '{text}': use a number with a unit, {EXAMPLES}")
    if not any(match.groups()):
        return float(stripped)
    return sum(float(amount) * factor for amount, factor in zip(match.groups(), UNITS.values()) if amount)


def format_duration(seconds: float) -> str:
    """``5`` -> ``"5 s"``, ``600`` -> ``"10 m"``, ``5400`` -> ``"1 h 30 m"``, ``0.25`` -> ``"250 ms"``."""
    if seconds < 1:
        return f"{seconds * 1000:g} ms"
    if seconds < 120:
        return f"{seconds:g} s"
    parts, rest = [], seconds
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count:g} {unit}")
    if rest:
        parts.append(f"{rest:g} s")
    return " ".join(parts)
