"""Thinning a time series to what a chart of N pixels can show.

``m4`` keeps, for each pixel column, the first, lowest, highest and last point
(the M4 aggregation of Jugel et al., VLDB 2014): the drawn line is the same as
with every point, but a series of 100k evaluations becomes at most 4 points per
pixel. Missing values (NaN) split the series into segments so gaps stay gaps.
``change_points`` reduces a step function (a threshold that rarely moves) to the
points where it changes. ``step_segments`` is ``m4`` for a value that holds
from one evaluation to the next: each segment comes with the time its last
value holds until (the next evaluation, where a missing value or a condition
no longer evaluated ends it, or the given end).

Example::

    segments = m4(ts, values, t0=0.0, t1=600.0, buckets=900)
    # [[(0.0, 48.1), (0.6, 52.0), ...], [...after a gap...]]

Overhead: one pass, O(n) time, output O(buckets) points per segment.
"""
from __future__ import annotations

import math
from typing import Sequence

Point = tuple[float, float]


def _bucket_points(first: Point, low: Point, high: Point, last: Point) -> list[Point]:
    return sorted({first, low, high, last})


def m4(ts: Sequence[float], values: Sequence[float], t0: float, t1: float, buckets: int) -> list[list[Point]]:
    """Segments of (t, v) points, at most 4 per bucket; ``ts`` must be ascending."""
    return _m4(ts, values, t0, t1, buckets)[0]


def step_segments(ts: Sequence[float], values: Sequence[float], t0: float, t1: float, buckets: int,
                  until: float) -> list[tuple[list[Point], float]]:
    """(points, holds until) per segment of a step function; ``ts`` ascending."""
    segments, ends = _m4(ts, values, t0, t1, buckets)
    out = []
    for i, seg in enumerate(segments):
        end = ends[i] if i < len(ends) else until
        out.append((seg, max(seg[-1][0], end)))
    return out


def _m4(ts: Sequence[float], values: Sequence[float], t0: float, t1: float,
        buckets: int) -> tuple[list[list[Point]], list[float]]:
    """The segments, and the time of the missing value that ended each (one fewer when the last runs to the end)."""
    scale = buckets / (t1 - t0) if t1 > t0 else 0.0
    segments: list[list[Point]] = []
    ends: list[float] = []
    current: list[Point] = []
    bucket = None
    first = low = high = last = None
    for t, v in zip(ts, values):
        if math.isnan(v):
            if bucket is not None:
                current.extend(_bucket_points(first, low, high, last))
                bucket = None
            if current:
                segments.append(current)
                ends.append(t)
                current = []
            continue
        b = min(buckets - 1, max(0, int((t - t0) * scale)))
        point = (t, v)
        if b != bucket:
            if bucket is not None:
                current.extend(_bucket_points(first, low, high, last))
            bucket, first, low, high = b, point, point, point
        elif v < low[1]:
            low = point
        elif v > high[1]:
            high = point
        last = point
    if bucket is not None:
        current.extend(_bucket_points(first, low, high, last))
    if current:
        segments.append(current)
    return segments, ends


def change_points(ts: Sequence[float], values: Sequence[float]) -> tuple[list[float], list[float]]:
    """The first point of every run of equal values, plus the final point."""
    out_t: list[float] = []
    out_v: list[float] = []
    previous = None
    for t, v in zip(ts, values):
        same = previous is not None and (v == previous or (math.isnan(v) and math.isnan(previous)))
        if not same:
            out_t.append(t)
            out_v.append(v)
        previous = v
    if ts and (not out_t or out_t[-1] != ts[-1]):
        out_t.append(ts[-1])
        out_v.append(values[-1])
    return out_t, out_v
