"""L4 port ranges as policies, scenarios and the command line write them: a
port (``443``, ``"443"``), a range (``"29500-29510"``), a pair (``[lo, hi]``),
a list of those, or comma-separated text.

Ranges are inclusive ``(lo, hi)`` tuples with ``1 <= lo <= hi <= 65535``.
``PORT_RANGE_PATTERN`` is the text form as a regular expression, for the JSON
Schema.

Example::

    port_ranges(["29500-29510", 443])   # [(29500, 29510), (443, 443)]
    port_ranges("80,8000-8080")         # [(80, 80), (8000, 8080)]
    port_range("70-80")                 # (70, 80)
    format_port_ranges([(443, 443), (29500, 29510)])   # "443,29500-29510"
    port_range("80-70")                 # ValueError: bad port range '80-70': ...

Overhead: one regular-expression match per range.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

MAX_PORT = 65535
PORT_RANGE_PATTERN = r"^\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?$"
_PORT_RE = re.compile(PORT_RANGE_PATTERN)
EXAMPLE = "use a port (12345) or a range 'lo-hi' ('29500-29510')"


def port_range(item) -> tuple[int, int]:
    """One inclusive range from a port, ``"lo-hi"`` text or a ``[lo, hi]`` pair;
    ValueError otherwise."""
    if isinstance(item, (list, tuple)) and len(item) == 2 and all(
            isinstance(i, int) and not isinstance(i, bool) for i in item):
        lo, hi = item
    elif isinstance(item, int) and not isinstance(item, bool):
        lo = hi = item
    elif isinstance(item, str) and _PORT_RE.match(item):
        match = _PORT_RE.match(item)
        lo = int(match.group(1))
        hi = int(match.group(2)) if match.group(2) else lo
    else:
        raise ValueError(f"bad port '{item}': {EXAMPLE}")
    if not 1 <= lo <= hi <= MAX_PORT:
        shown = f"{lo}-{hi}" if isinstance(item, (list, tuple)) else str(item).strip()
        raise ValueError(f"bad port range '{shown}': ports are 1-{MAX_PORT} and lo <= hi")
    return (lo, hi)


def port_ranges(value) -> list[tuple[int, int]]:
    """Ranges of ``value``: None (none), one item, a list or tuple of items
    (each a port, text or a pair), or comma-separated text; ValueError on the
    first bad item."""
    if value is None:
        return []
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        items = [value]
    return [port_range(item) for item in items]


def format_port_ranges(ranges: Iterable[tuple[int, int]]) -> str:
    """``[(443, 443), (29500, 29510)]`` -> ``"443,29500-29510"``."""
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)
