"""The ``deep_tracing`` actuator: switches a deep probe (RDMA QP latency) on for
a target, for a bounded time, through the probe manager's deep tier.

A policy that sees a symptom it cannot explain with the light probes (slow
collectives, a P99 jump) asks for the deep tier for a while. ``plan`` records
what is running now and what will run (``after`` carries the probe, the TTL and
the deadline); ``apply`` asks the tier to start the probe; ``revert`` stops it,
and is idempotent (stopping what is already off is fine). Whatever happens to
the controller's rollback, the tier's ``expire_deep(now)``, called from the
controller loop, switches the probe off at the deadline, and a stopped process
takes its probes with it.

Admission: at most ``max_concurrent`` deep sessions at once (default 1), and no
new session while the running ones already handle ``max_events_per_s``
(measured by the probes; the default, 200 000/s, is ~5 % of a core at ~250 ns
per uprobe). Refusals are ``PermanentActuatorError``.

The tier is anything with ``enable_deep``/``disable_deep``/``active_deep``
(``DeepTier``); the controller passes its ``ProbeManager``.

Example::

    act = DeepTracingActuator(deep_tier=probe_manager)
    change = act.plan(Target({"job": "llama"}), {"ttl": 120, "uprobes": [
        "/usr/lib/libmlx5.so.1:mlx5_post_send", "/usr/lib/libmlx5.so.1:mlx5_poll_cq"]})
    act.apply(change)      # rdma_qp attached for 120 s at most
    act.revert(change)     # detached now

Overhead: plan reads the tier's session table; apply compiles and attaches the
probe (~1 s, once per session); revert detaches it (milliseconds).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from reflexarc.core.params import ParamError, convert

from .base import Actuator, Change, PermanentActuatorError, Target
from .specs import SPECS

RUNNING_STATES = ("ok", "degraded")


class DeepTier(Protocol):
    """What the actuator needs from the probe manager."""

    def enable_deep(self, key: str, probe_name: str, ttl: float, params: dict | None = None) -> Any:
        """Start (or extend) the session ``key``; returns the probe's status, an
        object with ``state`` ("ok", "degraded", "unsupported") and ``reason``."""

    def disable_deep(self, key: str) -> bool:
        """Stop the session ``key``; False when there was none."""

    def active_deep(self) -> Mapping[str, Mapping[str, Any]]:
        """Running sessions: key -> {"probe": name, "expires_at": deadline,
        "events_per_s": measured cost or None, ...}."""


class DeepTracingActuator(Actuator):
    spec = SPECS["deep_tracing"]

    def __init__(self, deep_tier: DeepTier | None, max_concurrent: int = 1,
                 max_events_per_s: float = 200_000.0, clock: Callable[[], float] = time.time) -> None:
        self.deep_tier = deep_tier
        self.max_concurrent = max_concurrent
        self.max_events_per_s = max_events_per_s
        self.clock = clock

    @staticmethod
    def session_key(target: Target) -> str:
        return f"deep_tracing/{target.key()}"

    def _tier(self) -> DeepTier:
        if self.deep_tier is None:
            raise PermanentActuatorError("no deep probe tier on this node (the probe manager is not running)")
        return self.deep_tier

    def read_current(self, target: Target, params: dict | None = None) -> dict:
        info = self._tier().active_deep().get(self.session_key(target))
        if info is None:
            return {"active": False}
        return {"active": True, "probe": info.get("probe"), "expires_at": info.get("expires_at")}

    # --- parameters and admission ------------------------------------------
    def _params(self, params: dict) -> tuple[str, float, dict]:
        probe = params.get("probe") or self.spec.param("probe").default
        if probe not in self.spec.param("probe").choices:
            raise PermanentActuatorError(f"unknown deep probe '{probe}'; "
                                         f"choose from {', '.join(self.spec.param('probe').choices)}")
        if params.get("ttl") is None:
            raise PermanentActuatorError("deep_tracing needs a 'ttl'")
        try:
            ttl = convert(self.spec.param("ttl"), params["ttl"])
        except ParamError as exc:
            raise PermanentActuatorError(f"ttl: {exc}") from None
        if not ttl > 0:
            raise PermanentActuatorError(f"ttl must be a positive duration, got {params['ttl']!r}")
        probe_params: dict = {}
        uprobes = params.get("uprobes")
        if uprobes:
            uprobes = [str(u) for u in uprobes]
            bad = [u for u in uprobes if not all(u.rpartition(":")[::2])]
            if bad or len(uprobes) != 2:
                raise PermanentActuatorError(
                    "uprobes takes two '<library>:<symbol>' entries, the post function then the "
                    f"poll function; got {uprobes}")
            probe_params["uprobes"] = uprobes
        return probe, ttl, probe_params

    def _admit(self, key: str) -> None:
        others = {k: v for k, v in self._tier().active_deep().items() if k != key}
        if len(others) >= self.max_concurrent:
            raise PermanentActuatorError(
                f"deep tier full: {len(others)} session(s) running ({', '.join(sorted(others))}), "
                f"at most {self.max_concurrent} at once")
        load = sum(float(v.get("events_per_s") or 0.0) for v in others.values())
        if load >= self.max_events_per_s:
            raise PermanentActuatorError(
                f"deep tier over its overhead budget: running sessions handle {load:.0f} events/s, "
                f"budget {self.max_events_per_s:.0f}")

    # --- the four operations -------------------------------------------------
    def plan(self, target: Target, params: dict) -> Change:
        probe, ttl, probe_params = self._params(params)
        key = self.session_key(target)
        before = self.read_current(target)
        self._admit(key)
        expires_at = self.clock() + ttl
        after = {"active": True, "probe": probe, "ttl": ttl, "expires_at": expires_at, **probe_params}
        return Change(self.name, target, {"probe": probe, "ttl": ttl, **probe_params}, before, after,
                      f"deep tracing {probe} on for {ttl:g}s for {target.key()}")

    def apply(self, change: Change) -> None:
        tier = self._tier()
        key = self.session_key(change.target)
        self._admit(key)
        probe, ttl, probe_params = self._params(change.params)
        try:
            status = tier.enable_deep(key, probe, ttl, probe_params)
        except (TypeError, ValueError) as exc:
            raise PermanentActuatorError(f"cannot start {probe}: {exc}") from exc
        state = getattr(status, "state", None)
        if state not in RUNNING_STATES:
            tier.disable_deep(key)
            reason = getattr(status, "reason", "") or str(status)
            raise PermanentActuatorError(f"{probe} cannot run here: {state} ({reason})")

    def revert(self, change: Change) -> None:
        """Switch the session off; nothing to do when it is already off (expired,
        reverted, or its process restarted). Off is the deep tier's resting
        state, so this holds even when ``before`` was an older session."""
        if self.deep_tier is not None:
            self.deep_tier.disable_deep(self.session_key(change.target))
