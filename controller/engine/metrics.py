"""Prometheus metrics of the controller, on an injected registry.

The rule lifecycle state is an Enum per (policy, rule, target), removed when
the controller retires the target; would-have-acted
counts (dry-run and alert-only) are metrics too, so a fleet can see what
enforcement would do before switching it on. Samples that never reached the
bus are counted by signal and reason (rejected values and timestamps, drops
at a bound; see ``intake.py``). Enforce actions the fleet budget refused are
counted by reason. The live loop's lag (how late a tick started
against its schedule) is the last one's and a histogram of all. What is read
at scrape time (signals, probes, journal) is added by ``exporter.py``.

Example::

    m = ControllerMetrics(CollectorRegistry())
    m.state("p", "r", "pid=1", "firing")
    m.action("p", "r", "affinity", "dry-run", "planned")
    m.loop_lag(0.003)

Overhead: a dictionary look-up and a lock per update.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram

from reflexarc.core.outcomes import WOULD_HAVE_ACTED

from ..fleet.budget import REASONS as BUDGET_REASONS
from ..fleet.rollout import REASONS as ROLLOUT_REASONS
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
        self.drifted = Gauge("reflexarc_journal_drifted", "Open journal entries whose change the system no "
                                                          "longer shows (changed behind the controller's back)",
                             registry=r)
        self.paused = Gauge("reflexarc_enforcement_paused", "1 while an operator's pause holds enforcement "
                                                            "(reflexarc pause)", registry=r)
        self.signals = Counter("reflexarc_signal_samples_total", "Samples published on the bus",
                               ["source"], registry=r)
        self.rejected = Counter("reflexarc_samples_rejected_total",
                                "Samples refused before the bus: a value or timestamp the signal cannot have",
                                ["signal", "reason"], registry=r)
        self.dropped = Counter("reflexarc_samples_dropped_total",
                               "Samples dropped at a bound: a poll's batch limit, a signal's series cap, "
                               "a series' point cap", ["signal", "reason"], registry=r)
        self.rule_errors = Counter("reflexarc_rule_errors_total",
                                   "Unexpected errors in a rule's run, contained (the run went to failed)",
                                   ["policy", "rule"], registry=r)
        self.bus_series = Gauge("reflexarc_bus_series", "Signal series held on the bus; silent ones are dropped",
                                registry=r)
        self.targets = Gauge("reflexarc_rule_targets", "Rule-targets tracked (runs); retired ones drop out",
                             registry=r)
        self.lag = Gauge("reflexarc_loop_lag_seconds", "How late the live loop's last tick started: after the "
                         "previous tick's start plus the interval", registry=r)
        self.lags = Histogram("reflexarc_loop_tick_lag_seconds", "How late each tick of the live loop started",
                              buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0), registry=r)
        self.policy_reloads = Counter("reflexarc_policy_reloads_total",
                                      "Policy reloads (SIGHUP, file change): ok, or error (refused, the "
                                      "running policies kept)", ["outcome"], registry=r)
        for outcome in ("ok", "error"):
            self.policy_reloads.labels(outcome)
        self.budget_refused = Counter("reflexarc_budget_refused_total",
                                      "Enforce actions the fleet budget or a policy's rollout refused, nothing "
                                      "applied: budget-full, store-unreachable (fail closed), store-error, "
                                      "rollout-stage, breaker-open, superseded, no-fleet-store", ["reason"],
                                      registry=r)
        for reason in BUDGET_REASONS + ROLLOUT_REASONS:
            self.budget_refused.labels(reason)
        self.rollout_stage = Gauge("reflexarc_rollout_stage", "The stage (1 = first) of a policy's fleet "
                                   "rollout, as this node last read it", ["policy"], registry=r)
        self.breaker_open = Gauge("reflexarc_rollout_breaker_open", "1 while a policy's fleet circuit breaker "
                                  "is open, as this node last read it", ["policy"], registry=r)
        self.policy_last_reload_ok = Gauge("reflexarc_policy_last_reload_ok",
                                           "1 while the policies on file are the ones running (start or last "
                                           "reload ok), 0 after a refused reload", registry=r)
        self.policy_last_reload_ok.set(1)

    def rollout(self, policy: str, stage: int, is_open: bool) -> None:
        self.rollout_stage.labels(policy).set(stage + 1)
        self.breaker_open.labels(policy).set(1 if is_open else 0)

    def state(self, policy: str, rule: str, target: str, state: str) -> None:
        self.rule_state.labels(policy, rule, target).state(state)

    def forget(self, policy: str, rule: str, target: str) -> None:
        """Remove the series of a retired rule-target."""
        try:
            self.rule_state.remove(policy, rule, target)
        except KeyError:
            pass

    def loop_lag(self, seconds: float) -> None:
        """A tick started ``seconds`` after its schedule (a clock stepped back: 0)."""
        seconds = max(0.0, seconds)
        self.lag.set(seconds)
        self.lags.observe(seconds)

    def transition(self, policy: str, rule: str, frm: str, to: str) -> None:
        self.transitions.labels(policy, rule, frm, to).inc()

    def action(self, policy: str, rule: str, actuator: str, mode: str, outcome: str) -> None:
        self.actions.labels(policy, rule, actuator, mode, outcome).inc()
        if outcome in WOULD_HAVE_ACTED:
            self.would_have_acted.labels(policy, rule, actuator).inc()
