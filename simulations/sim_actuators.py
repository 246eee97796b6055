"""Simulated actuators: the same names, parameter specs and read/plan/apply/revert
contract as the real ones, acting on the plant's state instead of the machine.

Each spec says how its actuator is simulated (``ActuatorSpec.simulated``):
``plant``, a stand-in below that the plant models (``SIM_ACTUATORS``); ``knob``,
the generic ``SimKnob``, which records the change (its parameters, the
selector's filled in) as a knob on the plant, so a scenario's fault can name it
as its remedy; ``real``, the real implementation (log).

Like the real actuators they refuse bad parameters and missing targets with
``PermanentActuatorError``, ``plan`` returns ``before``/``after`` without touching
anything, ``apply`` is idempotent, and ``revert`` restores ``before`` exactly.
A change in force is listed in ``plant.applied``; the plant neutralises the
faults whose remedy it matches.

Example::

    registry = build_sim_registry(plant)
    act = registry.get("affinity")
    change = act.plan(Target({"trainer": "4100"}, {"processes": ["pt_data_worker"]}), {"node": 0})
    act.apply(change)          # plant.applied == [change]
    act.revert(change)         # act.read_current(change.target) == change.before
    registry.get("irq_affinity").plan(Target(selector={"interfaces": ["eth0"]}), {"node": 0}).after
    # {"interfaces": ["eth0"], "node": 0}: a knob

Overhead: dictionary updates on the plant; no system calls.
"""
from __future__ import annotations

from reflexarc.actuators.base import (Actuator, ActuatorSpec, Change, ParamError, PermanentActuatorError, Registry,
                                      Target)
from reflexarc.actuators.registry import ActuatorConfig, build
from reflexarc.actuators.specs import SPECS
from reflexarc.core.cpus import format_cpulist
from reflexarc.core.ports import format_port_ranges


class SimActuator(Actuator):
    """Base of the simulated actuators: parameter checks and knob access on the plant."""

    def __init__(self, plant) -> None:
        self.plant = plant

    def _key(self, target: Target, params: dict) -> tuple:
        raise NotImplementedError

    def _initial(self, params: dict):
        raise NotImplementedError

    def read_current(self, target: Target, params: dict | None = None):
        """The state ``params`` would change (only the parameters that name it are needed)."""
        checked = self.checked(params or {}, partial=True)
        return self.plant.read_knob(self._key(target, checked), self._initial(checked))

    def _write(self, change: Change, value, in_force: bool) -> None:
        params = self.checked(change.params)
        self.plant.write_knob(self._key(change.target, params), value, self._initial(params),
                              change if in_force else None)

    def apply(self, change: Change) -> None:
        self._write(change, change.after, in_force=True)

    def revert(self, change: Change) -> None:
        self._write(change, change.before, in_force=False)


class SimAffinity(SimActuator):
    spec = SPECS["affinity"]

    def _key(self, target: Target, params: dict) -> tuple:
        return ("affinity", target.key())

    def _initial(self, params: dict) -> dict:
        return {"cpus": sorted(c for cpus in self.plant.config.numa_nodes.values() for c in cpus)}

    def _cpus(self, params: dict) -> list[int]:
        topology = self.plant.config.numa_nodes
        try:
            chosen = self.spec.chosen(params)
        except ParamError as exc:
            raise PermanentActuatorError(str(exc)) from None
        if "cpus" in chosen:
            known = {c for cpus in topology.values() for c in cpus}
            missing = [c for c in params["cpus"] if c not in known]
            if missing:
                raise PermanentActuatorError(f"CPUs {format_cpulist(missing)} do not exist on this node")
            cpus = list(params["cpus"])
        else:
            node = params.get("node")
            if "locality" in chosen:      # the plant's job keeps its memory on the first node
                node = min(topology)
            if "device" in chosen:
                node = self.plant.config.devices.get(params["device"])
                if node is None:
                    raise PermanentActuatorError(f"no PCI device {params['device']} on this node")
            if node not in topology:
                raise PermanentActuatorError(f"NUMA node {node} does not exist (nodes: "
                                             f"{', '.join(map(str, sorted(topology)))})")
            cpus = list(topology[node])
        cpus = [c for c in cpus if c not in set(params.get("reserved_cpus") or ())]
        if not cpus:
            raise PermanentActuatorError("no CPU left after removing the reserved ones")
        return sorted(cpus)

    def plan(self, target: Target, params: dict) -> Change:
        checked = self.checked(params)
        sel = target.selector
        if not {"pid", "trainer"} & set(target.labels) and not (sel.get("processes") or sel.get("pids")):
            raise PermanentActuatorError("affinity needs a pid target, a trainer target or a selector "
                                         "with processes or pids")
        before = self.read_current(target, params)
        after = {"cpus": self._cpus(checked)}
        return Change("affinity", target, dict(params), before, after,
                      f"affinity [{target.key()}]: cpus {format_cpulist(before['cpus'])} -> "
                      f"{format_cpulist(after['cpus'])}")


