"""One SVG picture per rule and target: conditions over time, states, actions.

From top to bottom: a lane of action markers (applied ▲, planned △, reverted ▼,
would-revert ▽, failed ✕, alerted ◆, notified ●, noop ○, kept ■, adopted □),
a strip naming the state the rule was in, then one panel per condition with the
evaluated value (solid), its threshold (dashed; it moves when the threshold is a
multiple of a learned baseline) and the baseline (dotted), over bands shaded by
state. Every line is a step: a value holds from its evaluation to the next one
of the rule (live audits write evaluations sparsely, so a straight line between
two would hide a jump), and stops where the condition was no longer evaluated
(a verify condition after verifying) or its target was retired (a grey "gone"
line). Sparse series also get a dot per evaluation. Every marker and band has a
``<title>`` tooltip; actions of one outcome that fall on the same few pixels
share one marker (``data-count`` says how many). Series are thinned with M4 to
at most 4 points per ``BUCKET_PX`` pixels, so 100k evaluations stay a few kB.
Axis numbers use one form throughout: 950, 1k, 1.5k, 10k, 2.5M.

Example::

    svg = render_timeline(run.tracks[("numa", "repin", "pid=4242")],
                          t0=run.first_ts, t1=run.last_ts, clock=Clock(wall=False))

Overhead: linear in the track's evaluations and actions; output O(width x conditions).
"""
from __future__ import annotations

import math
from html import escape

from reflexarc.core.outcomes import Outcome

from ..signals.catalogue import CATALOGUE
from .audit import Series, Track
from .downsample import change_points, step_segments
from .fmt import Clock, number
from .incidents import FAILED_STATE

WIDTH = 1000
LEFT, RIGHT = 84, 24
PLOT_W = WIDTH - LEFT - RIGHT
LANE_H = 44
LANE_ROWS = (11.0, 23.0, 35.0)
STRIP_H = 16
TITLE_H = 18
PANEL_H = 110
PANEL_GAP = 10
AXIS_H = 40
MARKER_R = 5.0
BUCKET_PX = 2                 # M4 columns are this wide: the picture is the same, the path half as long
DOTS_UNDER = 120              # a series with fewer evaluations than this shows each one as a dot
MARKER_SLOT_PX = 2 * MARKER_R + 1

STATE_COLOURS = {
    "pending": "#ffe066", "firing": "#ff8787", "acting": "#ffa94d", "verifying": "#74c0fc",
    "remediated": "#8ce99a", "escalated": "#da77f2", "recovering": "#63e6be",
    "rolled_back": "#c0a080", FAILED_STATE: "#e03131", "cooldown": "#ced4da",
}
UNKNOWN_STATE_COLOUR = "#fab005"
BAND_OPACITY = 0.28
BAND_EXACT_PX = 3.0           # narrower state intervals are summed per column of BUSY_COL_PX
BUSY_COL_PX = 2
GUIDES_UNDER = 40             # a lane with more marker slots than this draws no guide lines

# outcome -> (shape, colour, filled, glyph for legends)
MARKERS = {
    Outcome.APPLIED: ("up", "#2b8a3e", True, "▲"),
    Outcome.PLANNED: ("up", "#1971c2", False, "△"),
    Outcome.REVERTED: ("down", "#5f3dc4", True, "▼"),
    Outcome.WOULD_REVERT: ("down", "#5f3dc4", False, "▽"),
    Outcome.FAILED: ("x", "#c92a2a", False, "✕"),
    Outcome.REFUSED: ("x", "#868e96", False, "✕"),
    Outcome.ALERTED: ("diamond", "#e8590c", True, "◆"),
    Outcome.NOTIFIED: ("circle", "#e8590c", True, "●"),
    Outcome.NOOP: ("circle", "#868e96", False, "○"),
    Outcome.KEPT: ("square", "#495057", True, "■"),
    Outcome.ADOPTED: ("square", "#495057", False, "□"),
}
UNKNOWN_MARKER = ("circle", "#212529", False, "○")
VALUE_COLOUR, THRESHOLD_COLOUR, BASELINE_COLOUR = "#1c7ed6", "#e03131", "#495057"
TICK_STEPS = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200,
              10800, 21600, 43200, 86400)


