"""Clocks the controller reads time from: real time on nodes, simulated time in scenarios.

The controller never calls ``time`` itself; it is handed a clock, so the same code
runs a 10-minute scenario in milliseconds and a node in real time.

Two readings: ``now()`` times everything that is a duration (windows, ``for``,
``clear_for``, cooldowns, ttls, ``max_actions`` windows, the loop's waits,
reload and PromQL cadence, samples' ages) and, on a node, is the monotonic
clock: a wall clock stepped by NTP or by hand, forwards or backwards, neither
stretches nor cuts short any of them. ``wall()`` is for the timestamps people
read (the audit's and the journal's ``ts``); ``to_wall(t)`` places an instant
of ``now()`` on it. In a simulation both are the simulated time.

Example::

    clock = SimClock(start=0.0)
    clock.set(1.5)
    assert clock.now() == 1.5 == clock.wall()

Overhead: one attribute read (SimClock) or one clock call (WallClock).
"""
from __future__ import annotations

import time


class WallClock:
    """Real time: ``now`` monotonic, ``wall`` the wall clock; ``sleep`` blocks."""

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def to_wall(self, t: float) -> float:
        return time.time() - (time.monotonic() - t)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class SimClock:
    """Simulated time; ``sleep`` advances the clock instantly."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now

    def to_wall(self, t: float) -> float:
        return t

    def set(self, t: float) -> None:
        self._now = float(t)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._now += seconds
