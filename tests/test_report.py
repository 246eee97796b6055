"""Audit reports: HTML structure and escaping, dry-run section, summary numbers shared by
JSON/Markdown/terminal, crashed and malformed trails, and downsampling of big trails.
(Live-style trails, several runs in one file, incidents and the browser's view:
tests/test_report_live.py.)"""
from __future__ import annotations

import json
import math
import os
import random
import re
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest

from reflexarc.controller.report import Audit, format_summary_table, load_audit, summarize, write_report
from reflexarc.controller.report.downsample import change_points, m4
from reflexarc.controller.report.fmt import diff_lines
from reflexarc.controller.report.timeline_svg import BUCKET_PX, PLOT_W

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "audit"
DRY_OUTCOMES = ("planned", "alerted", "would-revert")


def raw_records(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


class Page(HTMLParser):
    """Checks that every element is closed in order and collects what the tests look at."""

    VOID = {"meta", "br", "img", "input", "hr", "link", "col", "area", "base", "wbr", "source"}

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.tags: Counter = Counter()
        self.svgs: list[dict] = []
        self.dry_rows: list[list[str]] = []
        self.cards: dict[str, str] = {}
        self.ids: set[str] = set()
        self._svg_title = False
        self._dry_row = False
        self._card = None
        self.feed(text)
        self.close()
        assert not self.stack, f"unclosed elements: {self.stack}"

    def handle_starttag(self, tag, attrs):
        self._open(tag, dict(attrs))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self._open(tag, dict(attrs))

    def _open(self, tag, attrs):
        self.tags[tag] += 1
        cls = attrs.get("class") or ""
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "svg" and "timeline" in cls.split():
            self.svgs.append({"title": None, "markers": [], "threshold_d": [], "value_d": []})
        elif tag == "title" and self.svgs and self.stack and self.stack[-1] == "svg":
            self._svg_title = True
        elif tag == "g" and cls == "marker":
            self.svgs[-1]["markers"].append((attrs["data-outcome"], int(attrs["data-count"])))
        elif tag == "path" and cls in ("threshold", "value") and self.svgs:
            self.svgs[-1][f"{cls}_d"].append(attrs["d"])
        elif tag == "tr" and cls == "dry-run-item":
            self.dry_rows.append([])
            self._dry_row = True
        elif tag == "td" and self._dry_row:
            self.dry_rows[-1].append("")
        elif tag == "div" and cls == "card":
            self._card = attrs["data-count"]

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1] if self.stack else None}>"
        self.stack.pop()
        if tag == "tr":
            self._dry_row = False
        elif tag == "title":
            self._svg_title = False

    def handle_data(self, data):
        if self._svg_title and self.svgs[-1]["title"] is None:
            self.svgs[-1]["title"] = data
        if self._dry_row and self.dry_rows[-1]:
            self.dry_rows[-1][-1] += data
        if self._card and data.strip():
            self.cards[self._card] = data.strip()
            self._card = None


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = {}
    for name in ("enforce", "dry_run", "crashed"):
        for full in (False, True):
            paths = write_report(FIXTURES / f"{name}.jsonl", tmp_path_factory.mktemp(name), full=full)
            key = name + ("_full" if full else "")
            out[key] = {kind: path.read_text(encoding="utf-8") for kind, path in paths.items()}
            out[key]["paths"] = paths
    return out


def action_keys(records: list[dict]) -> Counter:
    return Counter((r["policy"], r["rule"], r["target"]) for r in records if r["kind"] == "action")


def marker_counts(svg: dict) -> int:
    return sum(n for _, n in svg["markers"])


