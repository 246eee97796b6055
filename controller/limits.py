"""Global per-node limits on enforcement: a kill-switch file, a cap on active
remediations, and a cap on actions per hour. Per-rule cooldown and max_actions
live in the rule lifecycle; these guard the node as a whole.

Example::

    limits = NodeLimits(kill_switch="/run/reflexarc/disable", max_active=4, actions_per_hour=20)
    reason = limits.refuse(now, active=2)     # None, "max_active" or "actions_per_hour"
    limits.kill_switch_engaged()              # True while the file exists
    limits.record(now)

Overhead: one ``stat`` of the kill-switch file per tick; a deque of action times.
"""
from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass


@dataclass
class LimitSettings:
    kill_switch: str = "/run/reflexarc/disable"
    max_active: int = 4
    actions_per_hour: int = 20


class NodeLimits:
    def __init__(self, settings: LimitSettings | None = None) -> None:
        self.settings = settings or LimitSettings()
        self._actions: deque[float] = deque()

    def kill_switch_engaged(self) -> bool:
        return bool(self.settings.kill_switch) and os.path.exists(self.settings.kill_switch)

    def refuse(self, now: float, active: int) -> str | None:
        """Why a new change may not be made now, or None. The kill switch is not a
        refusal: it turns enforcement into dry-run (see ``Controller.run_action``)."""
        if active >= self.settings.max_active:
            return "max_active"
        while self._actions and self._actions[0] <= now - 3600:
            self._actions.popleft()
        if len(self._actions) >= self.settings.actions_per_hour:
            return "actions_per_hour"
        return None

    def record(self, now: float) -> None:
        self._actions.append(now)
