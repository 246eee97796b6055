"""One SVG picture per rule and target: conditions over time, states, actions.

From top to bottom: a lane of action markers (applied ▲, planned △, reverted ▼,
would-revert ▽, failed ✕, alerted ◆, notified ●, noop ○, kept ■, adopted □),
a strip naming the state the rule was in, then one panel per condition with the
evaluated value (solid), its threshold (dashed; it moves when the threshold is a
multiple of a learned baseline) and the baseline (dotted), over bands shaded by
state. Every marker and band has a ``<title>`` tooltip. Series are thinned with
M4 to at most 4 points per pixel column, so 100k evaluations stay a few kB.

Example::

    svg = render_timeline(audit.tracks[("numa", "repin", "pid=4242")],
                          t0=audit.first_ts, t1=audit.last_ts, clock=Clock(wall=False))

Overhead: linear in the track's evaluations; output O(width x conditions).
"""
from __future__ import annotations

import math
from html import escape

from ..signals import CATALOGUE
from .audit import Series, Track
from .downsample import change_points, m4
from .fmt import Clock, number

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

STATE_COLOURS = {
    "pending": "#ffe066", "firing": "#ff8787", "acting": "#ffa94d", "verifying": "#74c0fc",
    "remediated": "#8ce99a", "escalated": "#da77f2", "recovering": "#63e6be",
    "rolled_back": "#c0a080", "failed": "#e03131", "cooldown": "#ced4da",
}
UNKNOWN_STATE_COLOUR = "#fab005"
BAND_OPACITY = 0.28

