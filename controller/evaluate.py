"""Evaluating rule conditions against the signal bus, with learned baselines.

``aggregate(agg(signal{match}[window]))`` pools the samples of every series that
matches the condition and belongs to the target, then compares with the
threshold. A relative threshold (``3x baseline``) multiplies the median of the
condition's value over the baseline window, learned only while the rule is
healthy; until enough healthy history exists the condition is not met
("learning baseline").

Example::

    ev = Evaluator(bus)
    result, evidence = ev.evaluate(rule.when, scope, now)
    ev.learn(scope, rule, now)          # while the rule is ok

Overhead: one bus select per condition per tick; baselines keep one value per
tick per condition for the baseline window.
"""
from __future__ import annotations

import math
import operator
from collections import deque
from dataclasses import dataclass

from .bus import Matcher, SignalBus
from .policy.model import Combo, Condition, Rule
from .signals import CATALOGUE

OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
       "==": operator.eq, "!=": operator.ne}
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


def quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    if len(s) == 1:
        return s[0]
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _increase(points: list[tuple[float, float]], counter: bool) -> float:
    if not counter:
        return points[-1][1] - points[0][1]
    total, prev = 0.0, points[0][1]
    for _, v in points[1:]:
        total += v - prev if v >= prev else v  # a drop is a counter reset
        prev = v
    return total


def aggregate(agg: str, series: list[list[tuple[float, float]]], counter: bool) -> float | None:
    """Aggregate the points of several series; None when there is no data."""
    series = [s for s in series if s]
    if not series:
        return None
    if agg in ("rate", "delta"):
        usable = [s for s in series if len(s) >= 2]
        if not usable:
            return None
        inc = sum(_increase(s, counter) for s in usable)
        if agg == "delta":
            return inc
        span = max(s[-1][0] - s[0][0] for s in usable)
        return inc / span if span > 0 else None
    if agg == "count":
        return float(sum(len(s) for s in series))
    if agg == "last":
        return max(s[-1][1] for s in series)
    values = [v for s in series for _, v in s]
    if agg in QUANTILES:
        return quantile(values, QUANTILES[agg])
    if agg == "mean":
        return sum(values) / len(values)
    if agg == "max":
        return max(values)
    if agg == "min":
        return min(values)
    raise ValueError(f"unknown aggregation {agg}")


@dataclass(frozen=True)
class Scope:
    """Where a rule is evaluated: the policy's selector matchers and the target's labels."""

    key: str                 # "policy/rule/target"
    match: tuple             # selector label matchers as sorted items
    labels: tuple            # target labels as sorted items (the rule's ``by`` labels)


class Evaluator:
    def __init__(self, bus: SignalBus, min_history: float = 60.0) -> None:
        self.bus = bus
        self.min_history = min_history
        self._history: dict[tuple, deque] = {}
        self._matchers: dict[tuple, Matcher] = {}

    # --- data --------------------------------------------------------------
    def _matcher(self, scope: Scope, cond: Condition) -> Matcher:
        key = (scope.match, tuple(sorted(cond.match.items())))
        m = self._matchers.get(key)
        if m is None:
            m = self._matchers[key] = Matcher({**dict(scope.match), **cond.match})
        return m

    def series(self, cond: Condition, scope: Scope, now: float) -> list[list[tuple[float, float]]]:
        target = dict(scope.labels)
        out = []
        for labels, points in self.bus.select(cond.signal, self._matcher(scope, cond), now - cond.window, now):
            if all(labels.get(k, v) == v for k, v in target.items()):
                out.append(points)
        return out

    def value(self, cond: Condition, scope: Scope, now: float) -> float | None:
        counter = CATALOGUE[cond.signal].kind == "counter"
        return aggregate(cond.agg, self.series(cond, scope, now), counter)

    def targets(self, rule: Rule, match: dict, now: float) -> list[dict]:
        """Label sets of the rule's ``by`` labels seen in its signals' windows."""
        if not rule.by:
            return [{}]
        m = Matcher(match)
        seen: dict[tuple, dict] = {}
        for cond in rule.conditions():
            cm = Matcher({**match, **cond.match})
            for labels, _ in self.bus.select(cond.signal, cm, now - cond.window, now):
                if m(labels) and all(k in labels for k in rule.by):
                    t = {k: labels[k] for k in rule.by}
                    seen[tuple(sorted(t.items()))] = t
        return [seen[k] for k in sorted(seen)]

    # --- baselines ------------------------------------------------------------
    def _hkey(self, scope: Scope, cond: Condition) -> tuple:
        return (scope.key, id(cond))

    def baseline(self, cond: Condition, scope: Scope, now: float) -> float | None:
        hist = self._history.get(self._hkey(scope, cond))
        if not hist:
            return None
        recent = [v for t, v in hist if t > now - cond.baseline_window]
        if not recent or now - hist[0][0] < min(self.min_history, cond.baseline_window / 4):
            return None
        return quantile(recent, 0.5)

    def learn(self, scope: Scope, rule: Rule, now: float) -> None:
        """Record healthy values of every relative condition (``when`` and ``verify``)."""
        conds = rule.conditions() + (_conditions(rule.verify.when) if rule.verify else [])
        for cond in conds:
            if not cond.relative:
                continue
            v = self.value(cond, scope, now)
            if v is None:
                continue
            hist = self._history.setdefault(self._hkey(scope, cond), deque())
            hist.append((now, v))
            while hist and hist[0][0] <= now - cond.baseline_window:
                hist.popleft()

    # --- evaluation -------------------------------------------------------------
    def check(self, cond: Condition, scope: Scope, now: float) -> dict:
        value = self.value(cond, scope, now)
        baseline = self.baseline(cond, scope, now) if cond.relative else None
        threshold = (cond.threshold * baseline if baseline is not None else None) if cond.relative else cond.threshold
        ok = value is not None and threshold is not None and OPS[cond.op](value, threshold)
        return {"condition": cond.describe(), "signal": cond.signal, "agg": cond.agg, "window": cond.window,
                "op": cond.op, "value": value, "threshold": threshold, "baseline": baseline, "ok": bool(ok)}

    def evaluate(self, expr: Condition | Combo, scope: Scope, now: float) -> tuple[bool, list[dict]]:
        if isinstance(expr, Condition):
            item = self.check(expr, scope, now)
            return item["ok"], [item]
        results, evidence = [], []
        for sub in expr.items:
            r, ev = self.evaluate(sub, scope, now)
            results.append(r)
            evidence.extend(ev)
        return (all(results) if expr.kind == "all" else any(results)), evidence


def _conditions(expr: Condition | Combo) -> list[Condition]:
    return expr.conditions() if isinstance(expr, Combo) else [expr]
