"""The signal bus: every source publishes samples here; rules read windows from it.

Series are keyed by (name, label set) and keep samples for ``retention``
seconds; a series with no sample in that time is dropped by ``expire``. The
series of a process (label ``pid``) leave sooner: when the probes see it exit,
``drop_exited`` drops them at once, through an index from pid to series, but
only those fed no later than the poll that saw the exit, so a process that
reused the pid since keeps its own. Each signal name has a
*generation* that changes whenever one of its series appears or is dropped,
so a reader can resolve its series once and look again only when the
generation moved; each series counts its appends (``version``), so a reader
can tell that nothing new arrived without reading the points.

Memory is bounded whatever the sources send: a signal holds at most
``max_series`` series, and a series at most ``max_points`` live points (the
oldest one makes room: ``Stored.SERIES_FULL``). A sample that would open a
series beyond the cap first makes room by dropping the signal's silent
series, those with no sample for ``silent_after`` seconds (processes that
exited unseen by the probes: under worker churn they would otherwise hold the
cap for the whole retention); only when every series is live is it refused
(``Stored.SERIES_LIMIT``). A live series is never dropped for a new one; a
silent one dropped so loses the older part of a window longer than
``silent_after`` only while the signal is at its cap.
``publish`` says which happened; the live intake counts it.

Example::

    bus = SignalBus(retention=600)
    bus.publish("step_time_ms", {"job": "llama", "rank": "0"}, 180.0, ts=12.0)   # Stored.STORED
    gen, series = bus.generation("step_time_ms"), bus.series("step_time_ms")
    lo, hi = series[0].bounds(since=0.0, until=12.0)      # indices into .ts/.vs
    bus.drop_exited({4250, 4251}, fed_until=12.0)         # their series fed until 12 s: 2 dropped

Overhead: O(1) amortised per sample (list append, pruning in halves); at
the cap, a new series walks the signal's series once to drop the silent
(0.35 ms at 4 096 series here), or is refused at once (~2 us) when the last
walk found none to fall silent before its time; a
window is two binary searches in one series; ``expire``
walks every series once (the controller calls it every few seconds);
``drop_exited`` costs a dictionary look-up per exited process (~0.2 us),
~3 us per series it drops. A series with four labels takes ~0.8 KB before
its points, ~0.2-0.3 KB more in the pid index when it has a ``pid``: a signal
at its cap, ~3.5-4.5 MB.
"""
from __future__ import annotations

import bisect
import math
import re
import threading
from enum import StrEnum

MAX_SERIES = 4_096      # series per signal (e.g. 2 048 processes x 2 quantiles)
MAX_POINTS = 16_384     # live points per series (a 15-minute retention at 10 samples/s fits)
SILENT_AFTER = 10.0     # seconds without a sample after which a series may make room at the cap
PROCESS_LABEL = "pid"   # the label naming the process a series describes (the probes' per-process signals)


class Stored(StrEnum):
    """What ``publish`` did with a sample; the two refusals are the ``reason``
    of ``reflexarc_samples_dropped_total``."""

    STORED = "stored"
    SERIES_LIMIT = "series_limit"   # it would open a series beyond the signal's cap: not stored
    SERIES_FULL = "series_full"     # stored; the series' oldest live point was dropped for it


def label_key(labels: dict) -> tuple:
    return tuple(sorted((str(k), str(v)) for k, v in labels.items()))


class Matcher:
    """Label matchers: ``"v"`` equals, ``"~re"`` matches a regex, ``"!v"`` differs."""

    def __init__(self, matchers: dict | None) -> None:
        self._tests = []
        for key, want in (matchers or {}).items():
            want = str(want)
            if want.startswith("~"):
                rx = re.compile(want[1:])
                self._tests.append((key, lambda v, rx=rx: v is not None and rx.fullmatch(v) is not None))
            elif want.startswith("!"):
                self._tests.append((key, lambda v, w=want[1:]: v != w))
            else:
                self._tests.append((key, lambda v, w=want: v == w))

    def __call__(self, labels: dict) -> bool:
        return all(test(labels.get(key)) for key, test in self._tests)


class Series:
    """Time-ordered points of one labelled series in two parallel lists; old
    points are dropped in bulk. ``head`` is the first live point, ``version``
    counts appends."""

    __slots__ = ("labels", "ts", "vs", "head", "version")

    def __init__(self, labels: dict) -> None:
        self.labels = labels
        self.ts: list[float] = []
        self.vs: list[float] = []
        self.head = 0
        self.version = 0

    @property
    def last_ts(self) -> float:
        return self.ts[-1] if self.ts else -math.inf

    def append(self, ts: float, value: float, horizon: float, max_points: int = MAX_POINTS) -> bool:
        """Adds a point; False when the oldest live point was dropped to keep ``max_points``."""
        self.version += 1
        if self.ts and ts < self.ts[-1]:        # out of order: keep the lists sorted
            i = bisect.bisect_right(self.ts, ts)
            self.ts.insert(i, ts)
            self.vs.insert(i, value)
        else:
            self.ts.append(ts)
            self.vs.append(value)
        self.head = bisect.bisect_left(self.ts, horizon, self.head)
        full = len(self.ts) - self.head > max_points
        if full:
            self.head = len(self.ts) - max_points
        if self.head > 1024 and self.head * 2 > len(self.ts):
            del self.ts[:self.head], self.vs[:self.head]
            self.head = 0
        return not full

    def bounds(self, since: float, until: float) -> tuple[int, int]:
        """Indices ``lo, hi`` of the points with ``since < ts <= until``."""
        ts = self.ts
        lo = bisect.bisect_right(ts, since, self.head)
        hi = len(ts) if not ts or ts[-1] <= until else bisect.bisect_right(ts, until, lo)
        return lo, hi



