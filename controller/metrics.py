"""Prometheus metrics of the controller, on an injected registry.

The rule lifecycle state is an Enum per (policy, rule, target), removed when
the controller retires the target; would-have-acted
counts (dry-run and alert-only) are metrics too, so a fleet can see what
enforcement would do before switching it on.

Example::

    m = ControllerMetrics(CollectorRegistry())
    m.state("p", "r", "pid=1", "firing")
    m.action("p", "r", "affinity", "dry-run", "planned")

Overhead: a dictionary look-up and a lock per update.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge

from reflexarc.core.outcomes import WOULD_HAVE_ACTED

from .lifecycle import STATES


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.rule_state = Enum("reflexarc_rule_state", "Lifecycle state of a rule for a target",
                               ["policy", "rule", "target"], states=list(STATES), registry=r)
        self.transitions = Counter("reflexarc_transitions_total", "Rule state transitions",
                                   ["policy", "rule", "from_state", "to_state"], registry=r)
        self.actions = Counter("reflexarc_actions_total", "Actuator steps by outcome",
                               ["policy", "rule", "actuator", "mode", "outcome"], registry=r)
        self.would_have_acted = Counter("reflexarc_would_have_acted_total",
                                        "Actions dry-run or alert-only mode held back",
                                        ["policy", "rule", "actuator"], registry=r)
        self.limited = Counter("reflexarc_actions_limited_total", "Actions held back by a limit",
                               ["policy", "rule", "reason"], registry=r)
        self.active = Gauge("reflexarc_active_remediations", "Changes applied and not yet reverted",
                            registry=r)
        self.kill_switch = Gauge("reflexarc_kill_switch_engaged", "1 while the kill-switch file exists",
                                 registry=r)
        self.signals = Counter("reflexarc_signal_samples_total", "Samples published on the bus",
                               ["source"], registry=r)
        self.rule_errors = Counter("reflexarc_rule_errors_total",
                                   "Unexpected errors in a rule's run, contained (the run went to failed)",
                                   ["policy", "rule"], registry=r)
        self.bus_series = Gauge("reflexarc_bus_series", "Signal series held on the bus; silent ones are dropped",
                                registry=r)
        self.targets = Gauge("reflexarc_rule_targets", "Rule-targets tracked (runs); retired ones drop out",
                             registry=r)

    def state(self, policy: str, rule: str, target: str, state: str) -> None:
        self.rule_state.labels(policy, rule, target).state(state)

    def forget(self, policy: str, rule: str, target: str) -> None:
        """Remove the series of a retired rule-target."""
        try:
            self.rule_state.remove(policy, rule, target)
        except KeyError:
            pass

    def transition(self, policy: str, rule: str, frm: str, to: str) -> None:
        self.transitions.labels(policy, rule, frm, to).inc()

    def action(self, policy: str, rule: str, actuator: str, mode: str, outcome: str) -> None:
        self.actions.labels(policy, rule, actuator, mode, outcome).inc()
        if outcome in WOULD_HAVE_ACTED:
            self.would_have_acted.labels(policy, rule, actuator).inc()
