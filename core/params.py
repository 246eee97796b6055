"""Actuator parameters: what each one is (``ParamSpec``, ``ActuatorSpec``) and
the one conversion of a value to its type's canonical form.

Policies, scenarios and the command line spell one parameter several ways
(``443``, ``"443"`` or ``"443-443"``; ``"5m"`` or ``300``; ``CS1`` or ``8``;
``"true"`` on a command line). ``convert`` turns any accepted spelling into
the canonical form of the parameter's type, so the policy loader, the command
line, the simulated and the real actuators agree on what a value means:

=========== ============================== =====================================
type        accepts                        canonical form
=========== ============================== =====================================
str         text or a number               ``str``
int         an integer or its text         ``int``
float       a number or its text           ``float`` (finite)
bool        true/false, or yes/no/1/0 text ``bool``
duration    ``"250ms"``, ``"1h30m"``, 90   seconds, ``float``
dscp        ``"EF"``, ``"af41"``, 46       DSCP number 0-63, ``int``
int_list    ``[3, 1]``, ``"0-3,8"``        sorted distinct ``int`` list (CPU numbers,
                                           each below ``MAX_CPUS``)
str_list    a list, or ``"a,b"`` text      ``str`` list, first occurrences kept
port_range  see ``reflexarc.core.ports``   ``[(lo, hi), ...]``
mapping     a mapping, or JSON object text ``dict`` with ``str`` keys
=========== ============================== =====================================

Example::

    spec = ActuatorSpec("dscp", "retag flows", (ParamSpec("dscp", "dscp", required=True),
                                                ParamSpec("ports", "port_range")))
    convert(spec.param("ports"), "29500-29510,443")   # [(29500, 29510), (443, 443)]
    check_params(spec, {"dscp": "CS1"})                # {"dscp": 8}
    check_params(spec, {"ports": [80]})                # ParamError: actuator 'dscp' needs parameter 'dscp'

Overhead: a few comparisons per parameter; called when a change is planned,
when a policy is loaded and when a command line is read.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from .cpus import parse_cpulist
from .dscp import dscp_code
from .durations import parse_duration
from .ports import port_ranges

PARAM_TYPES = ("str", "int", "float", "bool", "duration", "dscp", "int_list", "str_list", "port_range",
               "mapping")

EVIDENCE_PARAM = "evidence"
"""Reserved parameter the controller fills (never a policy) for actuators whose
spec ``accepts_evidence``: the evidence items of the conditions that fired."""

_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")
MAX_CPUS = 1 << 13       # the kernel's NR_CPUS at its largest: CPU numbers lie below it


class ParamError(ValueError):
    """A parameter value that does not fit its type; the message says what would."""


@dataclass(frozen=True)
class ParamSpec:
    """One actuator parameter; ``type`` is one of ``PARAM_TYPES``."""

    name: str
    type: str
    required: bool = False
    default: Any = None
    choices: tuple = ()
    help: str = ""


@dataclass(frozen=True)
class ActuatorSpec:
    """What a policy author needs to know about an actuator, without loading it."""

    name: str
    help: str
    params: tuple[ParamSpec, ...] = ()
    changes_system: bool = True   # False: notifies only (alert, log): nothing to verify or revert
    supports_dry_run: bool = True
    accepts_evidence: bool = False  # the controller adds EVIDENCE_PARAM to the params

    def param(self, name: str) -> ParamSpec | None:
        return next((p for p in self.params if p.name == name), None)


def convert(param: ParamSpec, value):
    """Canonical form of ``value`` for ``param`` (None stays None); ParamError
    when it does not fit the type or is not one of the choices."""
    if value is None:
        return None
    try:
        out = _convert(param.type, value)
    except ParamError:
        raise
    except ValueError as exc:   # the parsers' messages already say what would fit
        raise ParamError(str(exc)) from None
    if param.choices and out not in param.choices:
        raise ParamError(f"'{value}' is not one of {', '.join(map(str, param.choices))}")
    return out


def _convert(kind: str, value):
    if kind == "str":
        if isinstance(value, (bool, dict, list, tuple, set)):
            raise ParamError(f"{value!r} is not a valid str: use text or a number")
        return str(value)
    if kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        raise ParamError(f"'{value}' is not a valid int")
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ParamError(f"{value!r} is not a valid float")
        try:
            out = float(value)
        except ValueError:
            raise ParamError(f"'{value}' is not a valid float") from None
        if not math.isfinite(out):
            raise ParamError(f"'{value}' is not a finite number")
        return out
    if kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower() if isinstance(value, str) else None
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise ParamError(f"'{value}' is not a valid bool: use true or false")
    if kind == "duration":
        return parse_duration(value)
    if kind == "dscp":
        return dscp_code(value)
    if kind == "int_list":
        return _cpu_list(value)
    if kind == "str_list":
        if isinstance(value, str):
            items = [item.strip() for item in value.split(",") if item.strip()]
        elif isinstance(value, (list, tuple)):
            items = [str(item) for item in value]
        elif isinstance(value, (dict, set, bool)):
            raise ParamError(f"{value!r} is not a valid str_list: use a list")
        else:
            items = [str(value)]
        return list(dict.fromkeys(items))
    if kind == "port_range":
        return port_ranges(value)
    if kind == "mapping":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise ParamError(f"'{value}' is not a valid mapping: {exc}") from None
        if not isinstance(value, dict):
            raise ParamError(f"{value!r} is not a valid mapping")
        return {str(k): v for k, v in value.items()}
    raise ParamError(f"parameter type '{kind}' is unknown (known: {', '.join(PARAM_TYPES)})")


def _cpu_list(value) -> list[int]:
    """``parse_cpulist`` of CPUs below ``MAX_CPUS``; the numbers of a text are
    checked first, so that a range such as ``0-99999999999`` is never expanded."""
    if isinstance(value, str):
        _below_max_cpus([int(n) for n in re.findall(r"[0-9]+", value)])
    return _below_max_cpus(parse_cpulist(value))


def _below_max_cpus(cpus: list[int]) -> list[int]:
    if cpus and max(cpus) >= MAX_CPUS:
        raise ParamError(f"CPU {max(cpus)} is out of range: CPUs are numbered 0-{MAX_CPUS - 1}")
    return cpus


def check_params(spec: ActuatorSpec, params: dict, partial: bool = False) -> dict:
    """Canonical forms of ``params``: unknown names, bad values and (unless
    ``partial``, for a subset such as a fault's remedy) missing required ones
    raise ParamError. The reserved ``EVIDENCE_PARAM`` passes through untouched."""
    reserved = {EVIDENCE_PARAM} if spec.accepts_evidence else set()
    unknown = sorted(set(params) - {p.name for p in spec.params} - reserved)
    if unknown:
        raise ParamError(f"actuator '{spec.name}' has no parameter {', '.join(map(repr, unknown))}; "
                         f"it takes {', '.join(p.name for p in spec.params)}")
    missing = [] if partial else [p.name for p in spec.params if p.required and params.get(p.name) is None]
    if missing:
        raise ParamError(f"actuator '{spec.name}' needs parameter {', '.join(map(repr, missing))}")
    out = {}
    for name, value in params.items():
        if name in reserved:
            out[name] = value
            continue
        try:
            out[name] = convert(spec.param(name), value)
        except ParamError as exc:
            raise ParamError(f"parameter '{name}' of '{spec.name}': {exc}") from None
    return out
