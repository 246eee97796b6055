"""The report pages as one view model: every heading, table, row and sentence's data, decided once.

``page`` turns the analysis of an audit (``summary.py``, ``incidents.py``,
``decisions.py``, ``rules.py``) into plain data (dataclasses of strings,
numbers and lists) that ``pages.py`` renders twice, through
``templates/report.html.j2`` and ``templates/report.md.j2``. Read top-down, as
the pages are:

1. the header: source, runs, time span, records, status; problems with the
   file; what an operator did and what held enforcement;
2. **What happened** (``view_incidents.py``): one card per incident, the rest
   counted per rule and status;
3. **Runs**: per controller run in the file, its counts, warnings and reloads,
   one line per rule (the targets that never fired folded into a count) and
   the verdicts of the targets that did something;
4. what dry-run would have changed, 5. timelines (``view_charts.py``; the HTML
   page's charts), 6. the decision log, 7. limits hit, 8. lines that could not
   be read.

Sentences that mark up a word (a command, a condition) are lists of parts
(``fmt.says``) each page marks up its own way. Tables are capped by
``detail.Detail``: so many rows, and the dry-run list and the decision log at
about ``table_bytes`` of HTML each; report.json has everything.

Example::

    view = page(audit, summary, log, incidents)      # a filled DecisionLog and IncidentLog
    view.runs[0].counts[1]      # Count(key='applied', value='1', title='enforce: the change was made')
    view.decisions.rows[0].event_text   # 'ok → pending'

Overhead: linear in what the pages show: the capped tables and cards, one SVG
per chart; the targets that never fired cost a line per rule.
"""
from __future__ import annotations

from dataclasses import dataclass
from html import escape

from reflexarc.core.outcomes import Outcome

from .audit import Audit
from .decisions import DRY_RUN_OUTCOMES, DecisionLog, limit_groups
from .detail import Detail
from .fmt import Clock, Part, code, compact, duration, name_of, plural, pretty, says, span
from .incidents import FAILED_STATE, IncidentLog
from .rules import rule_specs, when_text
from .summary import OUTCOME_MEANING, counts_line, ordered_outcomes, quiet_groups, quiet_line
from .view_charts import Timelines, timelines
from .view_incidents import Happened, happened

GOOD_STATES = ("ok", "remediated")
BAD_STATES = (FAILED_STATE, "escalated", "rolled_back")
INLINE_PARAMS_CHARS = 60      # longer parameters are shown pretty-printed
ROW_MARKUP = 300              # HTML a table row adds to its texts, for the ``table_bytes`` share
LINE_MARKUP = 25              # and each of its diff lines


@dataclass
class Header:
    source: str
    runs: str                 # '1 run'
    span: str
    records: str              # '54 records (36 evaluations)'
    incomplete: tuple[str, str] | None   # (what, why) when a run has no end record
    warnings: list[str]
    hands: list[str]


@dataclass
class Count:
    key: str                  # transitions, an outcome, held back, targets, gone, errors
    value: str
    title: str


@dataclass
class RuleLine:
    name: str                 # policy / rule
    mode: str
    when: str
    targets: str              # '1 did something (below); 5 targets never fired (...)'
    evaluated: bool
    quiet: int


@dataclass
class Verdict:
    policy: str
    rule: str
    target: str
    mode: str
    state: str
    fired: str
    actions: str              # 'applied:1 reverted:1'
    would_act: str
    first_action: str
    remediated: str
    verdict: str
    tone: str                 # good, bad, busy, quiet


@dataclass
class RunView:
    index: int
    head: str
    counts: list[Count]
    counts_line: str          # the counts in one line, as the terminal prints them
    warnings: list[str]
    reloads: list[str]
    rules: list[RuleLine]
    verdicts: list[Verdict]
    verdicts_more: str


@dataclass
class Change:
    summary: str
    diff: list[str]
    before: str               # compact, for a table cell
    after: str


@dataclass
class Row:
    """A decision: a transition or an action, with its trigger, evidence and change."""
    kind: str
    run: int
    time: str
    name: str                 # policy / rule
    target: str
    from_state: str
    to_state: str
    actuator: str
    step: str
    params: str               # compact
    params_inline: bool       # short enough to show compact in the dry-run list
    params_pretty: str
    error: str
    note: str
    trigger: str
    evidence: list[str]
    mode: str
    outcome: str
    change: Change | None     # None for a transition, or an action without a change

    @property
    def change_text(self) -> str:
        if self.kind != "action":
            return ""
        if self.change is None:
            return "no change"
        return f"{self.change.summary}\n{self.change.before} → {self.change.after}"

    @property
    def action(self) -> str:
        """'affinity (step 0)', or the actuator alone when the audit has no step."""
        return self.actuator + (f" (step {self.step})" if self.step else "")

    @property
    def event_text(self) -> str:
        if self.kind == "transition":
            return f"{self.from_state} → {self.to_state}" + (f" ({self.note})" if self.note else "")
        return self.action + (f" error: {self.error}" if self.error else "") + (f" ({self.note})" if self.note else "")

    @property
    def evidence_text(self) -> str:
        return "\n".join(self.evidence)


