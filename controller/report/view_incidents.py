"""**What happened**, the pages' first section, as plain data: one card per incident.

A card holds what both pages show of one incident (``incidents.py``): policy /
rule, target and mode; when (breach, firing, each action, the verify result and
the rollback, as offsets from the breach); why (the rule's ``when`` as written,
``all`` / ``any`` nested, each condition with the value that fired it); the
actions with their summaries, outcomes and diffs; the limits that held it back;
the verify result with its values; the rollback. ``happened`` adds the count of
incidents by status, a card list per run, the incidents beyond the cap counted
per rule and status, and the breaches that cleared untouched.

Example::

    section = happened(summary, incidents, specs, clock, Detail.DEFAULT)     # of simulate rdma-qp-slow
    card = section.runs[0].cards[1]
    card.when          # [Step(at='3m31.0s', what='breach'), Step(at='+15.0 s', what='fired'), ...]
    card.why.nodes[0]  # Node(op='all', children=[Node(text='mean(step_time_ms{}[60s]) > 2x baseline', ...), ...])

Overhead: linear in the incidents shown, each capped (``incidents.MAX_STEPS``, ``MAX_ACTIONS``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from reflexarc.core.outcomes import Outcome

from ..policy.model import change_words
from .detail import Detail
from .fmt import Clock, Part, code, duration, name_of, number, plural, says, span
from .incidents import BAD, DRY, GOOD, IncidentLog
from .rules import RuleSpec

MAX_WHEN_ITEMS = 8            # steps of an incident's "when" line
STEP_WORDS = {"pending": "breach", "firing": "fired", "rolled_back": "rolled back"}
QUIET_STEPS = ("acting", "verifying", "cooldown", "ok")    # implied by the actions and results around them
CHANGED = (Outcome.APPLIED, Outcome.PLANNED)               # a change made, or one dry-run would have made
UNKNOWN_COMBINATION = "conditions (the audit does not say how they combine):"


@dataclass
class Node:
    """A condition with its value (``op`` empty), or ``all`` / ``any`` of its children."""
    op: str = ""
    children: list[Node] = field(default_factory=list)
    text: str = ""
    mark: str = "nodata"      # holds, fails, nodata
    glyph: str = "–"
    value: str = ""           # '499'; empty: ``missing`` says why
    missing: str = ""         # 'not evaluated', 'no data'
    against: str = ""         # '> 50 (baseline 180)'


@dataclass
class Expression:
    caption: str              # empty, or why the conditions are listed without a combinator
    nodes: list[Node]

    def lines(self) -> list[tuple[int, Node]]:
        """(depth, node) top-down, for a page that indents instead of nesting; under a caption from depth 1."""
        out = []

        def walk(node: Node, depth: int) -> None:
            out.append((depth, node))
            for child in node.children:
                walk(child, depth + 1)

        for node in self.nodes:
            walk(node, 1 if self.caption else 0)
        return out


@dataclass
class Step:
    at: str                   # the first one absolute ('3m47.0s'), the others after the breach ('+10.0 s')
    what: str


@dataclass
class Action:
    actuator: str
    step: str                 # '' when the audit has none
    outcome: str
    summary: str
    error: str
    note: str
    diff: list[str]
    diff_more: str            # '… 12 more lines in report.json'


@dataclass
class Verify:
    missing: str              # why there is no result; empty when there is one
    ok: bool = False
    word: str = ""            # 'verified', 'verify failed'
    rest: str = ""            # ' at 4m10.0s (+34.0 s)', ' at 4m10.0s: note'
    expression: Expression | None = None


@dataclass
class Undo:
    outcome: str
    actuator: str
    at: str
    why: str
    summary: str              # empty when an action above already said it


@dataclass
class Card:
    number: int
    run: int
    status: str
    tone: str                 # good, bad, dry, busy
    policy: str
    rule: str
    target: str
    mode: str
    onset: str
    when: list[Step]          # empty when the audit holds no step of it: ``onset`` is all there is
    when_more: str
    why: Expression | None    # the rule's condition, for an incident that began with a firing
    why_text: str             # otherwise: what the audit says of the action
    actions: list[Action]
    more_actions: str
    held_back: str
    verify: Verify | None     # None: nothing to verify (no action, or only notifications)
    rollback: list[Undo]
    in_place: str
    no_rollback: str          # a change without any rollback record


@dataclass
class StatusCount:
    status: str
    tone: str
    count: str


@dataclass
class RunCards:
    index: int
    head: str                 # empty when the audit holds one run
    cards: list[Card]
    nothing: str


@dataclass
class MoreIncidents:
    run: int
    name: str
    status: str
    tone: str
    more: str
    targets: str
    first: str
    last: str


@dataclass
class Happened:
    statuses: list[StatusCount]
    quiet: str
    runs: list[RunCards]
    more_intro: list[Part]
    more: list[MoreIncidents]
    cleared: str


def tone_of(status: str | None) -> str:
    if status in GOOD:
        return "good"
    if status in BAD:
        return "bad"
    if status in DRY:
        return "dry"
    return "busy"


def _node(text: str, item: dict | None) -> Node:
    mark, glyph = {True: ("holds", "✓"), False: ("fails", "✗")}.get(item.get("ok") if item else None,
                                                                      ("nodata", "–"))
    node = Node(text=text, mark=mark, glyph=glyph)
    if item is None:
        node.missing = "not evaluated"
    elif item.get("agg") == "change":
        node.against = change_words(item, number)
    elif item.get("value") is None:
        node.missing = "no data"
    else:
        node.value = number(item["value"])
        against = []
        if item.get("threshold") is not None:
            against.append(f"{item.get('op') or 'vs'} {number(item['threshold'])}")
        if item.get("baseline") is not None:
            against.append(f"(baseline {number(item['baseline'])})")
        node.against = " ".join(against)
    return node


def _tree(tree, evidence: dict[str, dict]) -> Node:
    if isinstance(tree, str):
        return _node(tree, evidence.get(tree))
    (op, items), = tree.items()
    return Node(op=op, children=[_tree(item, evidence) for item in items])


def _leaf_texts(tree) -> set[str]:
    if isinstance(tree, str):
        return {tree}
    (_, items), = tree.items()
    return set().union(*(_leaf_texts(i) for i in items))


def expression(tree, items: list[dict]) -> Expression:
    """The expression as written (nested ``all`` / ``any``), each condition with its value from ``items``."""
    evidence = {str(i.get("condition")): i for i in items or () if isinstance(i, dict)}
    if tree is None and len(evidence) == 1:
        tree = next(iter(evidence))
    if tree is None:
        return Expression(UNKNOWN_COMBINATION, [_node(text, item) for text, item in evidence.items()])
    written = _leaf_texts(tree)
    extra = [_node(text, item) for text, item in evidence.items() if text not in written]
    return Expression("", [_tree(tree, evidence), *extra])


def when_events(incident: dict) -> list[tuple[float, str]]:
    """(ts, what) of an incident's milestones: breach, firing, each action, the verify result, rollback."""
    events = [(s["ts"], s.get("seq", 0), "verify failed" if (s["from"], s["to"]) == ("verifying", "recovering")
               else STEP_WORDS.get(s["to"], s["to"])) for s in incident["steps"] if s["to"] not in QUIET_STEPS]
    events += [(a["ts"], a.get("seq", 0), f"{a['actuator']} {a['outcome']}")
               for a in incident["actions"] + incident["rollback"]]
    return [(ts, what) for ts, _, what in sorted(events, key=lambda ev: (ev[0], ev[1]))]


