"""**Timelines**, the HTML page's charts, as data: which targets get a chart, in what order, with what caption.

The targets that did something are drawn, the most important first (by the
worst status of their incidents, then by activity), until ``Detail.charts``
charts or ``Detail.chart_bytes`` of SVG; the targets that never fired are
counted per run, or drawn folded away with ``--full``. Each chart is a caption
(policy / rule, target, final state, the rule as written) and the SVG of
``timeline_svg.render_timeline``, which escapes every text it draws.

Example::

    section = timelines(audit, summary, incidents, specs, clock, Detail.DEFAULT)
    section.runs[0].charts[0].svg     # Markup('<svg class="timeline" ...')
    section.runs[0].quiet_count       # targets that never fired: counted, not drawn

Overhead: one SVG per chart, O(plot width) per drawn condition.
"""
from __future__ import annotations

from dataclasses import dataclass

from markupsafe import Markup

from .audit import Audit
from .detail import Detail
from .fmt import Clock, Part, code, name_of, says
from .incidents import IncidentLog, status_rank
from .rules import RuleSpec, when_text
from .timeline_svg import BASELINE_COLOUR, MARKERS, STATE_COLOURS, THRESHOLD_COLOUR, VALUE_COLOUR, render_timeline

CAPTION_BYTES = 600           # what a chart's caption adds to its SVG, for the page's share (``chart_bytes``)


@dataclass
class Chart:
    run: int
    name: str                 # policy / rule
    target: str
    state: str
    info: list[list[Part]]    # the rule as written: when, then, verify, rollback, file
    svg: Markup


@dataclass
class RunCharts:
    head: str                 # empty when the audit holds one run
    charts: list[Chart]
    more: list[Part]          # the targets that did something beyond the page's share
    quiet: list[Chart]        # with --full: the targets that never fired, folded away
    quiet_count: int
    quiet_text: list[Part]    # the fold's summary with --full, else why they are not drawn
    evaluated: bool


@dataclass
class Timelines:
    states: list[tuple[str, str]]                 # (state, colour)
    markers: list[tuple[str, str, str]]           # (outcome, colour, glyph)
    lines: list[tuple[str, str, str]]             # (what, colour, CSS border style)
    runs: list[RunCharts]


def rule_info(spec: RuleSpec | None) -> list[list[Part]]:
    if spec is None:
        return []
    bits = []
    if spec.when is not None:
        bits.append(says("when ", code(when_text(spec.when))))
    elif spec.conditions:
        parts = says("conditions ")
        for i, condition in enumerate(spec.conditions):
            parts += says(*(["; "] if i else []), code(condition))
        bits.append(parts + says(" ", ("muted", "(how they combine is not recorded)")))
    if spec.actions:
        parts = says("then ")
        for i, action in enumerate(spec.actions):
            parts += says(*([" → "] if i else []), code(action))
        bits.append(parts)
    if spec.verify:
        bits.append(says("verify ", code(spec.verify)))
    if spec.rollback:
        bits.append(says("rollback ", code(spec.rollback)))
    if spec.file:
        bits.append(says(("muted", spec.file)))
    return bits


def chart_order(rows: list[dict], incidents: IncidentLog) -> list[dict]:
    """Targets that did something, most important first: by the worst status of their incidents, then activity."""
    worst: dict[tuple, float] = {}
    for shelf in incidents.kept.values():
        for i in shelf:
            key = (i["run"], i["policy"], i["rule"], i["target"])
            worst[key] = min(worst.get(key, 99), status_rank(i["status"]))
    for (run, policy, rule, status), group in incidents.groups.items():
        for target in group["targets"]:
            key = (run, policy, rule, target)
            worst[key] = min(worst.get(key, 99), status_rank(status) + 0.5)
    return sorted((r for r in rows if r["active"]),
                  key=lambda r: (worst.get((r["run"], r["policy"], r["rule"], r["target"]), 98),
                                 -sum(r["actions"].values()), -r["transitions"]))


def timelines(audit: Audit, summary: dict, incidents: IncidentLog, specs: dict, clock: Clock,
              detail: Detail) -> Timelines:
    several = len(audit.runs) > 1
    used = 0
    runs = []
    for run in audit.runs:
        rows = [r for r in summary["rules"] if r["run"] == run.index]

        def chart(row: dict) -> Chart:
            track = run.tracks[(row["policy"], row["rule"], row["target"])]
            return Chart(run.index, f"{name_of(row['policy'])} / {name_of(row['rule'])}", str(row["target"]),
                         str(row["final_state"]), rule_info(specs.get((run.index, row["policy"], row["rule"]))),
                         Markup(render_timeline(track, run.first_ts, run.last_ts, clock, run.complete)))

        active = chart_order(rows, incidents)
        drawn = []
        for row in active if detail.charts is None else active[:detail.charts]:
            one = chart(row)
            size = len(one.svg) + CAPTION_BYTES
            if detail.chart_bytes is not None and drawn and used + size > detail.chart_bytes:
                break
            drawn.append(one)
            used += size
        more = (says(f"{len(active) - len(drawn)} more target(s) did something; ",
                     code("reflexarc report --full"), " draws them.") if len(active) > len(drawn) else [])
        quiet = [r for r in rows if not r["active"]]
        quiet_text = (says(f"{len(quiet):,} target(s) that never fired") if detail.quiet_charts
                      else says(f"{len(quiet):,} target(s) that never fired are not drawn; ",
                                code("reflexarc report --full"), " draws them."))
        runs.append(RunCharts(f"Run {run.index}" if several else "", drawn, more,
                              [chart(r) for r in quiet] if detail.quiet_charts else [], len(quiet), quiet_text,
                              bool(rows)))
    return Timelines(list(STATE_COLOURS.items()), [(str(o), colour, glyph) for o, (_, colour, _, glyph)
                                                   in MARKERS.items()],
                     [("value (holds until the next evaluation)", VALUE_COLOUR, "solid"),
                      ("threshold", THRESHOLD_COLOUR, "dashed"), ("baseline", BASELINE_COLOUR, "dotted")], runs)
