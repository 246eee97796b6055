"""DSCP values by name (RFC 4594 class selectors, assured forwarding, EF, LE)
or number, as the tc-BPF actuator, the simulation and policy checks read them.

Example::

    dscp_code("AF41")    # 34
    dscp_code("ef")      # 46 (names are case-insensitive)
    dscp_code(8)         # 8
    dscp_name(46)        # "EF"
    dscp_code("AF99")    # ValueError: bad DSCP 'AF99': use a name (CS0, ...) or a number 0-63

Overhead: a dictionary look-up per call.
"""
from __future__ import annotations

MAX_DSCP = 63
DSCP_CODES = {**{f"CS{n}": 8 * n for n in range(8)},
              **{f"AF{x}{y}": 8 * x + 2 * y for x in range(1, 5) for y in range(1, 4)},
              "EF": 46, "LE": 1}
DSCP_NAMES = tuple(DSCP_CODES)


def dscp_code(value) -> int:
    """DSCP number 0-63 from a name or a number; ValueError otherwise."""
    text = str(value).strip().upper()
    if not isinstance(value, bool):
        if text in DSCP_CODES:
            return DSCP_CODES[text]
        if text.isdigit() and 0 <= int(text) <= MAX_DSCP:
            return int(text)
    raise ValueError(f"bad DSCP '{value}': use a name ({', '.join(DSCP_NAMES)}) or a number 0-{MAX_DSCP}")


def dscp_name(code: int) -> str:
    """The name of DSCP number ``code``, or the number as text when it has none."""
    return next((name for name, c in DSCP_CODES.items() if c == code), str(code))