def verify_missing(incident: dict, spec: RuleSpec | None) -> str:
    """Why an incident has no verify result."""
    reached = {s["to"] for s in incident["steps"]}
    if spec is not None and not spec.verify:
        return "the rule has no verify condition"
    if "verifying" in reached:
        return "still verifying when the run ended"
    if incident.get("mode") in ("dry-run", "alert-only") and "remediated" in reached:
        return f"not verified: {incident['mode']} changed nothing to verify"
    if "remediated" in reached:
        return "remediated without a verify step"
    return "not verified"


def _verify(incident: dict, spec: RuleSpec | None, clock: Clock) -> Verify | None:
    if incident["fired"] is None or all(a["outcome"] == Outcome.NOTIFIED for a in incident["actions"]):
        return None
    v = incident["verify"]
    if v is None:
        return Verify(verify_missing(incident, spec))
    rest = f" at {clock.at(v['ts'])}"
    rest += f" (+{duration(v['ts'] - incident['onset'])})" if v["ok"] else ""
    rest += f": {v['note']}" if v.get("note") else ""
    return Verify("", v["ok"], "verified" if v["ok"] else "verify failed", rest,
                  expression(spec.verify_when if spec is not None else None, v.get("evidence") or []))


def _action(a: dict) -> Action:
    more = a["diff_lines"] - len(a["diff"]) if a.get("diff") else 0
    return Action(a["actuator"] or "?", "" if a.get("step") is None else str(a["step"]), str(a["outcome"]),
                  a.get("summary") or "", a.get("error") or "", a.get("note") or "", list(a.get("diff") or ()),
                  f"… {more} more lines in report.json" if more > 0 else "")


