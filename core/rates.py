"""Link rates as tc writes them: ``"200mbit"``, ``"10gbit"``, ``"100000kbit"``,
or a plain number of bits per second.

Example::

    parse_rate("200mbit")   # 200_000_000
    parse_rate(1e9)         # 1_000_000_000
    format_rate(200_000_000)  # "200mbit"

Overhead: one regular expression match.
"""
from __future__ import annotations

import math
import re

UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
EXAMPLE = 'e.g. "200mbit", "25gbit" or bits per second'
_UNIT = "|".join(UNITS)
PATTERN = rf"^\s*[0-9]+(\.[0-9]+)?\s*({_UNIT})\s*$"   # the string form, for schemas
_RATE = re.compile(rf"\s*([0-9]+(?:\.[0-9]+)?)\s*({_UNIT})\s*", re.IGNORECASE)


class RateError(ValueError):
    pass


def parse_rate(value) -> int:
    """Bits per second from a tc rate or a number; RateError when it is neither or not > 0."""
    if isinstance(value, bool):
        raise RateError(f"{value!r} is not a rate ({EXAMPLE})")
    if isinstance(value, (int, float)):
        bits = float(value)
    else:
        m = _RATE.fullmatch(str(value))
        if not m:
            raise RateError(f"'{value}' is not a rate ({EXAMPLE})")
        bits = float(m.group(1)) * UNITS[m.group(2).lower()]
    if not math.isfinite(bits) or bits < 1:
        raise RateError(f"'{value}' is not a rate above 0 ({EXAMPLE})")
    return int(bits)


def format_rate(bits: int) -> str:
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bits % UNITS[unit] == 0:
            return f"{bits // UNITS[unit]}{unit}"
    return f"{bits}bit"
