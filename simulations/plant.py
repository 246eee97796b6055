"""The simulated plant: a node whose signals follow a scenario, and whose state the
simulated actuators change.

Each tick ``step(now, emit)`` emits every series that is due: the healthy
baseline, times the in-force faults' effects, times seeded log-normal noise
(gauges), or a Poisson count at the effective rate added to a running total
(counters). A fault stops acting while a change that matches one of its
``fixed_by`` remedies is applied, and acts again once that change is reverted.
Series gated on a deep probe are emitted only while that probe is on.

Every series draws from its own random stream seeded by (seed, series), so runs
are reproducible and switching deep tracing on or off does not disturb the other
series' noise.

Example::

    plant = Plant(load_scenario("numa-remote-worker"))
    registry = plant.registry()
    for i in range(601):
        plant.step(float(i), bus.publish)     # emit(name, labels, value, ts)
        controller.tick(float(i))
    plant.fixed, plant.alerts, plant.applied

Overhead: about 2 us per emitted sample; a 10-minute scenario with a few dozen
series at 1 s takes a few tens of milliseconds of plant time.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable

from reflexarc.actuators.base import Change, Registry
from reflexarc.actuators.specs import SPECS

from .params import covers
from .scenario import Effect, Fault, Fix, Scenario, Series
from .sim_actuators import build_sim_registry

Emit = Callable[[str, dict, float, float], None]
_EPS = 1e-9


def poisson(rng: random.Random, lam: float) -> int:
    """A Poisson draw: exact for small means, normal approximation above 30."""
    if lam <= 0:
        return 0
    if lam > 30:
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    limit, k, p = math.exp(-lam), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


@dataclass
class _Live:
    """A series while the plant runs: its random stream, the effects on it, its schedule."""

    series: Series
    rng: random.Random
    effects: list[tuple[Fault, Effect]]
    next_due: int = 0             # index of the next sample: due at next_due * every
    total: float = 0.0            # counters: the running total
    last_ts: float | None = None  # counters: when the total was last advanced


def _compatible(fix: Fix, target_labels: dict) -> bool:
    return all(target_labels.get(k, v) == v for k, v in fix.target.items())


class Plant:
    def __init__(self, scenario: Scenario, seed: int | None = None) -> None:
        self.scenario = scenario
        self.config = scenario.plant
        self.seed = scenario.seed if seed is None else int(seed)
        self.now = 0.0
        self.alerts: list[dict] = []
        self.unfixed: list[str] = []          # faults in effect at the last step
        self._state: dict[tuple, object] = {}
        self._applied: dict[tuple, Change] = {}
        self._neutral: dict[str, bool] | None = None
        self._registry: Registry | None = None
        self._live = [_Live(s, random.Random(f"{self.seed}/{s.name}/{sorted(s.labels.items())}"),
                            [(f, e) for f in scenario.faults for e in f.affects if e.applies_to(s)])
                      for s in scenario.series]

    # --- the loop ------------------------------------------------------------------
    def step(self, now: float, emit: Emit) -> None:
        """Emit every series due at ``now`` (its samples are stamped ``now``)."""
        self.now = now
        neutral = self._neutralised()
        faults = self.scenario.faults
        intensity = {f.name: f.intensity(now) for f in faults}
        self.unfixed = [f.name for f in faults if f.in_window(now) and not neutral[f.name]]
        probes: dict[str, bool] = {}
        for live in self._live:
            s = live.series
            if now + _EPS < live.next_due * s.every:
                continue
            live.next_due = math.floor((now + _EPS) / s.every) + 1
            if s.deep_probe is not None:
                if s.deep_probe not in probes:
                    probes[s.deep_probe] = self.deep_probe_on(s.deep_probe)
                if not probes[s.deep_probe]:
                    live.last_ts = now
                    continue
            level = s.baseline
            for fault, effect in live.effects:
                k = intensity[fault.name]
                if k == 0.0 or (neutral[fault.name] and not effect.persists):
                    continue
                level = level * (1.0 + (effect.factor - 1.0) * k) + effect.add * k
            if s.kind == "counter":
                dt = 0.0 if live.last_ts is None else now - live.last_ts
                live.last_ts = now
                live.total += poisson(live.rng, max(level, 0.0) * dt)
                value = live.total
            else:
                value = level * math.exp(live.rng.gauss(0.0, s.noise)) if s.noise else level
                if s.clip is not None:
                    value = min(max(value, s.clip[0]), s.clip[1])
            emit(s.name, dict(s.labels), value, now)

    # --- faults ------------------------------------------------------------------------
    def _neutralised(self) -> dict[str, bool]:
        """Per fault, whether an applied change matches one of its remedies (cached
        until the applied changes change)."""
        if self._neutral is None:
            self._neutral = {f.name: any(self._fixes(fix, change) for fix in f.fixed_by
                                         for change in self._applied.values())
                             for f in self.scenario.faults}
        return self._neutral

    @staticmethod
    def _fixes(fix: Fix, change: Change) -> bool:
        return (change.actuator == fix.actuator and covers(SPECS[fix.actuator], fix.params, change.params)
                and _compatible(fix, change.target.labels))

    def fault_active(self, name: str, now: float) -> bool:
        """The fault is in force at ``now`` (in its window, and in the on phase of a flap)."""
        return self.scenario.fault(name).active(now)

    def fault_effective(self, name: str, now: float) -> bool:
        """The fault is in force at ``now`` and no applied change neutralises it."""
        return self.fault_active(name, now) and not self._neutralised()[name]

    @property
    def fixed(self) -> bool:
        """At the last step, every fault in its window was neutralised."""
        return not self.unfixed

    # --- state the simulated actuators read and change ---------------------------------
    def registry(self) -> Registry:
        """Simulated actuators for every name in ``actuators.specs.SPECS`` (one registry per plant)."""
        if self._registry is None:
            self._registry = build_sim_registry(self)
        return self._registry

    @property
    def applied(self) -> list[Change]:
        """The simulated changes in force, oldest first."""
        return list(self._applied.values())

    def read_knob(self, key: tuple, initial):
        return self._state.get(key, initial)

    def write_knob(self, key: tuple, value, initial, change: Change | None) -> None:
        """Set a piece of state; ``change`` is recorded as in force, or None to clear
        what was in force on it."""
        if value == initial:
            self._state.pop(key, None)
        else:
            self._state[key] = value
        if change is None:
            self._applied.pop(key, None)
        else:
            self._applied[key] = change
        self._neutral = None

    def deep_probe_on(self, probe: str) -> bool:
        """Whether the deep probe is switched on now (its TTL not yet run out)."""
        state = self._state.get(("deep_tracing", probe))
        return bool(state and state["on"] and self.now < state["until"])
