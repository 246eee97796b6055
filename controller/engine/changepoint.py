"""Change points for ``change:`` conditions: a one-sided CUSUM per rule and
target on every new point of the signal, against a reference learned while
the rule is healthy.

Why CUSUM and not Bayesian online change-point detection: the question a rule
asks is one-sided and has a known size ("step time rose by 1.3x"), which is
the case CUSUM is optimal for (Lorden, Moustakides: the least worst-case delay
for a given false-alarm rate). It costs a few float operations per point and
one number of state per target, and its threshold follows from the false-alarm
rate the policy declares (Siegmund's approximation of the in-control average
run length). BOCPD asks "has anything changed?" with a hazard rate and an
observation model to choose, keeps a run-length distribution per target, and
its alarm is a posterior threshold that the policy author cannot translate
into false alarms per day.

Per point ``x`` and a reference of median ``m`` and robust spread ``s``
(1.4826 x the median absolute deviation, at least ``SPREAD_FLOOR`` of ``m``),
in units of ``s``:

    shift d = (factor - 1) * m      (or the absolute ``amount``)
    z       = (x - m) / s  (up)     or (m - x) / s  (down)
    S       = min(2h, max(0, S + min(z - k, h / (MIN_POINTS - 0.5))))    k = d / (2 s)

and the condition holds while ``S > h``. ``h`` solves Siegmund's
``ARL0(h) = (e^(2k(h+1.166)) - 2k(h+1.166) - 1) / (2k^2)`` for ARL0 = the
points the series takes in 1 / ``false_alarms`` seconds. Clipping each
point's step to ``h / (MIN_POINTS - 0.5)`` means no fewer than ``MIN_POINTS``
shifted points fire it, so one outlier (an epoch turn's long step, a
checkpoint's pause) never does, and the clip only lengthens the run length
the threshold was chosen for. ``S`` is capped at ``2h`` so it falls back
below ``h`` within a few points once the signal returns.

The reference is the median and spread of the points of the last
``baseline`` seconds that were not part of an excursion: points that raise
``S`` above 0 are held back and learned only if ``S`` returns to 0 while the
rule is healthy (so the start of a shift never teaches the reference that it
is normal). Until ``min_history`` seconds and ``MIN_REFERENCE`` points are
learned, the condition does not hold ("learning baseline").

Example::

    det = ChangeDetector(spec, window=600.0, min_history=60.0)
    statistic, limit, reference, ok, extra = det.update(series, now, learning=True)
    extra     # {"change_at": 1712.0, "shift": 2.04, "limit": 1.2}  once S > 0

Overhead: per update, a binary search per series for the new points, then a
few float operations per point; the reference's median and spread are
recomputed at most once per ``RECOMPUTE_S`` seconds of learning (a sort of at
most the window's points).
"""
from __future__ import annotations

import bisect
import math
from collections import deque

from ..policy.model import ChangeSpec
from .bus import Series

MIN_POINTS = 3              # shifted points needed, at least, to fire
SPREAD_FLOOR = 0.02         # of the reference: the spread of a series steadier than this is taken as this
MIN_REFERENCE = 10          # points learned before the condition can hold
RECOMPUTE_S = 5.0
SIEGMUND = 1.166


def cusum_limit(k: float, arl0: float) -> float:
    """``h`` (in spreads) for which a one-sided CUSUM of reference ``k`` runs
    about ``arl0`` points between false alarms (Siegmund's approximation)."""
    if k <= 0 or arl0 <= 1:
        return 0.0

    def arl(h: float) -> float:
        b = 2.0 * k * (h + SIEGMUND)
        return (math.exp(min(b, 700.0)) - b - 1.0) / (2.0 * k * k)

    lo, hi = 0.0, 1.0
    while arl(hi) < arl0 and hi < 1e6:
        hi *= 2.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if arl(mid) < arl0 else (lo, mid)
    return hi


