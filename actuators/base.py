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

# The parameter vocabulary lives in the bottom layer; actuators import it from here.
from reflexarc.core.params import EVIDENCE_PARAM, ActuatorSpec, ParamError, ParamSpec, check_params
from reflexarc.core.targets import Refusal, Refused, target_key

__all__ = ["EVIDENCE_PARAM", "Actuator", "ActuatorError", "ActuatorSpec", "Change", "ParamError", "ParamSpec",
           "PermanentActuatorError", "Registry", "Target", "TargetRefused", "TemporaryActuatorError"]


class ActuatorError(Exception):
    """Base of actuator failures."""


class TemporaryActuatorError(ActuatorError):
    """Worth retrying (busy device, netlink EAGAIN, a server not up yet)."""


class PermanentActuatorError(ActuatorError):
    """Retrying cannot help (bad parameters, missing interface, permission)."""


class TargetRefused(PermanentActuatorError):
    """The planner refuses a target no actuator may act on (init, a kernel thread,
    the controller, a process outside the selector, no process scope at all):
    ``reason`` says which, ``pid`` which process, in any mode."""

    def __init__(self, refused: Refused) -> None:
        super().__init__(refused.message)
        self.reason: Refusal = refused.reason
        self.pid = refused.pid


@dataclass(frozen=True)
class Target:
    """What a remediation may touch: the labels of the firing group plus the
    policy's selector (job, processes, pids, cgroup, interfaces, ports)."""

    labels: dict = field(default_factory=dict)
    selector: dict = field(default_factory=dict)

    def key(self) -> str:
        return target_key(self.labels)

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


class Actuator:
    """Base class. Subclasses set ``spec`` and implement the four methods."""

    spec: ActuatorSpec

    @property
    def name(self) -> str:
        return self.spec.name

    def checked(self, params: dict, partial: bool = False) -> dict:
        """``params`` in their canonical forms (``reflexarc.core.params``); a bad,
        unknown or (unless ``partial``) missing parameter is a PermanentActuatorError."""
        try:
            return check_params(self.spec, dict(params), partial)
        except ParamError as exc:
            raise PermanentActuatorError(str(exc)) from None

    def read_current(self, target: Target, params: dict | None = None) -> Any:
        """What the system holds now of what ``plan(target, params)`` would change
        (the same signature for every actuator; most need only the target)."""
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

    def prepare(self) -> None:
        """Do ahead of the first incident what would otherwise delay the first
        action (compile a program): called at controller start for the actuators
        that enforcing policies use. Changes nothing on the system."""

    def drift(self, change: Change) -> str | None:
        """What the system shows now that differs from ``change.after`` (read
        back, as TuneD verifies), in a few words; None when it matches, or when
        this actuator cannot tell (a notification has nothing to read back).
        Asked right after ``apply`` (a mismatch undoes the change and fails the
        step) and, for journaled changes, by ``reflexarc journal --check`` and
        every minute by ``run``: someone changed it behind the controller's back."""
        return None

    def exists(self, change: Change) -> bool:
        """Whether what ``change`` was made for still exists (a process that exited,
        an interface that went away: no). A change whose target is gone is closed
        as ``target-gone`` instead of being reverted."""
        return True

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

    def built(self, name: str) -> Actuator | None:
        """The instance of ``name`` if one was built, without building it."""
        return self._instances.get(name)

    def discard(self, name: str) -> None:
        """Close the instance of ``name``, if one was built, so the next ``get``
        builds it from its factory again (after the configuration it reads
        changed: the deep tier exists once the probes started)."""
        act = self._instances.pop(name, None)
        if act is not None:
            act.close()

    def close(self) -> None:
        for act in self._instances.values():
            act.close()
        self._instances.clear()
