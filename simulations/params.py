"""Whether a change covers a fix: the plant's fault matching.

Policies and scenarios may spell one parameter several ways (``443``, ``"443"``
or ``"443-443"``; ``"5m"`` or ``300``; ``CS1`` or ``8``). A fault's remedy and
an applied change are compared in canonical forms, typed by the parameter's
``ParamSpec`` (``reflexarc.core.params``).

Example::

    covers(SPECS["dscp"], {"dscp": "CS1", "ports": ["443"]},
           {"dscp": 8, "ports": ["400-500"], "interfaces": ["eth0"]})   # True

Overhead: a few comparisons per parameter; called when the set of applied
changes changes.
"""
from __future__ import annotations

from reflexarc.core.params import ActuatorSpec, ParamError, convert


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
            if not _covered(param.type, convert(param, value), convert(param, got)):
                return False
        except ParamError:
            return False
    return True