class SimDscp(SimActuator):
    spec = SPECS["dscp"]

    def _key(self, target: Target, params: dict) -> tuple:
        return ("dscp", tuple(sorted(params.get("interfaces") or ())), tuple(params.get("ports") or ()),
                params.get("protocol", "tcp"), bool(params.get("match_cgroup")))

    def _initial(self, params: dict) -> None:
        return None

    def plan(self, target: Target, params: dict) -> Change:
        resolved = _resolved(self.spec, target, params)
        checked = self.checked(resolved)
        if not checked.get("interfaces"):
            raise PermanentActuatorError("dscp needs 'interfaces' or a selector with interfaces")
        if not checked.get("ports"):
            raise PermanentActuatorError("dscp needs 'ports' or a selector with ports; it never retags every flow")
        missing = [i for i in checked["interfaces"] if i not in self.plant.config.interfaces]
        if missing:
            raise PermanentActuatorError(f"interface {', '.join(missing)} does not exist on this node")
        if checked.get("match_cgroup") and not target.selector.get("cgroup"):
            raise PermanentActuatorError("match_cgroup needs a selector with a cgroup")
        before = self.read_current(target, resolved)
        after = {"dscp": checked["dscp"], "class": checked.get("class")}
        ports = format_port_ranges(checked["ports"])
        was = "untagged" if before is None else f"DSCP {before['dscp']}"
        return Change("dscp", target, resolved, before, after,
                      f"dscp on {','.join(checked['interfaces'])} {checked.get('protocol', 'tcp')} ports {ports}: "
                      f"{was} -> DSCP {after['dscp']}")


class SimDeepTracing(SimActuator):
    """The deep probe tier: while on, the plant emits the series gated on the probe;
    the tier itself switches off ``ttl`` seconds after ``apply`` at the latest."""

    spec = SPECS["deep_tracing"]

    def _key(self, target: Target, params: dict) -> tuple:
        return ("deep_tracing", params.get("probe", self.spec.param("probe").default))

    def _initial(self, params: dict) -> dict:
        return {"probe": params.get("probe", self.spec.param("probe").default), "on": False, "until": None}

    def read_current(self, target: Target, params: dict | None = None) -> dict:
        checked = self.checked(params or {}, partial=True)
        state = self.plant.read_knob(self._key(target, checked), self._initial(checked))
        return state if self.plant.deep_probe_on(state["probe"]) else self._initial(checked)

    def plan(self, target: Target, params: dict) -> Change:
        checked = self.checked(params)
        if checked["ttl"] <= 0:
            raise PermanentActuatorError("deep tracing needs a ttl > 0")
        bad = [u for u in checked.get("uprobes") or () if ":" not in u]
        if bad:
            raise PermanentActuatorError(f"uprobes are 'library:symbol' pairs, got {', '.join(bad)}")
        before = self.read_current(target, params)
        after = {"probe": before["probe"], "on": True, "ttl": checked["ttl"]}
        if checked.get("uprobes"):
            after["uprobes"] = checked["uprobes"]
        state = "on" if before["on"] else "off"
        return Change("deep_tracing", target, dict(params), before, after,
                      f"deep tracing {before['probe']} [{target.key()}]: {state} -> on for {checked['ttl']:g}s")

    def apply(self, change: Change) -> None:
        on = {key: value for key, value in change.after.items() if key != "ttl"}
        self._write(change, {**on, "until": self.plant.now + float(change.after["ttl"])}, in_force=True)


class SimFrameworkHook(SimActuator):
    """A handler the training script registered (``plant.hooks``): its settings change."""

    spec = SPECS["framework_hook"]

    def _key(self, target: Target, params: dict) -> tuple:
        return ("framework_hook", params.get("handler"))

    def _initial(self, params: dict) -> dict:
        handler = params.get("handler")
        if handler not in self.plant.config.hooks:
            raise PermanentActuatorError(f"no handler '{handler}' is registered by the training script "
                                         f"(registered: {', '.join(sorted(self.plant.config.hooks)) or 'none'})")
        return dict(self.plant.config.hooks[handler])

    def read_current(self, target: Target, params: dict | None = None) -> dict:
        if not params or "handler" not in params:
            raise PermanentActuatorError("reading a framework hook needs its 'handler'")
        return super().read_current(target, params)

    def plan(self, target: Target, params: dict) -> Change:
        checked = self.checked(params)
        before = self.read_current(target, params)
        after = {**before, **(checked.get("args") or {})}
        diff = ", ".join(f"{k} {before.get(k)} -> {after[k]}" for k in sorted(after) if before.get(k) != after[k])
        return Change("framework_hook", target, dict(params), before, after,
                      f"hook {checked['handler']} [{target.key()}]: {diff or 'no change'}")


