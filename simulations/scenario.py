"""Scenario files: a node's signals, the faults injected into them, the remedies
that fix each fault, and the outcome the built-in policies must reach.

A scenario is declarative YAML (see ``simulations/scenarios/*.yaml``)::

    name: numa-remote-worker
    description: A DataLoader worker runs on the remote NUMA node ...
    duration: 10m
    tick: 1s
    seed: 7
    node: gpu-node-07
    policies: [dataloader-numa.yaml]        # built in (policies/); "./x.yaml": next to this file
    plant: {numa_nodes: {0: "0-15", 1: "16-31"}, interfaces: [eth0]}
    signals:                                # label values given as lists expand to one series each
      - {name: dataloader_read_latency_us, labels: {job: llama, pid: ["4101", "4102"], quantile: "0.99"},
         baseline: 180, noise: 0.12}
      - {name: numa_cross_migrations_total, kind: counter, labels: {job: llama, pid: ["4101", "4102"]},
         baseline: 0}                       # counters: baseline is the rate per second
    faults:
      - name: worker-on-remote-node
        onset: 3m
        shape: step                         # step | ramp (ramp: 30s) | flap (period: 40s, duty: 0.5)
        affects:
          - {signal: dataloader_read_latency_us, match: {pid: "4102"}, factor: 4}
          - {signal: numa_cross_migrations_total, match: {pid: "4102"}, add: 0.5}
        fixed_by: {actuator: affinity, params: {node: 0}, target: {pid: "4102"}}
    expect:
      enforce: {actions: [{actuator: affinity, outcome: applied}], fixed: true}
      dry-run: {actions: [{actuator: affinity, outcome: planned}], fixed: false}

The file is read by ``reflexarc.core.yaml_reader`` (a regular file of at most
``MAX_FILE_BYTES``, depth-limited, duplicate keys refused, keys as written); every
problem is reported as ``file:line:col: error: message`` (``ScenarioError``).

Example::

    for name, description in list_scenarios(): ...
    sc = load_scenario("numa-remote-worker")      # or a path to a .yaml file
    sc.duration, sc.tick, sc.faults[0].fixed_by[0].actuator

Overhead: one YAML parse and check per load: about 30 ms for a scenario of 80 lines
(PyYAML's pure-Python parser, which the reader's depth limit needs).
"""
from __future__ import annotations

import difflib
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

import reflexarc.policies
from reflexarc.actuators.specs import SPECS
from reflexarc.core.cpus import parse_cpulist
from reflexarc.core.diagnostics import LocatedError
from reflexarc.core.durations import parse_duration
from reflexarc.core.params import check_params
from reflexarc.core.signals import KINDS
from reflexarc.core.yaml_reader import LocList, LocMap, Pos, YamlReader

from .expect import MODES, OUTCOMES, Expectation, ExpectedAction

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"
BUILTIN_POLICIES = Path(reflexarc.policies.__file__).resolve().parent
SHAPES = ("step", "ramp", "flap")
MAX_FILE_BYTES = 1 << 20
DEEP_PROBES = SPECS["deep_tracing"].param("probe").choices
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_SIGNAL_RE = re.compile(r"^[a-z][a-z0-9_]*$")


class ScenarioError(LocatedError):
    """A scenario that cannot be used; ``str()`` is ``file:line:col: error: message``."""


@dataclass(frozen=True)
class Series:
    """One emitted time series: a signal name with a full label set and its healthy behaviour."""

    name: str
    labels: dict
    kind: str                 # "gauge": a level; "counter": a running total
    baseline: float           # gauge: the healthy median; counter: increments per second
    noise: float              # gauge: sd of a log-normal factor (0.1 ~ +-10 %)
    every: float              # seconds between samples
    clip: tuple[float, float] | None
    deep_probe: str | None    # only emitted while this deep probe is switched on

    def matches(self, match: dict) -> bool:
        return all(self.labels.get(k) == v for k, v in match.items())