# outcome -> (shape, colour, filled, glyph for legends)
MARKERS = {
    "applied": ("up", "#2b8a3e", True, "▲"),
    "planned": ("up", "#1971c2", False, "△"),
    "reverted": ("down", "#5f3dc4", True, "▼"),
    "would-revert": ("down", "#5f3dc4", False, "▽"),
    "failed": ("x", "#c92a2a", False, "✕"),
    "alerted": ("diamond", "#e8590c", True, "◆"),
    "notified": ("circle", "#e8590c", True, "●"),
    "noop": ("circle", "#868e96", False, "○"),
    "kept": ("square", "#495057", True, "■"),
    "adopted": ("square", "#495057", False, "□"),
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


def marker_svg(outcome: str, x: float, y: float, tooltip: str) -> str:
    shape, colour, filled, _ = MARKERS.get(outcome, UNKNOWN_MARKER)
    width = 2 if shape == "x" else 1.4
    fill = colour if filled else "#fff"
    return (f'<g class="marker" data-outcome="{escape(outcome)}"><title>{escape(tooltip)}</title>'
            f'<path d="{_shape(shape, x, y)}" fill="{fill if shape != "x" else "none"}" stroke="{colour}" '
            f'stroke-width="{width}"/></g>')


class Timeline:
    """Geometry and drawing of one track between ``t0`` and ``t1``."""

    def __init__(self, track: Track, t0: float, t1: float, clock: Clock, complete: bool = True) -> None:
        self.track, self.clock, self.complete = track, clock, complete
        self.t0, self.t1 = t0, (t1 if t1 > t0 else t0 + 1.0)
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

    def _bands(self) -> list[str]:
        parts = [f'<text x="{LEFT - 6}" y="{LANE_H + 12}" text-anchor="end" fill="#495057">state</text>',
                 f'<rect x="{LEFT}" y="{LANE_H}" width="{PLOT_W}" height="{STRIP_H - 2}" fill="#f8f9fa" '
                 'stroke="#dee2e6"/>']
        for state, a, b in self._state_intervals():
            if state == "ok":
                continue
            xa, xb = self.x(a), self.x(b)
            if xb - xa < 0.5:
                continue
            colour = STATE_COLOURS.get(state, UNKNOWN_STATE_COLOUR)
            tip = escape(f"{state}: {self.clock.at(a)} – {self.clock.at(b)}")
            parts.append(f'<g class="band" data-state="{escape(state)}"><title>{tip}</title>'
                         f'<rect x="{xa:.1f}" y="{LANE_H}" width="{xb - xa:.1f}" height="{STRIP_H - 2}" '
                         f'fill="{colour}"/>'
                         f'<rect x="{xa:.1f}" y="{self.panels_top}" width="{xb - xa:.1f}" '
                         f'height="{self.bottom - self.panels_top}" fill="{colour}" opacity="{BAND_OPACITY}"/>')
            if xb - xa > 7 * len(state) + 6:
                parts.append(f'<text x="{xa + 3:.1f}" y="{LANE_H + 11}" font-size="10" fill="#212529">'
                             f'{escape(state)}</text>')
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

    def _path(self, segments, y: YScale, step: bool) -> str:
        d = []
        for seg in segments:
            for i, (t, v) in enumerate(seg):
                px, py = self.x(t), y(v)
                if i == 0:
                    d.append(f"M{px:.1f},{py:.1f}")
                elif step:
                    d.append(f"H{px:.1f}V{py:.1f}")
                else:
                    d.append(f"L{px:.1f},{py:.1f}")
        return "".join(d)

    def _panel(self, series: Series, top: float) -> list[str]:
        order = sorted(range(len(series.ts)), key=series.ts.__getitem__)
        ts = [series.ts[i] for i in order]
        columns = {name: [getattr(series, name)[i] for i in order] for name in ("value", "threshold", "baseline")}
        finite = [v for col in columns.values() for v in col if not math.isnan(v)]
        plot_top = top + TITLE_H
        y = YScale(finite, plot_top, PANEL_H)
        unit = unit_of(series)
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
            ct, cv = change_points(ts, columns[name])
            d = self._path(m4(ct, cv, self.t0, self.t1, PLOT_W), y, step=True)
            if d:
                parts.append(f'<path class="{name}" d="{d}" fill="none" stroke="{colour}" '
                             f'stroke-width="{width}" stroke-dasharray="{dash}"/>')
        d = self._path(m4(ts, columns["value"], self.t0, self.t1, PLOT_W), y, step=False)
        if d:
            parts.append(f'<path class="value" d="{d}" fill="none" stroke="{VALUE_COLOUR}" stroke-width="1.6"/>')
        else:
            parts.append(f'<text x="{LEFT + PLOT_W / 2}" y="{plot_top + PANEL_H / 2}" text-anchor="middle" '
                         'fill="#868e96">no data</text>')
        return parts

    def _markers(self) -> list[str]:
        parts = [f'<text x="{LEFT - 6}" y="{LANE_ROWS[1] + 4}" text-anchor="end" fill="#495057">actions</text>',
                 f'<line x1="{LEFT}" y1="{LANE_H - 2}" x2="{LEFT + PLOT_W}" y2="{LANE_H - 2}" stroke="#dee2e6"/>']
        row_end = [-math.inf] * len(LANE_ROWS)
        guides = set()
        for rec in sorted(self.track.actions, key=lambda r: r["ts"]):
            outcome = str(rec.get("outcome") or "?")
            x = self.x(rec["ts"])
            row = next((i for i, end in enumerate(row_end) if x - end >= 2 * MARKER_R + 1),
                       min(range(len(row_end)), key=row_end.__getitem__))
            row_end[row] = x
            colour = MARKERS.get(outcome, UNKNOWN_MARKER)[1]
            if (round(x), colour) not in guides:
                guides.add((round(x), colour))
                parts.insert(0, f'<line x1="{x:.1f}" y1="{LANE_H}" x2="{x:.1f}" y2="{self.bottom}" '
                                f'stroke="{colour}" stroke-dasharray="2 3" opacity="0.5"/>')
            parts.append(marker_svg(outcome, x, LANE_ROWS[row], self._tooltip(rec, outcome)))
        return parts

    def _tooltip(self, rec: dict, outcome: str) -> str:
        change = rec.get("change") if isinstance(rec.get("change"), dict) else {}
        lines = [f"{self.clock.at(rec['ts'])}: {rec.get('actuator', '?')} (step {rec.get('step', '?')}) {outcome}"]
        if change.get("summary"):
            lines.append(str(change["summary"]))
        if rec.get("error"):
            lines.append(f"error: {rec['error']}")
        return "\n".join(lines)


def render_timeline(track: Track, t0: float, t1: float, clock: Clock, complete: bool = True) -> str:
    """The SVG of one track; ``complete=False`` marks where an unfinished audit stops."""
    return Timeline(track, t0, t1, clock, complete).render()
