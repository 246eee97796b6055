"""The actuator interface every remediation implements, and its error types.

An actuator is a read/write pair in the manner of tuned and of Ansible's check
mode: ``read_current`` reads, ``plan`` computes the desired state and returns a
``Change(before, after, summary)`` without touching anything, ``apply`` writes it,
``revert`` restores ``before`` exactly. Dry-run and enforce share one path: the
caller plans, journals, and only applies when enforcing.

Changes are plain JSON so a later process can revert what a crashed one applied.

Example::

    act = registry.create("log")
    change = act.plan(Target({"job": "llama"}), {"message": "hello"})
    act.apply(change)      # only when enforcing
    act.revert(change)

Overhead: defined by each implementation; the interface adds nothing.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable


class ActuatorError(Exception):
    """Base of actuator failures."""


EVIDENCE_PARAM = "evidence"
"""Reserved parameter the controller fills (never a policy) for actuators whose
spec ``accepts_evidence``: the evidence items of the conditions that fired."""


class TemporaryActuatorError(ActuatorError):
    """Worth retrying (busy device, netlink EAGAIN, a server not up yet)."""


class PermanentActuatorError(ActuatorError):
    """Retrying cannot help (bad parameters, missing interface, permission)."""


@dataclass(frozen=True)
class Target:
    """What a remediation may touch: the labels of the firing group plus the
    policy's selector (job, processes, pids, cgroup, interfaces, ports)."""

    labels: dict = field(default_factory=dict)
    selector: dict = field(default_factory=dict)

    def key(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(self.labels.items())) or "*"

    def to_dict(self) -> dict:
        return {"labels": dict(self.labels), "selector": dict(self.selector)}

    @classmethod
    def from_dict(cls, data: dict) -> "Target":
        return cls(dict(data.get("labels", {})), dict(data.get("selector", {})))


@dataclass
class Change:
    """A planned change: what is there now, what will be, in words."""

    actuator: str
    target: Target
    params: dict
    before: Any
    after: Any
    summary: str

    @property
    def noop(self) -> bool:
        return self.before == self.after

    def to_dict(self) -> dict:
        d = asdict(self)
        d["target"] = self.target.to_dict()
        return d

    @classmethod
    def from_dict(cls, data: dict) -> "Change":
        return cls(data["actuator"], Target.from_dict(data["target"]), dict(data.get("params", {})),
                   data.get("before"), data.get("after"), data.get("summary", ""))


@dataclass(frozen=True)
class ParamSpec:
    """One actuator parameter. ``type`` is one of: str, int, float, bool,
    duration, int_list, str_list, port_range, mapping."""

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


class Actuator:
    """Base class. Subclasses set ``spec`` and implement the four methods."""

    spec: ActuatorSpec

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def supports_dry_run(self) -> bool:
        return self.spec.supports_dry_run

    def read_current(self, target: Target) -> Any:
        raise NotImplementedError

    def plan(self, target: Target, params: dict) -> Change:
        raise NotImplementedError

    def apply(self, change: Change) -> None:
        raise NotImplementedError

    def revert(self, change: Change) -> None:
        raise NotImplementedError

    def refresh(self, change: Change) -> Change | None:
        """Called every tick while a change is active, to extend it to targets that
        appeared since (e.g. newly spawned workers). Returns the grown change, which
        the caller journals, or None when nothing is new."""
        return None

    def close(self) -> None:
        """Release resources (BPF programs, sockets). Does not revert changes."""


class Registry:
    """Actuator names to factories. Tests and simulations build their own."""

    def __init__(self) -> None:
        self._factories: dict[str, Callable[[], Actuator]] = {}
        self._specs: dict[str, ActuatorSpec] = {}
        self._instances: dict[str, Actuator] = {}

    def register(self, spec: ActuatorSpec, factory: Callable[[], Actuator]) -> None:
        self._specs[spec.name] = spec
        self._factories[spec.name] = factory
        self._instances.pop(spec.name, None)

    def names(self) -> list[str]:
        return sorted(self._specs)

    def spec(self, name: str) -> ActuatorSpec:
        return self._specs[name]

    def __contains__(self, name: str) -> bool:
        return name in self._specs

    def get(self, name: str) -> Actuator:
        """One shared instance per name, created on first use."""
        if name not in self._instances:
            try:
                factory = self._factories[name]
            except KeyError:
                raise PermanentActuatorError(f"unknown actuator '{name}'") from None
            self._instances[name] = factory()
        return self._instances[name]

    def close(self) -> None:
        for act in self._instances.values():
            act.close()
        self._instances.clear()