@dataclass(frozen=True)
class Effect:
    """What a fault does to the series of ``signal`` whose labels include ``match``:
    multiply by ``factor``, then add ``add`` (counters: to the rate per second).
    ``persists``: the effect stays while the fault's remedy is applied (the remedy
    works around the cause rather than removing it)."""

    signal: str
    match: dict
    factor: float = 1.0
    add: float = 0.0
    persists: bool = False

    def applies_to(self, series: Series) -> bool:
        return series.name == self.signal and series.matches(self.match)


@dataclass(frozen=True)
class Fix:
    """A change that neutralises a fault while applied: same actuator, parameters that
    cover ``params`` (see ``params.covers``), and a target whose labels do not contradict
    ``target``."""

    actuator: str
    params: dict
    target: dict


@dataclass(frozen=True)
class Fault:
    name: str
    description: str
    onset: float
    end: float | None
    shape: str
    ramp: float
    period: float
    duty: float
    affects: tuple[Effect, ...]
    fixed_by: tuple[Fix, ...]

    def in_window(self, now: float) -> bool:
        return now >= self.onset and (self.end is None or now < self.end)

    def intensity(self, now: float) -> float:
        """0 (no effect) to 1 (full effect) at ``now``."""
        if not self.in_window(now):
            return 0.0
        since = now - self.onset
        if self.shape == "ramp":
            return min(1.0, since / self.ramp)
        if self.shape == "flap":
            return 1.0 if since % self.period < self.duty * self.period else 0.0
        return 1.0

    def active(self, now: float) -> bool:
        """In its window and, for a flap, in the on phase."""
        return self.in_window(now) and (self.shape != "flap" or self.intensity(now) > 0)


@dataclass(frozen=True)
class PlantConfig:
    """The node's initial state, which the simulated actuators read and change."""

    numa_nodes: dict = field(default_factory=lambda: {0: list(range(0, 16)), 1: list(range(16, 32))})
    devices: dict = field(default_factory=dict)           # PCI address -> NUMA node
    interfaces: tuple = ("eth0",)
    hooks: dict = field(default_factory=dict)             # handler -> its current settings
    sysctls: dict = field(default_factory=lambda: {"kernel.numa_balancing": "1", "vm.zone_reclaim_mode": "0",
                                                   "kernel.sched_autogroup_enabled": "1", "vm.swappiness": "60"})


@dataclass
class Scenario:
    name: str
    description: str
    duration: float
    tick: float
    seed: int
    node: str
    policies: list[str]       # absolute paths of the policy files the scenario exercises
    series: list[Series]
    faults: list[Fault]
    expect: dict[str, Expectation]
    plant: PlantConfig
    path: Path | None = None

    def fault(self, name: str) -> Fault:
        for f in self.faults:
            if f.name == name:
                return f
        raise KeyError(f"scenario '{self.name}' has no fault '{name}'")


# --- loading ---------------------------------------------------------------------

def list_scenarios() -> list[tuple[str, str]]:
    """(name, description) of every built-in scenario, by name."""
    return [(sc.name, sc.description) for sc in (load_scenario(p) for p in sorted(SCENARIO_DIR.glob("*.yaml")))]


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A built-in scenario by name, or a scenario file by path."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = SCENARIO_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            known = sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))
            hint = difflib.get_close_matches(str(name_or_path), known, n=1)
            raise ScenarioError(str(name_or_path), 1, 1, f"no scenario named '{name_or_path}'"
                                + (f"; did you mean '{hint[0]}'?" if hint else "")
                                + f" (known: {', '.join(known)})")
    reader = YamlReader(str(path), raises=ScenarioError)
    root = reader.read(path, MAX_FILE_BYTES, empty="empty file: expected a scenario (a mapping with 'signals' and "
                                                   "'expect')")
    return _Reader(str(path)).scenario(reader.data(root, "a scenario file"), path)


_REQUIRED = object()


