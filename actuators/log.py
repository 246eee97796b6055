"""The ``log`` actuator: writes one line to the controller's log. Changes nothing.

Example (policy)::

    actions:
      - actuator: log
        params: {message: "loader P99 high", level: warning}

Overhead: one logging call.
"""
from __future__ import annotations

import logging

from .base import Actuator, Change, Target
from .specs import SPECS

log = logging.getLogger("reflexarc.actuators.log")


class LogActuator(Actuator):
    spec = SPECS["log"]

    def read_current(self, target: Target, params: dict | None = None) -> None:
        return None

    def plan(self, target: Target, params: dict) -> Change:
        message = params.get("message") or "policy fired"
        return Change("log", target, dict(params), None, message, f"log: {message} [{target.key()}]")

    def apply(self, change: Change) -> None:
        level = getattr(logging, str(change.params.get("level", "warning")).upper(), logging.WARNING)
        log.log(level, "%s", change.summary)

    def revert(self, change: Change) -> None:
        return None
