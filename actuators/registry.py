"""Builds the registry of real actuators for a node from one configuration.

Each actuator is built as its spec says (``ActuatorSpec.implementation``, a
``module:Class`` in this package, given the ``ActuatorConfig`` fields its
``takes`` names), and its module is imported only when first used, so a node
without bcc can still run the actuators that do not need it.

Example::

    registry = build_registry(ActuatorConfig(state_dir="/var/lib/reflexarc"))
    registry.get("affinity").plan(target, {"node": 0})
    build(SPECS["sysctl"], ActuatorConfig(proc_root="/tmp/proc"))   # SysctlActuator(proc_root="/tmp/proc")

Overhead: none until an actuator is used; then one import.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from .base import Actuator, ActuatorSpec, Registry
from .specs import SPECS


@dataclass
class ActuatorConfig:
    proc_root: str = "/proc"
    sys_root: str = "/sys"
    state_dir: str = "/var/lib/reflexarc"
    hook_dir: str = "/run/reflexarc/hooks"
    alertmanager_url: str | None = None
    webhook_url: str | None = None
    audit_path: str | None = None  # the controller's audit log, which an alert points to
    deep_tier: Any = None          # the probe manager that switches the deep tier


def build(spec: ActuatorSpec, config: ActuatorConfig) -> Actuator:
    """The implementation of ``spec``, given the fields of ``config`` it takes."""
    module, _, name = spec.implementation.partition(":")
    cls = getattr(importlib.import_module(f"{__package__}.{module}"), name)
    return cls(**{field: getattr(config, field) for field in spec.takes})


def build_registry(config: ActuatorConfig) -> Registry:
    registry = Registry()
    for spec in SPECS.values():
        registry.register(spec, lambda spec=spec: build(spec, config))
    return registry