class _Reader:
    """Turns a parsed scenario document into a Scenario, failing at the first problem."""

    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, pos: Pos, message: str):
        raise ScenarioError(self.file, pos[0], pos[1], message)

    # --- generic shapes ---------------------------------------------------------
    def mapping(self, value, pos: Pos, what: str, keys: tuple[str, ...] | None = None) -> LocMap:
        if not isinstance(value, dict):
            self.fail(pos, f"{what} must be a mapping, got {_kind(value)}")
        if keys is not None:
            for key in value:
                if key not in keys:
                    hint = difflib.get_close_matches(str(key), keys, n=1)
                    self.fail(value.key_pos(key), f"unknown key '{key}' in {what}"
                              + (f"; did you mean '{hint[0]}'?" if hint else f" (allowed: {', '.join(keys)})"))
        return value

    def seq(self, value, pos: Pos, what: str, one_or_many: bool = False) -> LocList:
        if one_or_many and isinstance(value, dict):
            wrapped = LocList()
            wrapped.pos = pos
            wrapped.append(value)
            wrapped.item_positions.append(pos)
            return wrapped
        if not isinstance(value, list):
            self.fail(pos, f"{what} must be a list, got {_kind(value)}")
        return value

    def get(self, m: LocMap, key: str, convert, default=_REQUIRED, what: str = ""):
        if key not in m or m[key] is None:
            if default is _REQUIRED:
                self.fail(m.pos, f"missing required key '{key}'" + (f" in {what}" if what else ""))
            return default
        try:
            return convert(m[key])
        except (TypeError, ValueError) as exc:
            self.fail(m.value_pos(key), f"'{key}': {exc}")

    # --- sections ---------------------------------------------------------------
    def scenario(self, doc, path: Path) -> Scenario:
        doc = self.mapping(doc, (1, 1), "a scenario file", ("name", "description", "duration", "tick", "seed",
                                                            "node", "policies", "plant", "signals", "faults",
                                                            "expect"))
        name = self.get(doc, "name", _name, path.stem)
        duration = self.get(doc, "duration", _positive_duration, 600.0)
        tick = self.get(doc, "tick", _positive_duration, 1.0)
        if tick > duration:
            self.fail(doc.value_pos("tick"), f"tick {tick:g}s is longer than the duration {duration:g}s")
        node = self.get(doc, "node", _label_value, "sim-node")
        policies = self.policies(doc, path)
        plant = self.plant(doc.get("plant") or LocMap(), doc.value_pos("plant"))
        series = self.signals(doc, tick, node)
        faults = self.faults(doc, series, plant)
        expect = self.expect(doc)
        return Scenario(name=name, description=self.get(doc, "description", _text), duration=duration, tick=tick,
                        seed=self.get(doc, "seed", _int, 0), node=node, policies=policies, series=series,
                        faults=faults, expect=expect, plant=plant, path=path.resolve())

    def policies(self, doc: LocMap, path: Path) -> list[str]:
        """Absolute paths of the policy files: ``name.yaml`` is built in (``policies/``),
        ``./name.yaml`` lies next to the scenario file."""
        items = self.seq(doc.get("policies", LocList()), doc.value_pos("policies"), "'policies'")
        out = []
        for i, item in enumerate(items):
            if not isinstance(item, str) or not item.endswith((".yaml", ".yml")):
                self.fail(items.item_pos(i), f"a policy is named by its file name (e.g. dataloader-numa.yaml), "
                                             f"got {item!r}")
            local = item.startswith("./")
            if not local and "/" in item:
                self.fail(items.item_pos(i), f"name a built-in policy by its file name, or one next to the "
                                             f"scenario as './{Path(item).name}', got '{item}'")
            resolved = (path.parent / item) if local else (BUILTIN_POLICIES / item)
            if not resolved.is_file():
                where = "next to the scenario" if local else f"among the built-in policies ({BUILTIN_POLICIES})"
                self.fail(items.item_pos(i), f"policy file '{item}' is not {where}")
            out.append(str(resolved.resolve()))
        return out

    def plant(self, m, pos: Pos) -> PlantConfig:
        m = self.mapping(m, pos, "'plant'", ("numa_nodes", "devices", "interfaces", "hooks", "sysctls"))
        default = PlantConfig()
        nodes = default.numa_nodes
        if "numa_nodes" in m:
            raw = self.mapping(m["numa_nodes"], m.value_pos("numa_nodes"), "'numa_nodes'")
            nodes = {}
            for key, cpus in raw.items():
                try:
                    nodes[int(key)] = parse_cpulist(cpus)
                except (TypeError, ValueError) as exc:
                    self.fail(raw.value_pos(key), f"NUMA node {key!r}: {exc}")
        devices = {}
        if "devices" in m:
            raw = self.mapping(m["devices"], m.value_pos("devices"), "'devices'")
            for key, node in raw.items():
                if node not in nodes:
                    self.fail(raw.value_pos(key), f"device {key} is on NUMA node {node!r}, which 'numa_nodes' "
                                                  f"does not define")
                devices[str(key)] = node
        interfaces = default.interfaces
        if "interfaces" in m:
            interfaces = tuple(str(i) for i in self.seq(m["interfaces"], m.value_pos("interfaces"), "'interfaces'"))
        hooks = {}
        if "hooks" in m:
            raw = self.mapping(m["hooks"], m.value_pos("hooks"), "'hooks'")
            for handler, settings in raw.items():
                hooks[str(handler)] = dict(self.mapping(settings or LocMap(), raw.value_pos(handler),
                                                        f"settings of hook '{handler}'"))
        sysctls = dict(default.sysctls)
        if "sysctls" in m:
            raw = self.mapping(m["sysctls"], m.value_pos("sysctls"), "'sysctls'")
            allowed = SPECS["sysctl"].param("key").choices
            for key, value in raw.items():
                if key not in allowed:
                    self.fail(raw.key_pos(key), f"sysctl '{key}' is not on the actuator's allow-list "
                                                f"({', '.join(allowed)})")
                sysctls[key] = str(value)
        return PlantConfig(numa_nodes=nodes, devices=devices, interfaces=interfaces, hooks=hooks, sysctls=sysctls)

    def signals(self, doc: LocMap, tick: float, node: str) -> list[Series]:
        items = self.seq(self.get(doc, "signals", lambda v: v), doc.value_pos("signals"), "'signals'")
        out: list[Series] = []
        seen: dict[tuple, Pos] = {}
        for i, raw in enumerate(items):
            m = self.mapping(raw, items.item_pos(i), "a signal", ("name", "labels", "kind", "baseline", "noise",
                                                                 "every", "clip", "deep_probe"))
            name = self.get(m, "name", _signal_name, what="a signal")
            kind = self.get(m, "kind", _choice(KINDS), "gauge")
            baseline = self.get(m, "baseline", _non_negative, what=f"signal '{name}'")
            noise = self.get(m, "noise", _non_negative, 0.0)
            every = self.get(m, "every", _positive_duration, tick)
            clip = self.get(m, "clip", _clip, None)
            probe = self.get(m, "deep_probe", _choice(DEEP_PROBES), None)
            labels = self.mapping(m.get("labels") or LocMap(), m.value_pos("labels"), f"labels of '{name}'")
            if "node" in labels:
                self.fail(labels.key_pos("node"), "the 'node' label comes from the scenario's 'node'")
            keys = list(labels)
            choices = []
            for key in keys:
                values = labels[key] if isinstance(labels[key], list) else [labels[key]]
                if not values:
                    self.fail(labels.value_pos(key), f"label '{key}' has an empty list of values")
                try:
                    choices.append([_label_value(v) for v in values])
                except ValueError as exc:
                    self.fail(labels.value_pos(key), f"label '{key}': {exc}")
            for combo in itertools.product(*choices):
                series_labels = {"node": node, **dict(zip(keys, combo))}
                ident = (name, tuple(sorted(series_labels.items())))
                if ident in seen:
                    self.fail(m.pos, f"series {name}{series_labels} is already defined at line {seen[ident][0]}")
                seen[ident] = m.pos
                out.append(Series(name, series_labels, kind, baseline, noise, every, clip, probe))
        return out

    def faults(self, doc: LocMap, series: list[Series], plant: PlantConfig) -> list[Fault]:
        items = self.seq(doc.get("faults", LocList()), doc.value_pos("faults"), "'faults'")
        out: list[Fault] = []
        for i, raw in enumerate(items):
            m = self.mapping(raw, items.item_pos(i), "a fault", ("name", "description", "onset", "end", "shape",
                                                                "ramp", "period", "duty", "affects", "fixed_by"))
            name = self.get(m, "name", _name, what="a fault")
            if any(f.name == name for f in out):
                self.fail(m.value_pos("name"), f"fault '{name}' is defined twice")
            onset = self.get(m, "onset", parse_duration, what=f"fault '{name}'")
            end = self.get(m, "end", parse_duration, None)
            if end is not None and end <= onset:
                self.fail(m.value_pos("end"), f"fault '{name}' ends ({end:g}s) before its onset ({onset:g}s)")
            shape = self.get(m, "shape", _choice(SHAPES), "step")
            ramp = self.get(m, "ramp", _positive_duration, _REQUIRED if shape == "ramp" else 0.0, f"ramp fault '{name}'")
            period = self.get(m, "period", _positive_duration, _REQUIRED if shape == "flap" else 0.0,
                              f"flap fault '{name}'")
            duty = self.get(m, "duty", _fraction, 0.5)
            for key, needed in (("ramp", "ramp"), ("period", "flap"), ("duty", "flap")):
                if key in m and shape != needed:
                    self.fail(m.key_pos(key), f"'{key}' only applies to shape '{needed}', this fault is a '{shape}'")
            affects = self.effects(m, name, series)
            fixes = self.fixes(m, plant)
            out.append(Fault(name, self.get(m, "description", _text, ""), onset, end, shape, ramp, period, duty,
                             affects, fixes))
        return out

    def effects(self, fault: LocMap, name: str, series: list[Series]) -> tuple[Effect, ...]:
        items = self.seq(self.get(fault, "affects", lambda v: v, what=f"fault '{name}'"),
                         fault.value_pos("affects"), "'affects'", one_or_many=True)
        out = []
        for i, raw in enumerate(items):
            m = self.mapping(raw, items.item_pos(i), "an effect", ("signal", "match", "factor", "add", "persists"))
            signal = self.get(m, "signal", _signal_name, what="an effect")
            match = self.get(m, "match", _label_map, {})
            if "factor" not in m and "add" not in m:
                self.fail(m.pos, "an effect needs 'factor' and/or 'add'")
            effect = Effect(signal, match, self.get(m, "factor", _non_negative, 1.0), self.get(m, "add", _number, 0.0),
                            self.get(m, "persists", _bool, False))
            if not any(s.name == signal for s in series):
                self.fail(m.value_pos("signal"), f"the scenario emits no signal '{signal}'")
            if not any(effect.applies_to(s) for s in series):
                self.fail(m.value_pos("match") if "match" in m else m.pos,
                          f"no series of '{signal}' has labels {match}")
            out.append(effect)
        return tuple(out)

    def fixes(self, fault: LocMap, plant: PlantConfig) -> tuple[Fix, ...]:
        if fault.get("fixed_by") is None:
            return ()
        items = self.seq(fault["fixed_by"], fault.value_pos("fixed_by"), "'fixed_by'", one_or_many=True)
        out = []
        for i, raw in enumerate(items):
            m = self.mapping(raw, items.item_pos(i), "a remedy", ("actuator", "params", "target"))
            actuator = self.get(m, "actuator", str, what="a remedy")
            spec = SPECS.get(actuator)
            if spec is None or not spec.changes_system:
                system = [n for n, s in SPECS.items() if s.changes_system]
                self.fail(m.value_pos("actuator"), f"'{actuator}' cannot fix a fault; one of: {', '.join(system)}")
            params = self.mapping(m.get("params") or LocMap(), m.value_pos("params"), "'params'")
            try:
                check_params(spec, dict(params), partial=True)
            except ValueError as exc:
                self.fail(m.value_pos("params"), str(exc))
            if actuator == "framework_hook" and "handler" in params and params["handler"] not in plant.hooks:
                self.fail(params.value_pos("handler"), f"hook '{params['handler']}' is not registered in "
                                                       f"'plant.hooks'")
            out.append(Fix(actuator, dict(params), self.get(m, "target", _label_map, {})))
        return tuple(out)

    def expect(self, doc: LocMap) -> dict[str, Expectation]:
        m = self.mapping(self.get(doc, "expect", lambda v: v), doc.value_pos("expect"), "'expect'", MODES)
        out = {}
        for mode, raw in m.items():
            e = self.mapping(raw, m.value_pos(mode), f"expect.{mode}", ("actions", "fixed", "max_changes", "alerts"))
            actions = None
            if "actions" in e:
                items = self.seq(e["actions"] if e["actions"] is not None else LocList(), e.value_pos("actions"),
                                 "'actions'")
                actions = []
                for i, item in enumerate(items):
                    a = self.mapping(item, items.item_pos(i), "an expected action", ("actuator", "outcome", "rule"))
                    actions.append(ExpectedAction(self.get(a, "actuator", _choice(tuple(SPECS))),
                                                  self.get(a, "outcome", _choice(OUTCOMES)),
                                                  self.get(a, "rule", str, None)))
            alerts = None
            if "alerts" in e:
                items = self.seq(e["alerts"] if e["alerts"] is not None else LocList(), e.value_pos("alerts"),
                                 "'alerts'")
                alerts = []
                for i, item in enumerate(items):
                    try:
                        alerts.append(_label_map(item))
                    except (TypeError, ValueError) as exc:
                        self.fail(items.item_pos(i), f"an expected alert is a mapping of labels: {exc}")
            out[mode] = Expectation(actions=actions, fixed=self.get(e, "fixed", _bool, None),
                                    max_changes=self.get(e, "max_changes", _count, None), alerts=alerts)
        return out