@pytest.mark.parametrize("name", ["enforce", "dry_run", "crashed"])
def test_html_draws_the_targets_that_acted_and_a_marker_per_action(reports, name):
    """By default only the targets that did something get a chart (the others are
    counted); ``full`` draws every target. Every action is on its chart's lane."""
    records = raw_records(FIXTURES / f"{name}.jsonl")
    keys = {(r["policy"], r["rule"], r["target"]) for r in records if r["kind"] in ("eval", "transition", "action")}
    active = {(r["policy"], r["rule"], r["target"]) for r in records if r["kind"] in ("transition", "action", "limit")}
    for variant, drawn in ((name, active), (name + "_full", keys)):
        page = Page(reports[variant]["html"])
        assert sorted(svg["title"] for svg in page.svgs) == sorted(" / ".join(k) for k in drawn)
        assert page.tags["script"] == 0 and page.tags["link"] == 0
        per_key = action_keys(records)
        for svg in page.svgs:
            key = tuple(svg["title"].split(" / "))
            assert marker_counts(svg) == per_key.get(key, 0), key
        outcomes = Counter()
        for svg in page.svgs:
            for outcome, n in svg["markers"]:
                outcomes[outcome] += n
        assert outcomes == Counter(r["outcome"] for r in records if r["kind"] == "action")
    quiet = len(keys - active)
    html = reports[name]["html"]
    if quiet:
        assert f'class="muted quiet-charts" data-count="{quiet}"' in html
        assert f"{quiet} target(s) that never fired</summary>" in reports[name + "_full"]["html"]


def test_dry_run_section_lists_exactly_the_held_back_actions(reports):
    records = raw_records(FIXTURES / "dry_run.jsonl")
    expected = [(r["actuator"], r["outcome"], r["target"]) for r in records
                if r["kind"] == "action" and r["outcome"] in DRY_OUTCOMES]
    assert len(expected) == 7
    page = Page(reports["dry_run"]["html"])
    # cells: time, policy / rule, target, action, outcome, params, change
    listed = [(row[3].split(" (step")[0], row[4], row[2]) for row in page.dry_rows]
    assert listed == expected
    assert "dry-run-nothing" not in page.ids
    md = reports["dry_run"]["md"]
    section = md.split("## What dry-run would have changed")[1].split("\n## ")[0]
    assert len(re.findall(r"^- `", section, flags=re.M)) == len(expected)


def test_dry_run_section_says_nothing_when_enforcing(reports):
    page = Page(reports["enforce"]["html"])
    assert page.dry_rows == []
    assert "dry-run-nothing" in page.ids
    section = reports["enforce"]["md"].split("## What dry-run would have changed")[1].split("\n## ")[0]
    assert section.strip() == "nothing"


def rows_by_target(summary: dict) -> dict:
    return {(r["policy"], r["target"]): r for r in summary["rules"]}


def test_enforce_summary_numbers():
    summary = summarize(raw_records(FIXTURES / "enforce.jsonl"))
    assert summary["complete"] and summary["warnings"] == []
    assert summary["modes"] == ["enforce"] and not summary["wall_clock"]
    assert summary["counts"]["transitions"] == 13
    assert summary["counts"]["actions"] == {"applied": 2, "notified": 1, "reverted": 1}
    assert summary["counts"]["limits"] == {"cooldown": 3}
    rows = rows_by_target(summary)
    numa = rows[("dataloader-numa", "job=llama,pid=4242")]
    assert (numa["final_state"], numa["firings"], numa["actions"]) == ("remediated", 1, {"applied": 1})
    assert numa["first_action_s"] == pytest.approx(10.0) and numa["remediated_s"] == pytest.approx(34.0)
    healthy = rows[("dataloader-numa", "job=llama,pid=4243")]
    assert (healthy["final_state"], healthy["firings"], healthy["actions"]) == ("ok", 0, {})
    assert healthy["verdict"].startswith("never fired")
    net = rows[("allreduce-congestion", "*")]
    assert net["actions"] == {"applied": 1, "notified": 1, "reverted": 1}
    assert net["limits"] == {"cooldown": 3} and net["remediated_s"] is None and net["final_state"] == "ok"


def test_dry_run_summary_counts_would_have_acted():
    summary = summarize(load_audit(FIXTURES / "dry_run.jsonl"))
    rows = rows_by_target(summary)
    assert rows[("dataloader-numa", "job=llama,pid=4242")]["would_have_acted"] == 4
    assert rows[("allreduce-congestion", "*")]["would_have_acted"] == 1
    assert summary["counts"]["would_have_acted"] == 5
    assert summary["counts"]["actions"].get("applied", 0) == 0
    assert summary["modes"] == ["dry-run", "alert-only"]