def unit_of(series: Series) -> str:
    """The unit of what a condition evaluates, from the signal catalogue and the aggregation."""
    spec = CATALOGUE.get(series.signal)
    unit = spec.unit if spec else ""
    if series.agg == "count":
        return "samples"
    if series.agg == "change":
        return "CUSUM, spreads"
    if series.agg == "slope":
        return "/min" if unit in ("1", "") else f"{unit}/min"
    if series.agg == "rate":
        return "/s" if unit in ("1", "") else f"{unit}/s"
    return "count" if unit == "1" else unit


def time_step(span: float) -> float:
    return next((s for s in TICK_STEPS if span / s <= 8), TICK_STEPS[-1])


def nice_step(span: float, count: int) -> float:
    raw = span / max(1, count)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)


class YScale:
    """Linear from 0 (or the minimum) up, or log10 when positive values span two decades."""

    def __init__(self, values: list[float], top: float, height: float) -> None:
        self.top, self.height = top, height
        lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
        self.log = lo > 0 and hi / lo >= 100
        if self.log:
            self.lo, self.hi = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
            step = max(1, math.ceil((self.hi - self.lo) / 5))
            self.ticks = [10.0 ** e for e in range(self.lo, self.hi + 1, step)]
        else:
            lo = min(0.0, lo)
            hi = hi if hi > lo else lo + 1.0
            step = nice_step(hi - lo, 4)
            self.lo, self.hi = math.floor(lo / step) * step, math.ceil(hi * 1.05 / step) * step
            self.ticks = [self.lo + i * step for i in range(int(round((self.hi - self.lo) / step)) + 1)]

    def __call__(self, v: float) -> float:
        pos = (math.log10(v) if self.log else v) if (v > 0 or not self.log) else self.lo
        frac = (pos - self.lo) / (self.hi - self.lo)
        return self.top + self.height * (1.0 - min(1.0, max(0.0, frac)))


def _shape(kind: str, x: float, y: float, r: float = MARKER_R) -> str:
    if kind == "up":
        return f"M{x:.1f},{y - r:.1f}L{x + r:.1f},{y + r:.1f}L{x - r:.1f},{y + r:.1f}Z"
    if kind == "down":
        return f"M{x:.1f},{y + r:.1f}L{x + r:.1f},{y - r:.1f}L{x - r:.1f},{y - r:.1f}Z"
    if kind == "x":
        return f"M{x - r:.1f},{y - r:.1f}L{x + r:.1f},{y + r:.1f}M{x + r:.1f},{y - r:.1f}L{x - r:.1f},{y + r:.1f}"
    if kind == "diamond":
        return f"M{x:.1f},{y - r:.1f}L{x + r:.1f},{y:.1f}L{x:.1f},{y + r:.1f}L{x - r:.1f},{y:.1f}Z"
    if kind == "square":
        s = r * 0.85
        return f"M{x - s:.1f},{y - s:.1f}h{2 * s:.1f}v{2 * s:.1f}h{-2 * s:.1f}Z"
    return f"M{x - r:.1f},{y:.1f}a{r},{r} 0 1,0 {2 * r:.1f},0a{r},{r} 0 1,0 {-2 * r:.1f},0Z"


def marker_svg(outcome: str, x: float, y: float, tooltip: str, count: int = 1) -> str:
    shape, colour, filled, _ = MARKERS.get(outcome, UNKNOWN_MARKER)
    width = 2 if shape == "x" else 1.4
    fill = colour if filled else "#fff"
    return (f'<g class="marker" data-outcome="{escape(outcome)}" data-count="{count}"><title>{escape(tooltip)}</title>'
            f'<path d="{_shape(shape, x, y)}" fill="{fill if shape != "x" else "none"}" stroke="{colour}" '
            f'stroke-width="{width}"/></g>')


