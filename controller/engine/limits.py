"""Global per-node limits on enforcement: a kill-switch file, a cap on active
remediations, and a cap on actions per hour. Per-rule cooldown and max_actions
live in the rule lifecycle; these guard the node as a whole.

Enforcement is *held* while the kill-switch file exists or an operator
paused it (``reflexarc pause``): the controller then makes no change to the
system. An enforcing rule that would act waits in ``firing`` (a ``limit``
record says why, once) and acts when enforcement is released; applied
changes are not followed to new processes (an affinity pin does not reach a
new epoch's workers). Alerts still go out. Undoing is never held: a change still reverts when its rule clears,
its ttl ends, the controller stops or an operator rolls it back.

Example::

    limits = NodeLimits(LimitSettings(kill_switch="/run/reflexarc/disable", max_active=4, actions_per_hour=20))
    room = limits.room(now, hold=None)        # what a rule run may do this tick, as a value
    room.refuse("enforce", active=2)          # None, the hold, "max_active" or "actions_per_hour"
    limits.kill_switch_engaged()              # True while the file exists
    limits.pause = Pause("maintenance", {"uid": 0}, since=now, until=now + 600)
    limits.hold(now)                          # "kill_switch", "paused" or None
    limits.record(now)

Overhead: one ``stat`` of the kill-switch file per tick; a deque of action times.
"""
from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass


@dataclass
class Pause:
    """An operator's pause: why, who asked (``SO_PEERCRED``), and until when
    (the controller's monotonic clock; None: until ``resume``)."""

    reason: str
    by: dict
    since: float
    until: float | None = None


@dataclass(frozen=True)
class Room:
    """What the node leaves to a new change, handed to a rule run as a value:
    why enforcement is held, the cap on active changes (checked against the
    live tally of held changes, so a revert makes room at once) and whether
    this hour's actions are spent (it changes only when an action is taken)."""

    hold: str | None = None
    max_active: int = 4
    hour_spent: bool = False

    def refuse(self, mode: str, active: int) -> str | None:
        """Why a new change in ``mode`` may not be made with ``active`` changes
        held, or None: a hold stops only enforcing rules (which then wait in
        ``firing``), the caps stop every mode."""
        if mode == "enforce" and self.hold:
            return self.hold
        if active >= self.max_active:
            return "max_active"
        if self.hour_spent:
            return "actions_per_hour"
        return None


@dataclass
class LimitSettings:
    kill_switch: str = "/run/reflexarc/disable"
    max_active: int = 4
    actions_per_hour: int = 20


class NodeLimits:
    def __init__(self, settings: LimitSettings | None = None) -> None:
        self.settings = settings or LimitSettings()
        self._actions: deque[float] = deque()
        self.pause: Pause | None = None

    def kill_switch_engaged(self) -> bool:
        return bool(self.settings.kill_switch) and os.path.exists(self.settings.kill_switch)

    def hold(self, now: float, switch: bool | None = None) -> str | None:
        """Why enforcement is held now (``kill_switch`` or ``paused``), or None;
        ``switch`` is the kill switch's state when the caller just looked."""
        if self.kill_switch_engaged() if switch is None else switch:
            return "kill_switch"
        if self.pause is not None and (self.pause.until is None or now < self.pause.until):
            return "paused"
        return None

    def actions_last_hour(self, now: float) -> int:
        while self._actions and self._actions[0] <= now - 3600:
            self._actions.popleft()
        return len(self._actions)

    def room(self, now: float, hold: str | None) -> Room:
        """The node's room now, with ``hold`` as last looked at (``hold``)."""
        return Room(hold, self.settings.max_active, self.actions_last_hour(now) >= self.settings.actions_per_hour)

    def record(self, now: float) -> None:
        self._actions.append(now)