@pytest.mark.parametrize("name", ["enforce", "dry_run", "crashed"])
def test_json_and_markdown_agree_with_summary(reports, name):
    summary = summarize(load_audit(FIXTURES / f"{name}.jsonl"))
    assert summarize(raw_records(FIXTURES / f"{name}.jsonl"))["rules"] == summary["rules"]
    data = json.loads(reports[name]["json"])
    assert data["summary"] == json.loads(json.dumps(summary))
    assert len(data["decisions"]) == summary["counts"]["transitions"] + sum(summary["counts"]["actions"].values())
    assert [d["outcome"] for d in data["dry_run"]] == [d["outcome"] for d in data["decisions"]
                                                       if d.get("outcome") in DRY_OUTCOMES]
    md_rows = [line for line in reports[name]["md"].split("#### Summary")[1].split("\n## ")[0].splitlines()
               if line.startswith("| ") and not line.startswith("| Policy")]
    active = [r for r in summary["rules"] if r["active"]]
    assert len(md_rows) == len(active) > 0
    for line, row in zip(md_rows, active):
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert cells[:6] == [row["policy"], row["rule"], row["target"], row["mode"], row["final_state"],
                             str(row["firings"])]
        assert cells[7] == str(row["would_have_acted"]) and cells[10] == row["verdict"]
    page = Page(reports[name]["html"])
    counts = summary["counts"]
    assert page.cards["transitions"] == str(counts["transitions"])
    # one vocabulary: a card per outcome the audit holds, under the audit's name; none for the others
    outcome_cards = {k: v for k, v in page.cards.items()
                     if k not in ("transitions", "held back", "targets", "gone", "errors")}
    assert outcome_cards == {o: str(n) for o, n in counts["actions"].items()}


def test_crashed_audit_reports_and_says_so(reports):
    audit = load_audit(FIXTURES / "crashed.jsonl")
    assert not audit.complete and audit.malformed_count == 3
    summary = summarize(audit)
    assert summary["wall_clock"] and summary["source"] == "live"
    assert any("without an `end` record" in w for w in summary["warnings"])
    assert any(w.startswith("3 malformed") for w in summary["warnings"])
    row = summary["rules"][0]
    assert row["final_state"] == "verifying" and row["actions"] == {"applied": 1}
    assert "when the audit stops" in row["verdict"]
    html = reports["crashed"]["html"]
    assert "incomplete: a run has no end record" in html and 'class="audit-stops"' in html
    assert "09:00:10" in html   # wall-clock axis (UTC)
    assert "**incomplete: a run has no end record**" in reports["crashed"]["md"]
    assert "class=\"audit-stops\"" not in reports["enforce"]["html"]


def test_summary_of_the_records_view_rereads_the_file():
    audit = load_audit(FIXTURES / "crashed.jsonl")
    assert summarize(audit.records) == summarize(audit)
    assert summarize(audit.records)["counts"]["malformed"] == 3


def test_report_of_a_simulated_run(tmp_path):
    from reflexarc.controller.runtime.simulate import run_scenario
    result = run_scenario("numa-remote-worker", out_dir=tmp_path, report=True)
    records = raw_records(result.audit_path)
    assert records[-1]["kind"] == "end"
    page = Page(result.reports["html"].read_text())
    per_key = action_keys(records)
    assert per_key, "the scenario is expected to act"
    assert {tuple(svg["title"].split(" / ")): marker_counts(svg) for svg in page.svgs if svg["markers"]} == per_key
    held_back = [r["outcome"] for r in records if r["kind"] == "action" and r["outcome"] in DRY_OUTCOMES]
    assert [row[4] for row in page.dry_rows] == held_back
    summary = json.loads(result.reports["json"].read_text())["summary"]
    assert summary["complete"] and summary["warnings"] == []
    assert summary == json.loads(json.dumps(summarize(result.records)))