class Reference:
    """The healthy points of the last ``window`` seconds: median, spread and
    points per second, recomputed at most every ``RECOMPUTE_S``."""

    __slots__ = ("window", "min_history", "_points", "_stats", "_computed_at")

    def __init__(self, window: float, min_history: float) -> None:
        self.window = window
        self.min_history = min(min_history, window / 4)
        self._points: deque[tuple[float, float]] = deque()
        self._stats: tuple[float, float, float] | None = None
        self._computed_at = -math.inf

    def add(self, ts: float, value: float) -> None:
        self._points.append((ts, value))

    def stats(self, now: float) -> tuple[float, float, float] | None:
        """(median, spread, points per second), or None while still learning."""
        points = self._points
        while points and points[0][0] <= now - self.window:
            points.popleft()
        if len(points) < MIN_REFERENCE or now - points[0][0] < self.min_history:
            self._stats = None
            return None
        if self._stats is None or now - self._computed_at >= RECOMPUTE_S:
            values = sorted(v for _, v in points)
            median = _median(values)
            spread = 1.4826 * _median(sorted(abs(v - median) for v in values))
            rate = len(points) / max(points[-1][0] - points[0][0], 1.0)
            self._stats, self._computed_at = (median, spread, rate), now
        return self._stats


def _median(values: list[float]) -> float:
    n = len(values)
    mid = n // 2
    return values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2.0


class ChangeDetector:
    """One ``change:`` condition of one rule and target."""

    __slots__ = ("spec", "reference", "statistic", "change_at", "_held", "_seen")

    def __init__(self, spec: ChangeSpec, window: float, min_history: float) -> None:
        self.spec = spec
        self.reference = Reference(window, min_history)
        self.statistic = 0.0
        self.change_at: float | None = None      # the first point of the current excursion
        self._held: list[tuple[float, float]] = []   # its points, learned if it comes to nothing
        self._seen: dict[int, float] = {}        # per series: the newest point consumed

    def _new_points(self, series: list[Series], now: float) -> list[tuple[float, float]]:
        out: list[tuple[float, float]] = []
        seen, kept = self._seen, {}           # only the series the target still reads are remembered
        for s in series:
            after = seen.get(id(s), -math.inf)
            lo = bisect.bisect_right(s.ts, after)
            hi = bisect.bisect_right(s.ts, now)
            if lo < hi:
                out.extend(zip(s.ts[lo:hi], s.vs[lo:hi]))
                after = s.ts[hi - 1]
            kept[id(s)] = after
        self._seen = kept
        if len(series) > 1:
            out.sort()
        return out

    def update(self, series: list[Series], now: float, learning: bool):
        """Consume the points that arrived since the last update; returns
        ``(statistic, limit, reference median, holds, extra)``: statistic and
        limit in spreads, ``extra`` the change point and the shift so far."""
        points = self._new_points(series, now)
        spec, ref = self.spec, self.reference
        stats = ref.stats(now)
        if stats is None:
            if learning:
                for ts, v in points:
                    ref.add(ts, v)
            return None, None, None, False, None
        median, spread, rate = stats
        spread = max(spread, SPREAD_FLOOR * abs(median), 1e-12)
        shift = (spec.factor - 1.0) * median if spec.factor is not None else spec.amount
        k = abs(shift) / (2.0 * spread)
        limit = cusum_limit(k, rate / spec.false_alarms) if k > 0 else math.inf
        step_cap = limit / (MIN_POINTS - 0.5)
        sign = 1.0 if spec.direction == "up" else -1.0
        s = self.statistic
        for ts, v in points:
            z = sign * (v - median) / spread
            s = min(2.0 * limit, max(0.0, s + min(z - k, step_cap)))
            if s > 0.0:
                if self.change_at is None:
                    self.change_at = ts
                self._held.append((ts, v))
            else:
                if learning:
                    for held in self._held:
                        ref.add(*held)
                    ref.add(ts, v)
                self._held.clear()
                self.change_at = None
        self.statistic = s
        extra = None
        if self.change_at is not None and self._held:
            mean = sum(v for _, v in self._held) / len(self._held)
            extra = {"change_at": self.change_at, "limit": limit,
                     "shift": mean / median if spec.factor is not None and median else mean - median}
        return s, limit, median, s > limit, extra
