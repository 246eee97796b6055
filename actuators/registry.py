"""Builds the registry of real actuators for a node from one configuration.

Implementations are imported only when first used, so a node without bcc can
still run the actuators that do not need it.

Example::

    registry = build_registry(ActuatorConfig(state_dir="/var/lib/reflexarc"))
    registry.get("affinity").plan(target, {"node": 0})

Overhead: none until an actuator is used.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import Registry
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


def build_registry(config: ActuatorConfig) -> Registry:
    def log():
        from .log import LogActuator
        return LogActuator()

    def sysctl():
        from .sysctl import SysctlActuator
        return SysctlActuator(proc_root=config.proc_root)

    def affinity():
        from .affinity import AffinityActuator
        return AffinityActuator(proc_root=config.proc_root, sys_root=config.sys_root)

    def dscp():
        from .dscp import DscpActuator
        return DscpActuator()

    def alert():
        from .alert import AlertActuator
        return AlertActuator(alertmanager_url=config.alertmanager_url, webhook_url=config.webhook_url,
                             audit_path=config.audit_path)

    def framework_hook():
        from .framework_hook import FrameworkHookActuator
        return FrameworkHookActuator(hook_dir=config.hook_dir)

    def deep_tracing():
        from .deep_tracing import DeepTracingActuator
        return DeepTracingActuator(deep_tier=config.deep_tier)

    registry = Registry()
    for factory in (log, sysctl, affinity, dscp, alert, framework_hook, deep_tracing):
        registry.register(SPECS[factory.__name__], factory)
    return registry