def test_threshold_line_follows_the_baseline(reports):
    page = Page(reports["enforce"]["html"])
    svg = next(s for s in page.svgs if s["title"].endswith("pid=4242"))
    relative = svg["threshold_d"][0]          # 3x baseline: moves as the baseline is learned
    absolute = svg["threshold_d"][1]          # > 0.3: flat
    moves = lambda d: [float(v) for v in re.findall(r"v(-?[\d.]+)", d)]  # noqa: E731 - vertical steps
    assert any(moves(relative))
    assert not any(moves(absolute))


def test_audit_text_is_escaped(tmp_path):
    evil = "<script>alert('x')</script>"
    records = [
        {"ts": 0, "kind": "run", "source": "simulation:escape", "mode_override": None, "started_at": "now",
         "policies": [{"name": evil, "mode": "enforce", "file": "p.yaml",
                       "rules": [{"name": "r&d", "conditions": ["last(x) > 1"], "actions": ["log"],
                                  "verify": None, "rollback": evil}]}], "scenario": None},
        {"ts": 1, "kind": "eval", "policy": evil, "rule": "r&d", "target": "job=<marquee>", "target_labels": {},
         "state": "ok", "result": True, "values": [{"condition": "last(x) > 1 <img src=x onerror=alert(1)>", "signal": "x", "agg": "last",
                                                     "value": 2, "threshold": 1, "baseline": None, "ok": True}]},
        {"ts": 1, "kind": "transition", "policy": evil, "rule": "r&d", "target": "job=<marquee>", "mode": "enforce",
         "from": "ok", "to": "firing", "trigger": evil, "evidence": [], "note": evil},
        {"ts": 2, "kind": "action", "policy": evil, "rule": "r&d", "target": "job=<marquee>", "mode": "dry-run",
         "step": 0, "actuator": "log", "params": {"message": evil}, "outcome": "planned",
         "change": {"before": None, "after": evil, "summary": evil}, "journal_id": None, "error": None},
        {"ts": 3, "kind": "end", "summary": {"transitions": 1, "actions": {"planned": 1}, "would_have_acted": 1,
                                             "applied": 0, "reverted": 0}},
    ]
    audit_path = tmp_path / "audit.jsonl"
    audit_path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    paths = write_report(audit_path, tmp_path / "out")
    html = paths["html"].read_text()
    page = Page(html)
    assert page.tags["script"] == page.tags["marquee"] == page.tags["img"] == 0
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert len(page.dry_rows) == 1 and evil in page.dry_rows[0][-1]
    md = paths["md"].read_text()
    assert "<script>" not in md.split("```")[0]        # escaped outside code blocks
    assert json.loads(paths["json"].read_text())["summary"]["rules"][0]["policy"] == evil


def test_every_text_of_the_audit_reaches_the_markdown_escaped(tmp_path):
    """Each text field the pages show, set to markup: outside code spans and fences the Markdown
    has no tag a renderer would run, no ``|`` that would split a table cell; the HTML has none either."""
    evil = "<img src=x onerror=alert(1)>|&amp;"
    where = {"policy": evil, "rule": evil + "r", "target": evil + "t", "mode": "dry-run"}
    records = [
        {"ts": 0, "kind": "run", "source": evil, "mode_override": None, "started_at": evil,
         "policies": [{"name": evil, "mode": "dry-run", "file": evil,
                       "rules": [{"name": evil + "r", "conditions": [evil], "actions": [evil], "verify": evil,
                                  "rollback": evil}]}]},
        {**where, "ts": 1, "kind": "transition", "from": "ok", "to": "pending", "trigger": evil,
         "evidence": [{"condition": evil, "value": 2, "threshold": 1, "op": evil, "ok": True}], "note": evil},
        {**where, "ts": 2, "kind": "transition", "from": "pending", "to": "firing", "trigger": evil,
         "evidence": [{"condition": evil, "value": 2, "threshold": 1, "op": evil, "ok": True}], "note": evil},
        {**where, "ts": 3, "kind": "action", "step": 0, "actuator": evil, "params": {evil: evil},
         "outcome": "planned", "change": {"before": evil, "after": evil + "2", "summary": evil},
         "error": evil, "note": evil, "journal_id": None},
        {**where, "ts": 4, "kind": "limit", "reason": evil},
        {"ts": 5, "kind": evil},
    ]
    audit_path = tmp_path / "audit.jsonl"
    audit_path.write_text("\n".join(json.dumps(r) for r in records) + "\nnot json " + evil + "\n")
    paths = write_report(audit_path, tmp_path / "out")
    md = paths["md"].read_text()
    prose = re.sub(r"^ *(```+).*?^ *\1$", "", md, flags=re.M | re.S)       # fenced blocks
    prose = re.sub(r"(`+).+?\1", "", prose)                                # code spans
    assert evil.split("|")[0] in md.replace("&lt;", "<") and "<img" not in prose and "&amp;amp;" in prose
    for line in prose.splitlines():
        if line.startswith("|"):
            assert "img" not in line or "\\|&amp;amp;" in line, line        # a cell's | is escaped
    page = Page(paths["html"].read_text())
    assert page.tags["img"] == page.tags["script"] == 0