class SignalBus:
    def __init__(self, retention: float = 900.0, max_series: int = MAX_SERIES,
                 max_points: int = MAX_POINTS, silent_after: float = SILENT_AFTER) -> None:
        self.retention = retention
        self.max_series = max_series
        self.max_points = max_points
        self.silent_after = silent_after
        self._series: dict[str, dict[tuple, Series]] = {}
        self._by_pid: dict[str, set[tuple[str, tuple]]] = {}   # PROCESS_LABEL value -> its (name, key)s
        self._silent_at: dict[str, float] = {}   # name -> none of its series falls silent before then
        self._generation: dict[str, int] = {}
        self._lock = threading.Lock()

    def publish(self, name: str, labels: dict, value: float, ts: float) -> Stored:
        key = label_key(labels)
        with self._lock:
            by_name = self._series.get(name)
            if by_name is None:
                by_name = self._series[name] = {}
            series = by_name.get(key)
            if series is None:
                if len(by_name) >= self.max_series and not self._make_room(name, by_name, ts):
                    return Stored.SERIES_LIMIT
                if ts + self.silent_after < self._silent_at.get(name, math.inf):
                    self._silent_at[name] = ts + self.silent_after
                series = by_name[key] = Series(dict(key))
                pid = series.labels.get(PROCESS_LABEL)
                if pid is not None:
                    self._by_pid.setdefault(pid, set()).add((name, key))
                self._generation[name] = self._generation.get(name, 0) + 1
            if series.append(ts, float(value), ts - self.retention, self.max_points):
                return Stored.STORED
            return Stored.SERIES_FULL

    def _make_room(self, name: str, by_name: dict, now: float) -> bool:
        """Drop every silent series of ``name`` (no sample for ``silent_after``
        seconds before ``now``); whether there is room now. One pass frees all
        of them at once, so churn pays it once per many new series; a pass
        that frees nothing notes when the first series can fall silent, and
        until then a new series is refused without a pass (a storm of new
        series at the cap costs a look-up each, not a walk)."""
        if now < self._silent_at.get(name, -math.inf):
            return False
        horizon = now - self.silent_after
        silent, oldest = [], math.inf
        for key, s in by_name.items():
            last = s.last_ts
            if last <= horizon:
                silent.append(key)
            elif last < oldest:
                oldest = last
        self._drop(name, by_name, silent)
        self._silent_at[name] = oldest + self.silent_after
        return len(by_name) < self.max_series

    def _drop(self, name: str, by_name: dict, keys: list[tuple]) -> None:
        """Drop series ``keys`` of ``name`` and their index entries (the lock held)."""
        for key in keys:
            pid = by_name.pop(key).labels.get(PROCESS_LABEL)
            owned = self._by_pid.get(pid) if pid is not None else None
            if owned is not None:
                owned.discard((name, key))
                if not owned:
                    del self._by_pid[pid]
        if keys:
            self._generation[name] = self._generation.get(name, 0) + 1

    def drop_exited(self, pids, fed_until: float) -> int:
        """Drop the series of the processes ``pids`` (label ``pid``) that exited,
        those whose newest sample is no later than ``fed_until`` (the time of the
        poll that saw the exits, which carried their last samples): a new process
        that reused a pid and was fed since keeps its series. Returns how many."""
        dropped = 0
        with self._lock:
            stale: dict[str, list[tuple]] = {}
            for pid in pids:
                for name, key in self._by_pid.get(str(pid), ()):
                    if self._series[name][key].last_ts <= fed_until:
                        stale.setdefault(name, []).append(key)
            for name, keys in stale.items():
                self._drop(name, self._series[name], keys)
                dropped += len(keys)
        return dropped

    def generation(self, name: str) -> int:
        """Changes whenever a series of ``name`` appears or is dropped."""
        return self._generation.get(name, 0)

    def series(self, name: str) -> list[Series]:
        """Every live series of ``name`` (the objects themselves: read, do not change)."""
        with self._lock:
            return list(self._series.get(name, {}).values())

    def series_count(self) -> int:
        with self._lock:
            return sum(len(by_name) for by_name in self._series.values())

    def expire(self, now: float) -> int:
        """Drop the series whose newest sample is older than the retention; returns how many."""
        horizon = now - self.retention
        dropped = 0
        with self._lock:
            for name, by_name in self._series.items():
                dead = [key for key, s in by_name.items() if s.last_ts <= horizon]
                self._drop(name, by_name, dead)
                dropped += len(dead)
        return dropped
