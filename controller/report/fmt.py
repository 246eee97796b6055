"""Text formatting shared by the HTML, Markdown, JSON and terminal reports.

Times are simulated seconds from 0 in scenarios and Unix time on nodes; every
report shows them the same way through ``Clock``. Changes are shown as unified
diffs of pretty-printed JSON, so a structured ``before``/``after`` reads like a
code review.

Example::

    Clock(wall=False).at(125.0)          # '2m05.0s'
    Clock(wall=True).at(1700000000.0)    # '22:13:20.0'  (UTC)
    number(1000), number(1500), number(950)   # '1k', '1.5k', '950'
    duration(3725)                       # '1h02m'
    plural(1, "target"), plural(1200, "target")   # '1 target', '1,200 targets'
    span(Clock(wall=False), 0, 600, 600)          # 't=0 s – t=600 s (10m00s)'
    name_of("")                          # '(not recorded)'
    says("run ", code("reflexarc report --full"), " to see more")   # a sentence each page marks up its way
    diff_lines({"cpus": [0, 1]}, {"cpus": [0]})

Overhead: string formatting only.
"""
from __future__ import annotations

import difflib
import json
import math
from datetime import datetime, timezone

from ..policy.model import change_words

FULL_CONTEXT_LINES = 40
INDENT = 2
INLINE_LIST_CHARS = 80


def duration(seconds: float | None) -> str:
    """'850 ms', '12.5 s', '2m05s', '1h02m'; '-' for None."""
    if seconds is None:
        return "-"
    sign, s = ("-" if seconds < 0 else ""), abs(seconds)
    if s < 1:
        return f"{sign}{s * 1000:.0f} ms"
    if s < 60:
        return f"{sign}{s:.1f} s"
    if s < 3600:
        return f"{sign}{int(s // 60)}m{int(s % 60):02d}s"
    return f"{sign}{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


class Clock:
    """How to print a ``ts``: seconds since start (simulations) or UTC wall time."""

    def __init__(self, wall: bool) -> None:
        self.wall = wall

    def at(self, ts: float | None) -> str:
        if ts is None:
            return "-"
        if self.wall:
            return datetime.fromtimestamp(ts, timezone.utc).strftime("%H:%M:%S.%f")[:10]
        if ts < 60:
            return f"{ts:.1f}s"
        return f"{int(ts // 60)}m{ts % 60:04.1f}s"

    def stamp(self, ts: float | None) -> str:
        """A full, unambiguous form for headers."""
        if ts is None:
            return "-"
        if self.wall:
            return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"t={ts:g} s"

    def tick(self, ts: float, step: float) -> str:
        """An axis label for ``ts`` on a grid of ``step`` seconds."""
        if self.wall:
            fmt = "%H:%M" if step >= 60 else "%H:%M:%S"
            return datetime.fromtimestamp(ts, timezone.utc).strftime(fmt)
        if step >= 60 or abs(ts) >= 600:
            return f"{int(ts // 60)}:{int(round(ts % 60)):02d}"
        return f"{ts:g}"

    def axis_label(self, step: float) -> str:
        if self.wall:
            return "time (UTC)"
        return "time since start (min:s)" if step >= 60 else "time since start (s)"


Part = tuple[str, str]
"""A run of a sentence and its style: "" (plain), "code", "strong" or "muted"."""


def says(*parts: str | Part) -> list[Part]:
    """A sentence as parts; a plain string is a plain part."""
    return [p if isinstance(p, tuple) else ("", p) for p in parts]


def code(text) -> Part:
    return ("code", str(text))


def span(clock: Clock, start, end, length) -> str:
    """A time span for headers: 't=0 s – t=600 s (10m00s)'."""
    return f"{clock.stamp(start)} – {clock.stamp(end)} ({duration(length)})"


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def name_of(value) -> str:
    """A policy or rule name; an empty one (an old journal entry's) is said to be unknown."""
    return str(value) if value else "(not recorded)"


def number(value) -> str:
    """Compact, unit-free, in one form on every page and axis: '0.31', '812',
    '1k', '1.5k', '12.3k', '3.4M'; '-' when not a finite number."""
    kind = type(value)
    if kind is not float and kind is not int:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "-"
    if not -math.inf < value < math.inf:
        return "-"
    a = value if value >= 0 else -value
    if a >= 999.5:
        if a >= 999.5e6:
            return f"{value / 1e9:.3g}G"
        if a >= 999.5e3:
            return f"{value / 1e6:.3g}M"
        return f"{value / 1e3:.3g}k"
    if a >= 100 or a == 0:
        return f"{value:.0f}"
    return f"{value:.3g}"


def pretty(value) -> str:
    """Stable, indented JSON with short lists of scalars kept on one line (``"cpus": [0, 1]``);
    strings are returned as they are."""
    if isinstance(value, str):
        return value
    return _pretty(value, 0)


def _pretty(value, indent: int) -> str:
    pad, inner = " " * indent, " " * (indent + INDENT)
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(str(k))}: {_pretty(v, indent + INDENT)}" for k, v in sorted(
            value.items(), key=lambda kv: str(kv[0]))]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, (list, tuple)) and value:
        if any(isinstance(v, (dict, list, tuple)) for v in value):
            return "[\n" + ",\n".join(inner + _pretty(v, indent + INDENT) for v in value) + f"\n{pad}]"
        flat = json.dumps(value, default=str)
        if len(flat) <= INLINE_LIST_CHARS:
            return flat
        return "[\n" + ",\n".join(inner + line for line in _wrap([json.dumps(v, default=str) for v in value])) \
            + f"\n{pad}]"
    return json.dumps(value, default=str)


def _wrap(words: list[str]) -> list[str]:
    """Comma-separated words packed into lines of about ``INLINE_LIST_CHARS``."""
    lines, current = [], []
    for word in words:
        if current and len(", ".join(current + [word])) > INLINE_LIST_CHARS:
            lines.append(", ".join(current))
            current = []
        current.append(word)
    lines.append(", ".join(current))
    return lines


def compact(value, limit: int = 160) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def diff_lines(before, after) -> list[str]:
    """The change as unified-diff lines ('-' before, '+' after, ' ' unchanged).

    Structured values are compared line by line on their pretty JSON; a short
    object keeps all its lines as context so the reader sees it whole."""
    if before == after:
        return [" " + line for line in pretty(after).splitlines()] or [" "]
    old = [] if before is None else pretty(before).splitlines()
    new = [] if after is None else pretty(after).splitlines()
    full = max(len(old), len(new)) <= FULL_CONTEXT_LINES
    out = []
    for line in difflib.unified_diff(old, new, lineterm="", n=max(len(old), len(new)) if full else 3):
        if line.startswith(("---", "+++")) or (full and line.startswith("@@")):
            continue
        out.append(line)
    return out


def evidence_text(item: dict) -> str:
    """'p99(x[30s]) > 3x baseline: 812 vs 150 (baseline 50) holds' from an evidence item."""
    get = item.get
    cond = get("condition") or get("signal") or "?"
    value, threshold, baseline, ok = get("value"), get("threshold"), get("baseline"), get("ok")
    if get("agg") == "change":
        text = f"{cond}: {change_words(item, number)}"
    else:
        text = f"{cond}: {'no data' if value is None else number(value)}"
        if threshold is not None:
            text += f" vs {number(threshold)}"
        if baseline is not None:
            text += f" (baseline {number(baseline)})"
    if ok is True:
        text += " holds"
    elif ok is False:
        text += " does not hold"
    return text