def test_a_rules_rollback_reads_as_written():
    from reflexarc.controller.report.rules import as_written
    assert as_written("on ['shutdown', 'ttl'], ttl 3600s") == "on shutdown, ttl; ttl 3600s"
    assert as_written("on []") == "on none" and as_written("on [], ttl 300s") == "on none; ttl 300s"
    assert as_written("never") == "never"


def test_malformed_records_are_counted_not_fatal():
    audit = Audit.from_records([
        {"ts": 0, "kind": "run", "source": "live", "policies": []},
        ["not", "an", "object"],
        {"kind": "eval", "policy": "p", "rule": "r"},                        # no ts
        {"ts": "soon", "kind": "eval", "policy": "p", "rule": "r"},          # ts not a number
        {"ts": 1, "policy": "p", "rule": "r"},                               # no kind
        {"ts": 2, "kind": "action", "outcome": "applied"},                   # no policy/rule
        {"ts": 3, "kind": "heartbeat"},                                      # unknown kind: ignored apart
        {"ts": 4, "kind": "eval", "policy": "p", "rule": "r", "target": "*", "values": "junk"},
        {"ts": 5, "kind": "action", "policy": "p", "rule": "r", "change": "junk", "params": None},
    ])
    assert audit.malformed_count == 5 and [m["line"] for m in audit.malformed] == [2, 3, 4, 5, 6]
    assert audit.unknown_kinds == {"heartbeat": 1}
    summary = summarize(audit)
    assert summary["counts"]["malformed"] == 5 and summary["counts"]["actions"] == {"?": 1}
    assert any("unknown kind 'heartbeat'" in w for w in summary["warnings"])
    assert summary["rules"][0]["evals"] == 1


