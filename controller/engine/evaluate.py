"""Evaluating rule conditions over the series of one target, with learned baselines.

``agg(signal{match}[window]) op threshold`` pools the points of every series a
target's condition reads (resolved once by ``targets.RuleTargets``) inside the
window and compares the aggregate with the threshold. A relative threshold
(``3x baseline``) multiplies the median of the condition's value over the
baseline window, learned only while the rule is healthy; until enough healthy
history exists the condition is not met ("learning baseline").

Each ``Input`` caches its aggregate: when none of its series received a point
and no point left the window since the last evaluation, the value is reused
without reading the points. Only the threshold comparison runs again.

Example::

    inp = Input(cond, [series_a, series_b])
    value = inp.value(now)                        # None when there is no data
    base = Baseline(cond.baseline_window, 60.0)
    base.add(now, value); base.median(now)        # None until 60 s of history

Overhead: per condition and tick, a version sum over its series; on a change,
a binary search per series and one C-level pass over the window's points
(sorting only for quantiles). A baseline add is an append and a sorted insert.
"""
from __future__ import annotations

import bisect
import math
import operator
from collections import deque

from ..policy.model import Combo, Condition
from .bus import Series

OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
       "==": operator.eq, "!=": operator.ne}
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


def quantile(values: list[float], q: float, presorted: bool = False) -> float:
    s = values if presorted else sorted(values)
    if len(s) == 1:
        return s[0]
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _increase(vs: list[float], counter: bool) -> float:
    if not counter:
        return vs[-1] - vs[0]
    total, prev = 0.0, vs[0]
    for v in vs[1:]:
        total += v - prev if v >= prev else v  # a drop is a counter reset
        prev = v
    return total


def _slope(windows: list[tuple[Series, int, int]]) -> float | None:
    """The trend per minute: each series' least-squares slope over its points
    in the window, averaged weighted by their points (several GPUs of a job at
    different levels trend together without their levels mixing); None
    without a series of two points at distinct times."""
    total, weight = 0.0, 0
    for s, lo, hi in windows:
        n = hi - lo
        if n < 2:
            continue
        ts, vs = s.ts[lo:hi], s.vs[lo:hi]
        mt, mv = sum(ts) / n, sum(vs) / n
        var = sum((t - mt) ** 2 for t in ts)
        if var <= 0:
            continue
        total += n * sum((t - mt) * (v - mv) for t, v in zip(ts, vs)) / var
        weight += n
    return total / weight * 60.0 if weight else None


def aggregate(agg: str, windows: list[tuple[Series, int, int]], counter: bool) -> float | None:
    """Aggregate the points ``s.vs[lo:hi]`` of several series; None when there is no data."""
    if not windows:
        return None
    if agg == "max":
        return max(max(s.vs[lo:hi]) for s, lo, hi in windows)
    if agg == "min":
        return min(min(s.vs[lo:hi]) for s, lo, hi in windows)
    if agg == "mean":
        return sum(sum(s.vs[lo:hi]) for s, lo, hi in windows) / sum(hi - lo for _, lo, hi in windows)
    if agg == "count":
        return float(sum(hi - lo for _, lo, hi in windows))
    if agg == "last":
        return max(s.vs[hi - 1] for s, lo, hi in windows)
    if agg in QUANTILES:
        values: list[float] = []
        for s, lo, hi in windows:
            values.extend(s.vs[lo:hi])
        values.sort()
        return quantile(values, QUANTILES[agg], presorted=True)
    if agg == "slope":
        return _slope(windows)
    if agg in ("rate", "delta"):
        usable = [(s, lo, hi) for s, lo, hi in windows if hi - lo >= 2]
        if not usable:
            return None
        inc = sum(_increase(s.vs[lo:hi], counter) for s, lo, hi in usable)
        if agg == "delta":
            return inc
        span = max(s.ts[hi - 1] - s.ts[lo] for s, lo, hi in usable)
        return inc / span if span > 0 else None
    raise ValueError(f"unknown aggregation {agg}")


class Input:
    """One condition of one target: the series it reads and its cached value."""

    __slots__ = ("cond", "series", "counter", "_version", "_valid_until", "_value")

    def __init__(self, cond: Condition, series: list[Series], counter: bool = False) -> None:
        self.cond = cond
        self.series = series
        self.counter = counter
        self._version = -1
        self._valid_until = -math.inf
        self._value: float | None = None

    def value(self, now: float) -> float | None:
        series = self.series
        version = series[0].version if len(series) == 1 else sum(s.version for s in series)
        if version == self._version and now < self._valid_until:
            return self._value
        window = self.cond.window
        since = now - window
        windows, valid_until = [], math.inf
        for s in series:
            lo, hi = s.bounds(since, now)
            if lo < hi:
                windows.append((s, lo, hi))
                valid_until = min(valid_until, s.ts[lo] + window)   # when its oldest point leaves
            if hi < len(s.ts):
                valid_until = min(valid_until, s.ts[hi])            # when a future point enters
        self._value = aggregate(self.cond.agg, windows, self.counter)
        self._version, self._valid_until = version, valid_until
        return self._value

    def last_seen(self) -> float:
        """Time of the newest point of any of its series."""
        return max((s.last_ts for s in self.series), default=-math.inf)


class Baseline:
    """The median of a condition's healthy values over ``window`` seconds, kept
    sorted so the median costs nothing; None until ``min_history`` seconds of it."""

    __slots__ = ("window", "min_history", "_points", "_sorted")

    def __init__(self, window: float, min_history: float) -> None:
        self.window = window
        self.min_history = min(min_history, window / 4)
        self._points: deque[tuple[float, float]] = deque()
        self._sorted: list[float] = []

    def _expire(self, now: float) -> None:
        points, horizon = self._points, now - self.window
        while points and points[0][0] <= horizon:
            _, v = points.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, v)]

    def add(self, now: float, value: float) -> None:
        self._points.append((now, value))
        bisect.insort(self._sorted, value)
        self._expire(now)

    def median(self, now: float) -> float | None:
        self._expire(now)
        if not self._points or now - self._points[0][0] < self.min_history:
            return None
        return quantile(self._sorted, 0.5, presorted=True)


def compile_expr(expr: Condition | Combo, index: dict[int, int]):
    """The expression as nested tuples of condition indices: ``i`` or ``(all, [..])``."""
    if isinstance(expr, Condition):
        return index[id(expr)]
    return (expr.kind == "all", [compile_expr(item, index) for item in expr.items])


def evidence_item(cond: Condition, text: str, value, threshold, baseline, ok: bool, extra=None) -> dict:
    """One condition as evaluated; a change condition's value and threshold
    are its CUSUM statistic and limit (in spreads), ``extra`` its change point
    and shift."""
    item = {"condition": text, "signal": cond.signal, "agg": cond.agg, "window": cond.window,
            "op": cond.op, "value": value, "threshold": threshold, "baseline": baseline, "ok": ok}
    if extra:
        item.update(extra)
    return item