# --- value converters: raise ValueError with a short reason ------------------------

def _kind(value) -> str:
    return "nothing" if value is None else type(value).__name__


def _text(value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("expected non-empty text")
    return " ".join(value.split())


def _name(value) -> str:
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise ValueError(f"expected a name of lower-case letters, digits and '-', got {value!r}")
    return value


def _signal_name(value) -> str:
    if not isinstance(value, str) or not _SIGNAL_RE.match(value):
        raise ValueError(f"expected a signal name such as dataloader_read_latency_us, got {value!r}")
    return value


def _label_value(value) -> str:
    if isinstance(value, (dict, list)) or value is None:
        raise ValueError(f"a label value is a string or number, got {_kind(value)}")
    return str(value)


def _label_map(value) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of labels, got {_kind(value)}")
    return {str(k): _label_value(v) for k, v in value.items()}


def _number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {value!r}")
    return float(value)


def _non_negative(value) -> float:
    number = _number(value)
    if number < 0:
        raise ValueError(f"expected a number >= 0, got {value!r}")
    return number


def _fraction(value) -> float:
    number = _number(value)
    if not 0 < number < 1:
        raise ValueError(f"expected a fraction between 0 and 1, got {value!r}")
    return number


def _int(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _count(value) -> int:
    number = _int(value)
    if number < 0:
        raise ValueError(f"expected an integer >= 0, got {value!r}")
    return number


def _bool(value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def _positive_duration(value) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"expected a duration > 0, got {value!r}")
    return seconds


def _clip(value) -> tuple[float, float]:
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError("expected [low, high]")
    lo, hi = _number(value[0]), _number(value[1])
    if lo >= hi:
        raise ValueError(f"low {lo:g} must be below high {hi:g}")
    return (lo, hi)


def _choice(choices: tuple):
    def convert(value):
        if value not in choices:
            hint = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
            raise ValueError(f"expected one of {', '.join(map(str, choices))}, got {value!r}"
                             + (f"; did you mean '{hint[0]}'?" if hint else ""))
        return value
    return convert