@dataclass
class Table:
    intro: str
    rows: list
    more: str


@dataclass
class Problems:
    malformed: str
    lines: list[tuple[str, str, str]]            # (line, reason, text)
    unknown: list[list[Part]]


@dataclass
class Page:
    title: str
    several: bool             # more than one run: tables get a Run column
    header: Header
    happened: Happened
    runs_heading: str
    runs: list[RunView]
    dry_run: Table
    timelines: Timelines
    decisions: Table
    limits: Table
    problems: Problems | None


def _header(summary: dict, clock: Clock) -> Header:
    c = summary["counts"]
    n = len(summary["runs"])
    return Header(summary["source"], f"{n} run{'s' if n != 1 else ''}",
                  span(clock, summary["start"], summary["end"], summary["duration"]),
                  f"{c['records']:,} records ({c['evals']:,} evaluations)",
                  None if summary["complete"] else ("incomplete: a run has no end record",
                                                    "controller crashed or was killed"),
                  summary["file_warnings"], summary["hands"])


def _counts(c: dict) -> list[Count]:
    out = [Count("transitions", f"{c['transitions']:,}", "state changes of the rules")]
    out += [Count(str(o), f"{n:,}", OUTCOME_MEANING.get(o, "")) for o, n in ordered_outcomes(c["actions"])]
    held = sum(c["limits"].values())
    if held:
        out.append(Count("held back", f"{held:,}", "actions kept back by limits: "
                         + ", ".join(f"{n}x {r}" for r, n in c["limits"].items())))
    out.append(Count("targets", f"{c['targets']:,}", f"{c['active_targets']} did something"))
    if c["retired"]:
        out.append(Count("gone", f"{c['retired']:,}", "targets retired: their series stopped"))
    if c["errors"]:
        out.append(Count("errors", f"{c['errors']:,}", "rule runs that raised"))
    return out


def _rule_lines(rows: list[dict], run_index: int, specs: dict) -> list[RuleLine]:
    quiet = {(g["policy"], g["rule"]): g for g in quiet_groups(rows)}
    order = list(dict.fromkeys((r["policy"], r["rule"]) for r in rows))
    order += [k for k in (key[1:] for key in specs if key[0] == run_index) if k not in order]
    out = []
    for policy, rule in order:
        spec = specs.get((run_index, policy, rule))
        acted = sum(1 for r in rows if r["active"] and (r["policy"], r["rule"]) == (policy, rule))
        g = quiet.get((policy, rule))
        bits = ([f"{acted} did something (below)"] if acted else []) + ([quiet_line(g).split(": ", 1)[1]] if g else [])
        when = (when_text(spec.when) if spec and spec.when is not None
                else " ; ".join(spec.conditions) if spec else "")
        mode = spec.mode if spec else next((r["mode"] for r in rows if (r["policy"], r["rule"]) == (policy, rule)), "?")
        out.append(RuleLine(f"{name_of(policy)} / {name_of(rule)}", mode, when, "; ".join(bits) or "never evaluated",
                            bool(bits), g["targets"] if g else 0))
    return out


def _tone(row: dict) -> str:
    if row["actions"].get(Outcome.FAILED) or row["final_state"] in BAD_STATES:
        return "bad"
    if not row["active"]:
        return "quiet"
    if row["final_state"] in GOOD_STATES or row["remediated_s"] is not None:
        return "good"
    return "busy"


def _verdict(r: dict) -> Verdict:
    return Verdict(name_of(r["policy"]), name_of(r["rule"]), str(r["target"]), str(r["mode"]), str(r["final_state"]),
                   str(r["firings"]), " ".join(f"{k}:{v}" for k, v in ordered_outcomes(r["actions"])) or "-",
                   str(r["would_have_acted"]), duration(r["first_action_s"]), duration(r["remediated_s"]),
                   r["verdict"], _tone(r))


def _reload(reload: dict, clock: Clock) -> str:
    what = "; ".join(f"{k} {', '.join(reload[k])}" for k in ("added", "removed", "changed") if reload.get(k))
    return (f"policies reloaded at {clock.at(reload['ts'])} ({reload['reason']}): {reload['outcome']}"
            + (f": {what}" if what else ""))


