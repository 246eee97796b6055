"""Clocks the controller reads time from: wall time on nodes, simulated time in scenarios.

The controller never calls ``time`` itself; it is handed a clock, so the same code
runs a 10-minute scenario in milliseconds and a node in real time.

Example::

    clock = SimClock(start=0.0)
    clock.set(1.5)
    assert clock.now() == 1.5

Overhead: one attribute read (SimClock) or one ``time.time()`` call (WallClock).
"""
from __future__ import annotations

import time


class WallClock:
    """Real time; ``sleep`` blocks."""

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class SimClock:
    """Simulated time; ``sleep`` advances the clock instantly."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def set(self, t: float) -> None:
        self._now = float(t)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._now += seconds
