"""Actuator parameters in one canonical form, and whether a change covers a fix.

Policies and scenarios may spell one parameter several ways (``443``, ``"443"``
or ``"443-443"``; ``"5m"`` or ``300``; ``CS1`` or ``8``). The simulated actuators
and the plant's fault matching compare canonical forms, typed by the parameter's
``ParamSpec`` in ``actuators/specs.py``.

Example::

    spec = SPECS["dscp"]
    normalise("dscp", spec.param("ports"), ["29500-29510", 443])   # [(29500, 29510), (443, 443)]
    covers(spec, {"dscp": "CS1", "ports": ["443"]},
           {"dscp": 8, "ports": ["400-500"], "interfaces": ["eth0"]})   # True

Overhead: a few comparisons per parameter; called when a change is planned and
when the set of applied changes changes.
"""
from __future__ import annotations

import re

from reflexarc.actuators.base import EVIDENCE_PARAM, ActuatorSpec, ParamSpec
from reflexarc.actuators.specs import dscp_code, port_ranges

_DURATION_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_NUMBER = r"\d+(?:\.\d+)?"
# Largest unit first; backtracking reads "5ms" as milliseconds, not minutes.
_DURATION_RE = re.compile("^" + "".join(f"(?:({_NUMBER}){unit})?" for unit in _DURATION_UNITS) + "$")


def parse_duration(value) -> float:
    """Seconds in ``value``: a number, or text such as ``250ms``, ``30s``, ``5m``, ``1h30m``."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as '30s' or '5m', got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip()
        match = _DURATION_RE.match(text)
        if re.fullmatch(_NUMBER, text):
            seconds = float(text)
        elif text and match and any(match.groups()):
            seconds = sum(float(n) * unit for n, unit in zip(match.groups(), _DURATION_UNITS.values()) if n)
        else:
            raise ValueError(f"bad duration '{value}': use e.g. '250ms', '30s', '5m', '1h30m'")
    if seconds < 0 or seconds != seconds or seconds == float("inf"):
        raise ValueError(f"duration {value!r} must be a finite number of seconds >= 0")
    return seconds


_RANGE_RE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def cpu_list(value) -> list[int]:
    """CPU numbers from a list or a kernel-style list such as ``"0-3,8,10-11"``."""
    if isinstance(value, (list, tuple)):
        return sorted({int(v) for v in value})
    out = set()
    for part in str(value).split(","):
        match = _RANGE_RE.match(part)
        if not match:
            raise ValueError(f"bad CPU list '{value}': use e.g. '0-15' or '0-3,8'")
        lo, hi = int(match.group(1)), int(match.group(2) or match.group(1))
        out.update(range(lo, hi + 1))
    return sorted(out)


def normalise(actuator: str, param: ParamSpec, value):
    """Canonical form of one parameter value; raises ValueError when it does not fit its type."""
    if value is None:
        return None
    if (actuator, param.name) == ("dscp", "dscp"):
        return dscp_code(value)
    kind = param.type
    if kind == "str":
        out = str(value)
    elif kind == "int":
        if isinstance(value, bool) or not str(value).lstrip("-").isdigit():
            raise ValueError(f"'{param.name}' must be an integer, got {value!r}")
        out = int(value)
    elif kind == "float":
        out = float(value)
    elif kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"'{param.name}' must be true or false, got {value!r}")
        out = value
    elif kind == "duration":
        out = parse_duration(value)
    elif kind == "int_list":
        out = cpu_list(value)
    elif kind == "str_list":
        out = sorted({str(v) for v in value}) if isinstance(value, (list, tuple)) else [str(value)]
    elif kind == "port_range":
        out = port_ranges(value)
    elif kind == "mapping":
        if not isinstance(value, dict):
            raise ValueError(f"'{param.name}' must be a mapping, got {value!r}")
        out = {str(k): v for k, v in value.items()}
    else:
        raise ValueError(f"parameter type '{kind}' of '{param.name}' is unknown")
    if param.choices and out not in param.choices:
        raise ValueError(f"'{param.name}' must be one of {', '.join(map(str, param.choices))}, got {value!r}")
    return out


def check_params(spec: ActuatorSpec, params: dict, partial: bool = False) -> dict:
    """Canonical forms of ``params``: unknown names, bad values and (unless ``partial``,
    for a subset such as a fault's remedy) missing required ones raise ValueError."""
    reserved = {EVIDENCE_PARAM} if spec.accepts_evidence else set()
    unknown = sorted(set(params) - {p.name for p in spec.params} - reserved)
    if unknown:
        raise ValueError(f"actuator '{spec.name}' has no parameter {', '.join(map(repr, unknown))}; "
                         f"it takes {', '.join(p.name for p in spec.params)}")
    missing = [] if partial else [p.name for p in spec.params if p.required and params.get(p.name) is None]
    if missing:
        raise ValueError(f"actuator '{spec.name}' needs parameter {', '.join(map(repr, missing))}")
    return {name: value if name == EVIDENCE_PARAM else normalise(spec.name, spec.param(name), value)
            for name, value in params.items()}


def _covered(kind: str, want, have) -> bool:
    if kind == "port_range":
        return all(any(lo <= wlo and whi <= hi for lo, hi in have) for wlo, whi in want)
    if kind in ("int_list", "str_list"):
        return set(want) <= set(have)
    if kind == "mapping":
        return all(key in have and str(have[key]) == str(value) for key, value in want.items())
    return want == have


def covers(spec: ActuatorSpec, want: dict, have: dict) -> bool:
    """Whether parameters ``have`` (a change) include every parameter of ``want`` (a fix).

    Port ranges must lie inside the change's ranges, lists must be subsets,
    mappings must agree on ``want``'s keys, scalars must be equal; a parameter
    the change leaves out counts as its default."""
    for name, value in want.items():
        param = spec.param(name)
        if param is None:
            return False
        got = have.get(name, param.default)
        if got is None:
            return False
        try:
            if not _covered(param.type, normalise(spec.name, param, value), normalise(spec.name, param, got)):
                return False
        except ValueError:
            return False
    return True