def big_audit(path: Path, evals: int) -> int:
    """A 1-target trail with ``evals`` evaluations every 0.1 s, a spike, and a few actions."""
    rng = random.Random(5)
    cond = 'p99(dataloader_read_latency_us{quantile="0.99"}[30s]) > 3x baseline'
    spike_at = evals // 2
    actions = 0
    with path.open("w") as fh:
        fh.write(json.dumps({"ts": 0, "kind": "run", "source": "simulation:big", "mode_override": None,
                             "started_at": "x", "policies": [], "scenario": None}) + "\n")
        for i in range(evals):
            t = i * 0.1
            value = 9000.0 if i == spike_at else 50 + rng.gauss(0, 5)
            baseline = 50 + (i // 1000) * 0.5
            item = {"condition": cond, "signal": "dataloader_read_latency_us", "agg": "p99", "window": 30,
                    "op": ">", "value": value, "threshold": 3 * baseline, "baseline": baseline,
                    "ok": value > 3 * baseline}
            fh.write(json.dumps({"ts": t, "kind": "eval", "policy": "big", "rule": "r", "target": "pid=1",
                                 "target_labels": {"pid": "1"}, "state": "ok", "result": item["ok"],
                                 "values": [item]}) + "\n")
            if i % 20000 == 10:
                fh.write(json.dumps({"ts": t, "kind": "action", "policy": "big", "rule": "r", "target": "pid=1",
                                     "mode": "dry-run", "step": 0, "actuator": "affinity", "params": {"node": 0},
                                     "outcome": "planned", "change": {"before": [0, 1], "after": [0],
                                                                      "summary": "pin"}}) + "\n")
                actions += 1
    return actions


def test_big_audit_is_downsampled(tmp_path):
    audit_path = tmp_path / "audit.jsonl"
    actions = big_audit(audit_path, 100_000)
    paths = write_report(audit_path, tmp_path / "out")
    size = paths["html"].stat().st_size
    assert size < 2_000_000, size
    page = Page(paths["html"].read_text())
    (svg,) = page.svgs
    assert marker_counts(svg) == actions
    points = len(re.findall(r"[Mv]", svg["value_d"][0]))
    assert 100 < points <= 4 * PLOT_W // BUCKET_PX
    summary = json.loads(paths["json"].read_text())["summary"]
    assert summary["counts"]["evals"] == 100_000 and summary["rules"][0]["would_have_acted"] == actions


def test_m4_keeps_extremes_first_last_and_gaps():
    ts = [i * 0.01 for i in range(10_000)]
    values = [math.sin(i / 50) for i in range(10_000)]
    values[1234] = 7.0
    values[8765] = -7.0
    values[5000] = math.nan
    segments = m4(ts, values, 0.0, ts[-1], 100)
    assert len(segments) == 2
    kept = [p for seg in segments for p in seg]
    assert len(kept) <= 4 * 100
    assert (ts[1234], 7.0) in kept and (ts[8765], -7.0) in kept
    assert kept[0] == (ts[0], values[0]) and kept[-1] == (ts[-1], values[-1])
    assert segments[0][-1][0] < ts[5000] < segments[1][0][0]
    assert all(a[0] <= b[0] for seg in segments for a, b in zip(seg, seg[1:]))


def test_change_points_keep_runs_and_end():
    assert change_points([0, 1, 2, 3, 4], [5, 5, 6, 6, 6]) == ([0, 2, 4], [5, 6, 6])
    assert change_points([], []) == ([], [])


def test_diff_lines_structured_and_scalar():
    lines = diff_lines({"cpus": [0, 1], "pid": 7}, {"cpus": [0], "pid": 7})
    assert lines == [" {", '-  "cpus": [0, 1],', '+  "cpus": [0],', '   "pid": 7', " }"]
    long = diff_lines({"cpus": list(range(64))}, {"cpus": list(range(32))})
    assert not any(line.startswith(("---", "+++", "@@")) for line in long)
    assert json.loads("\n".join(line[1:] for line in long if not line.startswith("+"))) == {"cpus": list(range(64))}
    assert json.loads("\n".join(line[1:] for line in long if not line.startswith("-"))) == {"cpus": list(range(32))}
    assert diff_lines("0", "1") == ["-0", "+1"]
    assert diff_lines(None, {"a": 1}) == ["+{", '+  "a": 1', "+}"]


def test_summary_table_is_aligned():
    summary = summarize(load_audit(FIXTURES / "enforce.jsonl"))
    lines = format_summary_table(summary).splitlines()
    active = [r for r in summary["rules"] if r["active"]]
    header, rows = lines[0], lines[1:1 + len(active)]
    for column, field in (("MODE", "mode"), ("STATE", "final_state"), ("TARGET", "target")):
        start = header.index(column)
        for line, row in zip(rows, active):
            assert line[start:].startswith(row[field]), (column, line)
    fired = header.index("FIRED") + len("FIRED")
    assert [line[fired - 1] for line in rows] == [str(r["firings"])[-1] for r in active]
    rest = lines[1 + len(active):]
    assert rest[0] == ("dataloader-numa / repin-workers: 1 target never fired (151 evaluations), "
                       "e.g. job=llama,pid=4243")
    assert rest[1] == "simulation:numa_and_congestion: 13 transitions; applied 2, notified 1, reverted 1; 3 held back"


def test_end_summary_disagreement_is_reported():
    records = raw_records(FIXTURES / "enforce.jsonl")
    records[-1] = dict(records[-1], summary=dict(records[-1]["summary"], transitions=99))
    warnings = summarize(records)["warnings"]
    assert warnings == ["the controller's end summary says transitions=99, the records show 13"]


@pytest.mark.slow
def test_a_200k_record_audit_is_reported_whole(tmp_path):
    """A trail of 200,000 records, most of them decisions, streams into report.json
    complete and in order; the pages show their capped share and say where the
    rest is. (Its time is measured by bench/report_scale.py, not asserted here.)"""
    from fixtures.audit.synthetic import write_audit
    from reflexarc.controller.report import write_audit_report
    from reflexarc.controller.report.detail import Detail
    HTML_ROWS = MD_ROWS = Detail.DEFAULT.decision_rows          # both pages render one view (view.py)
    path = tmp_path / "audit.jsonl"
    truth = write_audit(path, 200_000, events_every=1)
    assert len(path.read_text().splitlines()) == 200_000
    paths, summary = write_audit_report(load_audit(path), tmp_path / "out")
    counts = summary["counts"]
    assert (counts["records"], counts["evals"], counts["transitions"]) == (200_000, truth["evals"],
                                                                           truth["transitions"])
    assert counts["actions"] == truth["actions"] and counts["limits"] == {"cooldown": truth["limits"]}
    assert summary["complete"] and summary["warnings"] == []
    assert {r["target"]: r["final_state"] for r in summary["rules"]} == truth["final_states"]
    assert sum(r["would_have_acted"] for r in summary["rules"]) == truth["actions"]["planned"]

    sections, current = {}, None          # report.json: one decision per line
    for line in paths["json"].read_text().splitlines():
        if line.startswith('"') and line.endswith("["):
            current = sections.setdefault(line.split('"')[1], [])
        elif line.startswith("]"):
            current = None
        elif current is not None:
            current.append(json.loads(line.rstrip(",")))
    decisions, dry_run = sections["decisions"], sections["dry_run"]
    assert len(decisions) == truth["transitions"] + sum(truth["actions"].values())
    assert [d["ts"] for d in decisions] == sorted(d["ts"] for d in decisions)
    assert Counter(d["outcome"] for d in decisions if d["kind"] == "action") == truth["actions"]
    assert all(d["cause"] == "firing -> acting" and d["evidence"] for d in decisions if d.get("outcome") == "planned")
    assert len(dry_run) == truth["dry_run"] and dry_run == [d for d in decisions if d.get("outcome") in DRY_OUTCOMES]
    assert all(d["diff"] for d in dry_run), "every held-back change has its diff"

    incidents = sections["incidents"]
    assert len(incidents) == truth["actions"]["planned"]          # one per cycle: fired, planned, would-revert
    assert {i["status"] for i in incidents} == {"planned"}
    assert all(i["rollback"][0]["outcome"] == "would-revert" for i in incidents)

    html = paths["html"].read_text()
    assert len(html.encode()) < 1_000_000                         # at a glance: capped, not every target
    charts = html.count('class="timeline"')                       # the page's share for charts decides how many
    assert 1 <= charts <= Detail.DEFAULT.charts
    assert f"{len(truth['final_states']) - charts} more target(s) did something" in html
    shown = Detail.DEFAULT.incidents_per_rule                      # a flapping rule does not fill the page
    assert html.count('<article class="incident') == shown
    assert f"{len(incidents) - shown:,} more incidents" in html
    assert html.count('<tr class="dry-run-item"') == Detail.DEFAULT.dry_run_rows
    assert f"{len(decisions) - HTML_ROWS} more rows are in report.json" in html
    assert f"{truth['dry_run'] - Detail.DEFAULT.dry_run_rows} more are in report.json" in html
    md = paths["md"].read_text()
    assert f"_{len(decisions) - MD_ROWS} more rows are in report.json._" in md


def test_both_pages_show_the_same_share_of_a_capped_table(tmp_path):
    """The view decides once how many rows fit the page's share; HTML and Markdown show those
    rows and both say how many more report.json has."""
    import dataclasses
    import io
    from reflexarc.controller.report.detail import Detail
    from reflexarc.controller.report.pages import render_html, render_markdown
    from reflexarc.controller.report.view import page
    from reflexarc.controller.report.writer import write_json
    audit = load_audit(FIXTURES / "dry_run.jsonl")
    summary = summarize(audit)
    detail = dataclasses.replace(Detail.DEFAULT, table_bytes=6_000)
    log, incidents = write_json(io.StringIO(), audit, summary, detail)
    view = page(audit, summary, log, incidents, detail)
    shown = len(view.decisions.rows)
    assert 1 <= shown < log.total
    html, md = render_html(view), render_markdown(view)
    assert html.split('<table class="decisions">')[1].split("</table>")[0].count("<tr class=") == shown
    section = md.split("## Decisions")[1].split("\n## ")[0]
    assert len([line for line in section.splitlines() if line.startswith("| ") and "---" not in line]) == shown + 1
    more = f"{log.total - shown} more rows are in report.json."
    assert more in html and f"_{more}_" in md


def test_decisions_of_a_trail_out_of_time_order_are_sorted(tmp_path):
    """A wall clock that steps back puts records out of order; the decision log is still in time order."""
    def transition(ts, to):
        return {"ts": ts, "kind": "transition", "policy": "p", "rule": "r", "target": "*", "from": "x", "to": to,
                "trigger": "t", "evidence": []}
    records = [{"ts": 0, "kind": "run", "source": "live", "policies": []}, transition(10, "pending"),
               transition(20, "firing"), transition(15, "stepped-back"), transition(20, "cooldown")]
    path = tmp_path / "audit.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    audit = load_audit(path)
    assert not audit.events_in_order
    data = json.loads(write_report(path, tmp_path / "out")["json"].read_text())
    assert [(d["ts"], d["to"]) for d in data["decisions"]] == [(10, "pending"), (15, "stepped-back"),
                                                               (20, "firing"), (20, "cooldown")]


def test_an_overlong_line_is_counted_and_the_next_one_read(tmp_path, monkeypatch):
    from reflexarc.controller.report import audit as audit_module
    monkeypatch.setattr(audit_module, "MAX_LINE_CHARS", 1000)
    path = tmp_path / "audit.jsonl"
    path.write_text(json.dumps({"ts": 0, "kind": "run", "source": "live", "policies": []}) + "\n"
                    + json.dumps({"ts": 1, "kind": "error", "policy": "p", "rule": "r", "error": "x" * 5000}) + "\n"
                    + json.dumps({"ts": 2, "kind": "end", "summary": {}}) + "\n")
    audit = load_audit(path)
    assert audit.malformed == [{"line": 2, "reason": "longer than 1000 characters", "text": ""}]
    assert audit.complete and audit.record_count == 2


def test_a_fifo_among_the_rotated_files_is_refused_not_read(tmp_path):
    from reflexarc.core.input_files import InputFileError
    path = tmp_path / "audit.jsonl"
    path.write_text(json.dumps({"ts": 0, "kind": "run", "source": "live", "policies": []}) + "\n")
    os.mkfifo(tmp_path / "audit.jsonl.1")
    with pytest.raises(InputFileError, match=r"audit\.jsonl\.1: is a FIFO, not a regular file"):
        load_audit(path)


@pytest.mark.slow
def test_report_scale_bench_quick_checks_its_reports(tmp_path):
    """bench/report_scale.py runs and checks each report it times (the times are its output, not asserted)."""
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "report_scale.json"
    r = subprocess.run([sys.executable, str(root / "bench" / "report_scale.py"), "--quick", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=root)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(out.read_text())
    assert [row["shape"] for row in result["runs"]] == ["steady", "flapping", "wide"]
    for row in result["runs"]:
        assert row["now"]["exit"] == 0 and row["now"]["problems"] == [], row
        assert row["now"]["peak_rss_mb"] > 0 and row["records"] == 20_000