class Timeline:
    """Geometry and drawing of one track between ``t0`` and ``t1``."""

    def __init__(self, track: Track, t0: float, t1: float, clock: Clock, complete: bool = True) -> None:
        self.track, self.clock, self.complete = track, clock, complete
        self.t0, self.t1 = t0, (t1 if t1 > t0 else t0 + 1.0)
        self.until = min(track.retired_at, t1) if track.retired_at is not None else t1   # the last value holds to here
        self.series = list(track.series.values())
        self.panels_top = LANE_H + STRIP_H + 6
        self.bottom = self.panels_top + max(1, len(self.series)) * (TITLE_H + PANEL_H + PANEL_GAP)
        self.height = self.bottom + AXIS_H

    def x(self, t: float) -> float:
        return LEFT + (t - self.t0) / (self.t1 - self.t0) * PLOT_W

    def render(self) -> str:
        t = self.track
        label = f"{t.policy} / {t.rule} / {t.target}"
        parts = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {self.height}" '
                 f'width="100%" role="img" font-family="sans-serif" font-size="11">',
                 f"<title>{escape(label)}</title>",
                 f'<rect x="0" y="0" width="{WIDTH}" height="{self.height}" fill="#fff"/>']
        parts += self._bands()
        parts += self._time_axis()
        if self.series:
            for i, series in enumerate(self.series):
                parts += self._panel(series, self.panels_top + i * (TITLE_H + PANEL_H + PANEL_GAP))
        else:
            parts.append(f'<text x="{LEFT + PLOT_W / 2}" y="{self.panels_top + TITLE_H + PANEL_H / 2}" '
                         f'text-anchor="middle" fill="#868e96">no evaluations recorded</text>')
        parts += self._markers()
        if self.track.retired_at is not None:
            x = self.x(self.track.retired_at)
            parts.append(f'<g class="gone"><title>{escape(self.clock.at(self.track.retired_at))}: the target was '
                         f'retired (its series stopped)</title><line x1="{x:.1f}" y1="{LANE_H}" x2="{x:.1f}" '
                         f'y2="{self.bottom}" stroke="#868e96" stroke-width="1.5"/><text x="{x + 3:.1f}" '
                         f'y="{LANE_H + 11}" font-size="10" fill="#495057">gone</text></g>')
        if not self.complete:
            x = self.x(self.t1)
            parts.append(f'<g class="audit-stops"><title>the audit stops here (no end record)</title>'
                         f'<line x1="{x:.1f}" y1="{LANE_H}" x2="{x:.1f}" y2="{self.bottom}" stroke="#c92a2a" '
                         f'stroke-width="2"/><text x="{x - 4:.1f}" y="{self.bottom - 4}" text-anchor="end" '
                         f'fill="#c92a2a" font-weight="bold">audit stops</text></g>')
        parts.append("</svg>")
        return "".join(parts)

    def _state_intervals(self) -> list[tuple[str, float, float]]:
        transitions = sorted(self.track.transitions, key=lambda r: r["ts"])
        out = []
        for i, rec in enumerate(transitions):
            end = transitions[i + 1]["ts"] if i + 1 < len(transitions) else self.t1
            out.append((str(rec.get("to") or "?"), rec["ts"], end))
        return out

    def _band(self, state: str, xa: float, xb: float, tip: str, cls: str = "band") -> list[str]:
        colour = STATE_COLOURS.get(state, UNKNOWN_STATE_COLOUR)
        parts = [f'<g class="{cls}" data-state="{escape(state)}"><title>{escape(tip)}</title>'
                 f'<rect x="{xa:.1f}" y="{LANE_H}" width="{xb - xa:.1f}" height="{STRIP_H - 2}" fill="{colour}"/>'
                 f'<rect x="{xa:.1f}" y="{self.panels_top}" width="{xb - xa:.1f}" '
                 f'height="{self.bottom - self.panels_top}" fill="{colour}" opacity="{BAND_OPACITY}"/>']
        if xb - xa > 7 * len(state) + 6:
            parts.append(f'<text x="{xa + 3:.1f}" y="{LANE_H + 11}" font-size="10" fill="#212529">'
                         f'{escape(state)}</text>')
        parts.append("</g>")
        return parts

    def _bands(self) -> list[str]:
        """A band per state interval at least ``BAND_EXACT_PX`` wide; narrower ones (a
        rule that flaps) are summed per pixel column, which shows its busiest state."""
        parts = [f'<text x="{LEFT - 6}" y="{LANE_H + 12}" text-anchor="end" fill="#495057">state</text>',
                 f'<rect x="{LEFT}" y="{LANE_H}" width="{PLOT_W}" height="{STRIP_H - 2}" fill="#f8f9fa" '
                 'stroke="#dee2e6"/>']
        per_col = (self.t1 - self.t0) / PLOT_W * BUSY_COL_PX
        columns: dict[int, dict[str, float]] = {}
        for state, a, b in self._state_intervals():
            if state == "ok" or b <= a:
                continue
            xa, xb = self.x(a), self.x(b)
            if xb - xa >= BAND_EXACT_PX:
                parts += self._band(state, xa, xb, f"{state}: {self.clock.at(a)} – {self.clock.at(b)}")
                continue
            col = int((a - self.t0) / per_col)
            while a < b:
                edge = min(b, self.t0 + (col + 1) * per_col)
                cell = columns.setdefault(col, {})
                cell[state] = cell.get(state, 0.0) + (edge - a)
                a, col = edge, col + 1
        if columns:
            parts += self._busy(columns, per_col)
        return parts

    def _busy(self, columns: dict[int, dict[str, float]], per_col: float) -> list[str]:
        """Columns of short state intervals: the strip shows each column's busiest
        state (one path per state); the panels get one light band per busy stretch."""
        paths: dict[str, list[str]] = {}
        stretches: list[list[int]] = []
        for col in sorted(columns):
            state = max(columns[col].items(), key=lambda kv: kv[1])[0]
            paths.setdefault(state, []).append(f"M{LEFT + col * BUSY_COL_PX},{LANE_H}h{BUSY_COL_PX}v{STRIP_H - 2}"
                                               f"h-{BUSY_COL_PX}z")
            if stretches and stretches[-1][1] == col - 1:
                stretches[-1][1] = col
            else:
                stretches.append([col, col])
        parts = ['<g class="band busy">']
        for state, d in paths.items():
            colour = STATE_COLOURS.get(state, UNKNOWN_STATE_COLOUR)
            parts.append(f'<path data-state="{escape(state)}" d="{"".join(d)}" fill="{colour}">'
                         f"<title>{escape(state)} (many short intervals)</title></path>")
        for a, b in stretches:
            xa, xb = LEFT + a * BUSY_COL_PX, LEFT + (b + 1) * BUSY_COL_PX
            tip = (f"{self.clock.at(self.t0 + a * per_col)} – {self.clock.at(self.t0 + (b + 1) * per_col)}: many "
                   "short state changes (the strip above shows the busiest state of each moment)")
            parts.append(f'<rect x="{xa}" y="{self.panels_top}" width="{xb - xa}" '
                         f'height="{self.bottom - self.panels_top}" '
                         f'fill="#868e96" opacity="0.12"><title>{escape(tip)}</title></rect>')
        parts.append("</g>")
        return parts

    def _time_axis(self) -> list[str]:
        step = time_step(self.t1 - self.t0)
        parts = []
        first = math.ceil(self.t0 / step) * step
        for i in range(int((self.t1 - first) / step + 1e-9) + 1):
            tick = first + i * step
            x = self.x(tick)
            parts.append(f'<line x1="{x:.1f}" y1="{self.panels_top}" x2="{x:.1f}" y2="{self.bottom}" '
                         'stroke="#e9ecef"/>'
                         f'<text x="{x:.1f}" y="{self.bottom + 14}" text-anchor="middle" fill="#495057">'
                         f"{escape(self.clock.tick(tick, step))}</text>")
        parts.append(f'<text x="{LEFT + PLOT_W / 2}" y="{self.bottom + 32}" text-anchor="middle" '
                     f'fill="#212529">{escape(self.clock.axis_label(step))}</text>')
        return parts

    def _path(self, segments, y: YScale) -> str:
        """A step path in relative moves: each value holds until the next point, the
        last until its segment's end; x in whole pixels, y in tenths."""
        d = []
        for seg, end in segments:
            px = py = None
            for t, v in seg:
                nx, ny = round(self.x(t)), round(y(v), 1)
                if px is None:
                    d.append(f"M{nx},{ny:g}")
                else:
                    if nx != px:
                        d.append(f"h{nx - px}")
                    if ny != py:
                        d.append(f"v{round(ny - py, 1):g}")
                px, py = nx, ny
            ex = round(self.x(min(end, self.t1)))
            if ex != px:
                d.append(f"h{ex - px}")
        return "".join(d)

    def _panel(self, series: Series, top: float) -> list[str]:
        ts = list(series.ts)
        # a change condition's reference is in the signal's unit, its statistic and limit in spreads: not drawn
        lines = ("value", "threshold") if series.agg == "change" else ("value", "threshold", "baseline")
        columns = {name: list(getattr(series, name)) for name in lines}
        if any(b < a for a, b in zip(ts, ts[1:])):       # a wall clock that stepped back
            order = sorted(range(len(ts)), key=ts.__getitem__)
            ts = [ts[i] for i in order]
            columns = {name: [col[i] for i in order] for name, col in columns.items()}
        finite = [v for col in columns.values() for v in col if not math.isnan(v)]
        plot_top = top + TITLE_H
        y = YScale(finite, plot_top, PANEL_H)
        unit = unit_of(series)
        buckets = max(1, PLOT_W // BUCKET_PX)
        parts = [f'<text x="{LEFT}" y="{top + 13}" font-weight="bold" fill="#212529">{escape(series.condition)}</text>',
                 f'<rect x="{LEFT}" y="{plot_top}" width="{PLOT_W}" height="{PANEL_H}" fill="none" stroke="#adb5bd"/>',
                 f'<text transform="translate(14,{plot_top + PANEL_H / 2}) rotate(-90)" text-anchor="middle" '
                 f'fill="#495057">{escape(f"{series.agg} [{unit}]" if unit else series.agg)}'
                 f'{" (log)" if y.log else ""}</text>']
        for tick in y.ticks:
            py = y(tick)
            parts.append(f'<line x1="{LEFT}" y1="{py:.1f}" x2="{LEFT + PLOT_W}" y2="{py:.1f}" stroke="#f1f3f5"/>'
                         f'<text x="{LEFT - 6}" y="{py + 4:.1f}" text-anchor="end" fill="#495057">'
                         f"{escape(number(tick))}</text>")
        for name, colour, dash, width in (("baseline", BASELINE_COLOUR, "2 3", 1.2),
                                          ("threshold", THRESHOLD_COLOUR, "6 4", 1.5)):
            if name not in columns:
                continue
            ct, cv = change_points(ts, columns[name])
            d = self._path(step_segments(ct, cv, self.t0, self.t1, buckets, self.until), y)
            if d:
                parts.append(f'<path class="{name}" d="{d}" fill="none" stroke="{colour}" '
                             f'stroke-width="{width}" stroke-dasharray="{dash}"/>')
        for at in sorted(series.change_points):
            if self.t0 <= at <= self.t1:
                x = self.x(at)
                parts.append(f'<g class="change-point"><title>change point: {escape(self.clock.at(at))}</title>'
                             f'<line x1="{x:.1f}" y1="{plot_top}" x2="{x:.1f}" y2="{plot_top + PANEL_H}" '
                             f'stroke="{THRESHOLD_COLOUR}" stroke-width="1.2"/>'
                             f'<text x="{x + 3:.1f}" y="{plot_top + 11}" fill="{THRESHOLD_COLOUR}">change</text></g>')
        values = columns["value"]
        d = self._path(step_segments(ts, values, self.t0, self.t1, buckets, self.until), y)
        if d:
            parts.append(f'<path class="value" d="{d}" fill="none" stroke="{VALUE_COLOUR}" stroke-width="1.6"/>')
            if len(ts) < DOTS_UNDER:
                dots = "".join(f'<circle cx="{self.x(t):.1f}" cy="{y(v):.1f}" r="2"/>'
                               for t, v in zip(ts, values) if not math.isnan(v))
                parts.append(f'<g class="evals" fill="{VALUE_COLOUR}">{dots}</g>')
        else:
            parts.append(f'<text x="{LEFT + PLOT_W / 2}" y="{plot_top + PANEL_H / 2}" text-anchor="middle" '
                         'fill="#868e96">no data</text>')
        return parts

    def _markers(self) -> list[str]:
        """One marker per outcome and slot of ``MARKER_SLOT_PX`` pixels (its tooltip says how many and when)."""
        parts = [f'<text x="{LEFT - 6}" y="{LANE_ROWS[1] + 4}" text-anchor="end" fill="#495057">actions</text>',
                 f'<line x1="{LEFT}" y1="{LANE_H - 2}" x2="{LEFT + PLOT_W}" y2="{LANE_H - 2}" stroke="#dee2e6"/>']
        slots: dict[tuple[int, str], list[dict]] = {}
        for rec in sorted(self.track.actions, key=lambda r: r["ts"]):
            outcome = str(rec.get("outcome") or "?")
            slot = int((self.x(rec["ts"]) - LEFT) // MARKER_SLOT_PX)
            slots.setdefault((slot, outcome), []).append(rec)
        row_end = [-math.inf] * len(LANE_ROWS)
        guides, lines = set(), []
        for (_, outcome), recs in sorted(slots.items(), key=lambda kv: kv[1][0]["ts"]):
            x = self.x(recs[0]["ts"])
            row = next((i for i, end in enumerate(row_end) if x - end >= 2 * MARKER_R + 1),
                       min(range(len(row_end)), key=row_end.__getitem__))
            row_end[row] = x
            colour = MARKERS.get(outcome, UNKNOWN_MARKER)[1]
            if len(slots) <= GUIDES_UNDER and (round(x), colour) not in guides:
                guides.add((round(x), colour))
                lines.append(f'<line x1="{x:.1f}" y1="{LANE_H}" x2="{x:.1f}" y2="{self.bottom}" '
                             f'stroke="{colour}" stroke-dasharray="2 3" opacity="0.5"/>')
            parts.append(marker_svg(outcome, x, LANE_ROWS[row], self._tooltip(recs, outcome), len(recs)))
        return lines[::-1] + parts

    def _tooltip(self, recs: list[dict], outcome: str) -> str:
        rec = recs[0]
        step = "?" if rec.get("step") is None else rec["step"]
        if len(recs) > 1:
            return (f"{self.clock.at(rec['ts'])} – {self.clock.at(recs[-1]['ts'])}: {len(recs)}x "
                    f"{rec.get('actuator') or '?'} {outcome}")
        else:
            lines = [f"{self.clock.at(rec['ts'])}: {rec.get('actuator') or '?'} (step {step}) {outcome}"]
        if rec.get("summary"):
            lines.append(str(rec["summary"]))
        if rec.get("error"):
            lines.append(f"error: {rec['error']}")
        return "\n".join(lines)


def render_timeline(track: Track, t0: float, t1: float, clock: Clock, complete: bool = True) -> str:
    """The SVG of one track; ``complete=False`` marks where an unfinished audit stops."""
    return Timeline(track, t0, t1, clock, complete).render()