def _run(run: dict, summary: dict, specs: dict, clock: Clock, several: bool, detail: Detail) -> RunView:
    head = (f"Run {run['index']} · " if several else "") + (
        f"{run['source']} · {', '.join(run['modes']) or '?'}" + (" (set by --mode)" if run["mode_override"] else "")
        + f" · {span(clock, run['start'], run['end'], run['duration'])} · "
        + ("complete" if run["complete"] else "no end record"))
    if run["started_at"]:
        head += f" · started {run['started_at']}"
    c = run["counts"]
    rows = [r for r in summary["rules"] if r["run"] == run["index"]]
    active = [r for r in rows if r["active"]]
    more = len(active) - detail.verdict_rows
    return RunView(run["index"], head, _counts(c),
                   f"{counts_line(c)} · {plural(c['targets'], 'target')} ({c['active_targets']:,} did something)",
                   run["warnings"], [_reload(r, clock) for r in run["reloads"]],
                   _rule_lines(rows, run["index"], specs), [_verdict(r) for r in active[:detail.verdict_rows]],
                   f"{more:,} more targets did something: report.json has their verdicts." if more > 0 else "")


def _change(r: dict) -> Change | None:
    if r["kind"] != "action" or not r.get("has_change"):
        return None
    return Change(r.get("summary") or "", list(r["diff"]), compact(r["before"], 80), compact(r["after"], 80))


def _row(r: dict) -> Row:
    action = r["kind"] == "action"
    params = r.get("params")
    return Row(str(r["kind"]), r["run"], r["time"], f"{name_of(r['policy'])} / {name_of(r['rule'])}",
               str(r["target"]), str(r.get("from") or ""), str(r.get("to") or ""), str(r.get("actuator") or ""),
               "" if r.get("step") is None else str(r["step"]), compact(params) if action else "",
               len(compact(params, limit=10_000)) <= INLINE_PARAMS_CHARS, pretty(params) if action else "",
               r.get("error") or "", r.get("note") or "", r.get("trigger") or "", list(r["evidence_text"]),
               r.get("mode") or "", str(r.get("outcome") or "") if action else "", _change(r))


def _weight(row: Row) -> int:
    """About how much of the HTML page ``row`` takes."""
    texts = (row.name, row.target, row.params, row.error, row.note, row.trigger, *row.evidence,
             *(row.change.diff if row.change else ()), row.change.summary if row.change else "")
    return ROW_MARKUP + sum(len(escape(t)) for t in texts) + LINE_MARKUP * len(row.change.diff if row.change else ())


def _within(rows: list[dict], cap: int, budget: int | None) -> list[Row]:
    """The first ``cap`` of ``rows`` that fit in ``budget`` characters of HTML (at least one)."""
    out, used = [], 0
    for r in rows[:cap]:
        row = _row(r)
        size = _weight(row)
        if budget is not None and out and used + size > budget:
            break
        out.append(row)
        used += size
    return out


def _dry_run(log: DecisionLog, detail: Detail) -> Table:
    rows = _within(log.dry_run, detail.dry_run_rows, detail.table_bytes)
    more = log.dry_run_total - len(rows)
    return Table(f"Actions held back by dry-run or alert-only mode ({', '.join(DRY_RUN_OUTCOMES)}): "
                 f"{log.dry_run_total}.", rows, f"{more} more are in report.json." if more > 0 else "")


def _decisions(log: DecisionLog, detail: Detail) -> Table:
    rows = _within(log.rows, detail.decision_rows, detail.table_bytes)
    more = log.total - len(rows)
    return Table(f"{log.total} transitions and actions; an action shows the trigger and evidence of the transition "
                 "that led to it.", rows, f"{more} more rows are in report.json." if more > 0 else "")


def _limits(audit: Audit, clock: Clock, detail: Detail) -> Table:
    groups = limit_groups(audit)
    rows = [dict(g, name=f"{g['policy']} / {g['rule']}", first=clock.at(g["first"]), last=clock.at(g["last"]))
            for g in groups[:detail.limit_rows]]
    more = len(groups) - detail.limit_rows
    return Table(f"{len(audit.limits)} action(s) held back.", rows,
                 f"{more} more are in report.json." if more > 0 else "")


def _problems(audit: Audit) -> Problems | None:
    if not audit.malformed_count and not audit.unknown_kinds:
        return None
    first = "; first examples:" if audit.malformed else "."
    return Problems(f"{audit.malformed_count} malformed line(s) skipped{first}",
                    [(str(m["line"]), str(m["reason"]), str(m["text"])) for m in audit.malformed],
                    [says(f"{n} record(s) of unknown kind ", code(kind), " ignored.")
                     for kind, n in sorted(audit.unknown_kinds.items())])


def page(audit: Audit, summary: dict, log: DecisionLog, incidents: IncidentLog,
         detail: Detail = Detail.DEFAULT) -> Page:
    clock = Clock(audit.wall_clock)
    specs = {(run.index, *key): spec for run in audit.runs for key, spec in rule_specs(run).items()}
    several = len(summary["runs"]) > 1
    return Page(f"reflexarc audit: {summary['source']}", several, _header(summary, clock),
                happened(summary, incidents, specs, clock, detail), "Runs" if several else "The run",
                [_run(run, summary, specs, clock, several, detail) for run in summary["runs"]],
                _dry_run(log, detail), timelines(audit, summary, incidents, specs, clock, detail),
                _decisions(log, detail), _limits(audit, clock, detail), _problems(audit))
