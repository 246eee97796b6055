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

A parameter may also carry a ``range`` (an int's bounds), a ``check`` finer
than its type (a tc class id, IP prefixes: the canonical value or ValueError),
the selector field it is filled from when not given (``from_selector``) and an
``example``. An ``ActuatorSpec`` is everything the rest of reflexarc knows of
an actuator without loading it: its parameters and the groups of which exactly
one is given (``one_of``), what it targets (``TARGETS``), how ``explain`` says
what it does, how the simulation stands in for it (``SIMULATIONS``) and which
class implements it with which ``ActuatorConfig`` fields (``implementation``,
``takes``). The policy loader, the JSON Schema, ``reflexarc act``, ``explain``,
the registry and the simulation all read it.

Example::

    spec = ActuatorSpec("dscp", "retag flows", (ParamSpec("dscp", "dscp", required=True),
                                                ParamSpec("ports", "port_range", from_selector="ports")))
    convert(spec.param("ports"), "29500-29510,443")   # [(29500, 29510), (443, 443)]
    check_params(spec, {"dscp": "CS1"})                # {"dscp": 8}
    check_params(spec, {"ports": [80]})                # ParamError: actuator 'dscp' needs parameter 'dscp'
    spec.resolve({"dscp": 8}, {"ports": [[443, 443]]})  # {"dscp": 8, "ports": [(443, 443)]}
    pin = ActuatorSpec("pin", "pin", (ParamSpec("node", "int", range=(0, 7)), ParamSpec("cpus", "int_list")),
                       one_of=(("node", "cpus"),))
    pin.chosen({"cpus": [1]})                          # ("cpus",)
    pin.chosen({})                                     # ParamError: actuator 'pin' needs one of node, cpus
    convert(pin.param("node"), 9)                      # ParamError: 9 is out of range (0..7)

Overhead: a few comparisons per parameter; called when a change is planned,
when a policy is loaded and when a command line is read.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
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


TARGETS = {
    "process": "processes of a job: reflexarc act needs --pid, --cgroup, --job or a pid/trainer label",
    "link": "the job's network interfaces",
    "node": "the node as a whole, or nothing on it (a notification)",
}
SIMULATIONS = {
    "knob": "a generic stand-in: the change is a knob on the simulated plant, keyed by actuator and target",
    "plant": "a stand-in the plant models (simulations/sim_actuators.py)",
    "real": "the real implementation, which touches nothing a simulation cares about (log)",
}


@dataclass(frozen=True)
class ParamSpec:
    """One actuator parameter; ``type`` is one of ``PARAM_TYPES``.

    ``range``: an int's lowest and highest value. ``check``: turns the
    canonical value into its final form, or raises ValueError saying what would
    fit. ``from_selector``: the selector field whose value a missing parameter
    takes; with ``required``, one of the two must be set. ``example``: a value
    as a policy writes it."""

    name: str
    type: str
    required: bool = False
    default: Any = None
    choices: tuple = ()
    help: str = ""
    range: tuple[int, int] | None = None
    check: Callable[[Any], Any] | None = None
    from_selector: str = ""
    example: Any = None


@dataclass(frozen=True)
class ActuatorSpec:
    """What the rest of reflexarc knows about an actuator, without loading it."""

    name: str
    help: str
    params: tuple[ParamSpec, ...] = ()
    changes_system: bool = True   # False: notifies only (alert, log): nothing to verify or revert
    accepts_evidence: bool = False  # the controller adds EVIDENCE_PARAM to the params
    one_of: tuple[tuple[str, ...], ...] = ()   # groups of parameters of which exactly one is given
    replaced: tuple[tuple[str, str], ...] = ()  # (former parameter, what to write instead)
    target: str = "node"                  # one of TARGETS
    explain: Callable[[dict], str] | None = None   # what one action does, from its resolved params
    simulated: str = "knob"               # one of SIMULATIONS
    implementation: str = ""              # "module:Class" in reflexarc.actuators
    takes: tuple[str, ...] = ()           # the ActuatorConfig fields its constructor takes
    held_by_controller: bool = False      # lasts only while the controller that made it runs:
                                          # reflexarc act plans it but cannot enforce it

    def __post_init__(self) -> None:
        names = {p.name for p in self.params}
        unknown = [n for group in self.one_of for n in group if n not in names]
        if unknown or self.target not in TARGETS or self.simulated not in SIMULATIONS:
            raise ValueError(f"actuator spec '{self.name}': parameters {unknown} in one_of, target "
                             f"'{self.target}', simulated '{self.simulated}': check them against the parameters, "
                             f"TARGETS and SIMULATIONS")

    def param(self, name: str) -> ParamSpec | None:
        return next((p for p in self.params if p.name == name), None)

    def replacement(self, name: str) -> str | None:
        """What to write instead of the former parameter ``name``, or None."""
        return dict(self.replaced).get(name)

    def chosen(self, params: dict) -> tuple[str, ...]:
        """The parameter given of each ``one_of`` group, in order (None, false,
        empty text or an empty list count as not given); ParamError naming the
        group when none or several are given."""
        out = []
        for group in self.one_of:
            given = [name for name in group if params.get(name) is not None and params[name] is not False
                     and params[name] not in ("", [], ())]
            if len(given) != 1:
                raise ParamError(f"actuator '{self.name}' needs exactly one of {', '.join(group)} "
                                 f"(got {', '.join(given) or 'none'})")
            out.append(given[0])
        return tuple(out)

    def resolve(self, params: dict, selector: Mapping) -> dict:
        """``params`` with each missing parameter that has a ``from_selector``
        field taken from ``selector`` (a target's selector, or a policy's as
        ``Selector.to_dict()``), in canonical form; ParamError for a selector
        value that does not fit."""
        out = dict(params)
        for param in self.params:
            value = selector.get(param.from_selector) if param.from_selector else None
            if out.get(param.name) in (None, "", []) and value not in (None, "", [], ()):
                try:
                    out[param.name] = convert(param, value)
                except ParamError as exc:
                    raise ParamError(f"selector.{param.from_selector}: {exc}") from None
        return out


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
    if param.range is not None and not param.range[0] <= out <= param.range[1]:
        raise ParamError(f"{out} is out of range ({param.range[0]}..{param.range[1]})")
    if param.check is not None:
        try:
            return param.check(out)
        except ValueError as exc:
            raise ParamError(str(exc)) from None
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
    raise ParamError; a required parameter the selector may fill
    (``from_selector``) is the actuator's to resolve. The reserved
    ``EVIDENCE_PARAM`` passes through untouched."""
    reserved = {EVIDENCE_PARAM} if spec.accepts_evidence else set()
    unknown = sorted(set(params) - {p.name for p in spec.params} - reserved)
    if unknown:
        raise ParamError(f"actuator '{spec.name}' has no parameter {', '.join(map(repr, unknown))}; "
                         f"it takes {', '.join(p.name for p in spec.params)}")
    missing = [] if partial else [p.name for p in spec.params
                                  if p.required and not p.from_selector and params.get(p.name) is None]
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