class SimSysctl(SimActuator):
    spec = SPECS["sysctl"]

    def _key(self, target: Target, params: dict) -> tuple:
        return ("sysctl", params.get("key"))

    def _initial(self, params: dict) -> str:
        return self.plant.config.sysctls.get(params.get("key"), "")

    def read_current(self, target: Target, params: dict | None = None) -> str:
        if not params or "key" not in params:
            raise PermanentActuatorError("reading a sysctl needs its 'key'")
        return super().read_current(target, params)

    def plan(self, target: Target, params: dict) -> Change:
        checked = self.checked(params)
        before = self.read_current(target, params)
        after = checked["value"].strip()
        return Change("sysctl", target, dict(params), before, after, f"sysctl {checked['key']}: {before} -> {after}")


class SimAlert(Actuator):
    """Records alerts in ``plant.alerts``; a raised alert cannot be taken back."""

    spec = SPECS["alert"]

    def __init__(self, plant) -> None:
        self.plant = plant

    def read_current(self, target: Target, params: dict | None = None) -> None:
        return None

    def plan(self, target: Target, params: dict) -> Change:
        checked = self.checked(params)
        labels = {**target.labels, **{str(k): str(v) for k, v in (checked.get("labels") or {}).items()}}
        after = {"severity": checked.get("severity", self.spec.param("severity").default),
                 "summary": checked.get("summary") or f"policy fired for {target.key()}", "labels": labels}
        return Change("alert", target, dict(params), None, after, f"alert {after['severity']}: {after['summary']}")

    def apply(self, change: Change) -> None:
        self.plant.alerts.append({"ts": self.plant.now, "target": change.target.key(), **change.after})

    def revert(self, change: Change) -> None:
        return None


class SimKnob(SimActuator):
    """The generic stand-in (``simulated="knob"``): a change is its parameters,
    with the selector's filled in, kept as a knob per actuator and target."""

    def __init__(self, plant, spec: ActuatorSpec) -> None:
        super().__init__(plant)
        self.spec = spec

    def _key(self, target: Target, params: dict) -> tuple:
        return (self.spec.name, target.key())

    def _initial(self, params: dict) -> None:
        return None

    def plan(self, target: Target, params: dict) -> Change:
        resolved = _resolved(self.spec, target, params)
        checked = self.checked(resolved)
        lacking = [p.name for p in self.spec.params if p.required and checked.get(p.name) is None]
        if lacking:
            raise PermanentActuatorError(f"{self.spec.name} needs {', '.join(lacking)} (params or the selector)")
        try:
            self.spec.chosen(checked)
        except ParamError as exc:
            raise PermanentActuatorError(str(exc)) from None
        before = self.read_current(target, resolved)
        return Change(self.spec.name, target, resolved, before, checked,
                      f"{self.spec.name} [{target.key()}]: {self.spec.explain(checked)}")


def _resolved(spec: ActuatorSpec, target: Target, params: dict) -> dict:
    """``params`` with the parameters the spec fills from the selector taken from the target's."""
    try:
        return spec.resolve(params, target.selector)
    except ParamError as exc:
        raise PermanentActuatorError(str(exc)) from None


SIM_ACTUATORS = {"affinity": SimAffinity, "dscp": SimDscp, "deep_tracing": SimDeepTracing,
                 "framework_hook": SimFrameworkHook, "sysctl": SimSysctl, "alert": SimAlert}
"""The stand-ins the plant models, for the specs with ``simulated="plant"``."""


def build_sim_registry(plant) -> Registry:
    """A registry with a simulated stand-in for every actuator in ``SPECS``, as its spec says."""
    registry = Registry()
    for name, spec in SPECS.items():
        if spec.simulated == "real":
            registry.register(spec, lambda spec=spec: build(spec, ActuatorConfig()))
        elif spec.simulated == "knob":
            registry.register(spec, lambda spec=spec: SimKnob(plant, spec))
        elif name in SIM_ACTUATORS:
            registry.register(spec, lambda cls=SIM_ACTUATORS[name]: cls(plant))
        else:
            raise PermanentActuatorError(f"actuator '{name}' is simulated by the plant but sim_actuators.py "
                                         "has no stand-in for it")
    return registry