def _rollback(incident: dict, spec: RuleSpec | None, clock: Clock) -> tuple[list[Undo], str, str]:
    said = {a.get("summary") for a in incident["actions"]}
    undone = [Undo(str(a["outcome"]), a["actuator"] or "", clock.at(a["ts"]), a.get("why") or "",
                   a["summary"] if a.get("summary") and a["summary"] not in said else "")
              for a in incident["rollback"]]
    in_place = (f"the change was still in place when the audit ends (journal {', '.join(incident['in_place'])})"
                if incident.get("in_place") else "")
    none = ""
    if not undone and not in_place and any(a["outcome"] in CHANGED for a in incident["actions"]):
        none = "none recorded" + (f" (rollback: {spec.rollback})" if spec is not None and spec.rollback else "")
    return undone, in_place, none


def _when(incident: dict, clock: Clock) -> tuple[list[Step], str]:
    onset = incident["onset"]
    events = when_events(incident)
    if not events:
        return [], ""
    shown = events[:MAX_WHEN_ITEMS]
    steps = [Step(clock.at(shown[0][0]), shown[0][1])]
    steps += [Step(f"+{duration(ts - onset)}", what) for ts, what in shown[1:]]
    more = len(events) - len(shown)
    return steps, f"… {more} more" if more > 0 else ""


def card(incident: dict, specs: dict, clock: Clock, number_: int) -> Card:
    spec = specs.get((incident["run"], incident["policy"], incident["rule"]))
    why, why_text = None, ""
    if incident["fired"] is not None:
        why = expression(spec.when if spec else None, incident["evidence"])
    else:
        why_text = incident.get("note") or "an action outside a breach of this rule"
        if incident.get("made_in"):
            why_text += f" (made in run {incident['made_in']['run']} at {clock.at(incident['made_in']['ts'])})"
    when, when_more = _when(incident, clock)
    undone, in_place, no_rollback = _rollback(incident, spec, clock)
    more = incident["more_actions"]
    return Card(number_, incident["run"], str(incident["status"]), tone_of(incident["status"]),
                name_of(incident["policy"]), name_of(incident["rule"]), str(incident["target"]),
                incident.get("mode") or "", clock.at(incident["onset"]), when, when_more, why, why_text,
                [_action(a) for a in incident["actions"]],
                f"… {more} more actions (report.json)" if more else "",
                ", ".join(f"{n}x {r}" for r, n in incident["held_back"].items()),
                _verify(incident, spec, clock), undone, in_place, no_rollback)


def run_head(run: dict, clock: Clock) -> str:
    return (f"Run {run['index']} · {run['source']} · {', '.join(run['modes']) or '?'} · "
            f"{span(clock, run['start'], run['end'], run['duration'])}"
            + ("" if run["complete"] or not run["has_run_record"] else " · no end record"))


def happened(summary: dict, incidents: IncidentLog, specs: dict, clock: Clock, detail: Detail) -> Happened:
    shown = incidents.shown(detail.incidents, detail.incidents_per_rule)
    several = len(summary["runs"]) > 1
    quiet = sum(1 for r in summary["rules"] if not r["active"])
    statuses = [StatusCount(str(s), tone_of(s), f"{n:,}") for s, n in incidents.counts().items()]
    runs, n = [], 0
    for run in summary["runs"]:
        cards = []
        for incident in (i for i in shown if i["run"] == run["index"]):
            n += 1
            cards.append(card(incident, specs, clock, n))
        nothing = ""
        if not cards and not any(g["run"] == run["index"] for g in incidents.groups.values()):
            nothing = ("no rule fired" if not run["counts"]["active_targets"] else
                       "rules changed state but never acted or were held back") + (" in this run" if several else "")
            nothing += "."
        runs.append(RunCards(run["index"], run_head(run, clock) if several else "", cards, nothing))
    rest = incidents.not_shown(shown)
    intro = says(f"{sum(g['more'] for g in rest):,} more incidents, by rule and how they ended (all are in "
                 "report.json" + ("):" if detail.full else "; "))
    if not detail.full:
        intro += says(code("reflexarc report --full"), " shows more here):")
    more = [MoreIncidents(g["run"], f"{name_of(g['policy'])} / {name_of(g['rule'])}", str(g["status"]),
                          tone_of(g["status"]), f"{g['more']:,}", f"{g['targets']:,}", clock.at(g["first"]),
                          clock.at(g["last"])) for g in rest]
    cleared = incidents.cleared
    return Happened(statuses, f"{plural(quiet, 'target')} never fired" if quiet else "", runs, intro, more,
                    f"{cleared:,} breach{'es' if cleared != 1 else ''} cleared before the rule acted." if cleared
                    else "")
