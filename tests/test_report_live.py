"""Reports of live audits read at a glance: a node with a torch-default DataLoader
(new worker pids every epoch: hundreds of targets that never fire and then
exit), a few incidents, two controller runs in one file. What happened comes
first, in a real browser too; the quiet targets are one line per rule; each run
has its own summary; latencies count from the breach that led to the action;
``any``/``all`` are shown as written; charts are steps."""
from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from collections import Counter
from html import escape
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import require
from fixtures.audit.live_churn import MIGR, P99, REMOTE, write_live_churn
from reflexarc.controller.report import load_audit, summarize, write_report
from reflexarc.controller.report.audit import Audit
from reflexarc.controller.report.rules import when_text

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "audit"
WIDTH, HEIGHT = 1300, 1400


@pytest.fixture(scope="module")
def churn(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("churn")
    truth = write_live_churn(tmp / "audit.jsonl")
    paths = write_report(tmp / "audit.jsonl", tmp / "report")
    full = write_report(tmp / "audit.jsonl", tmp / "full", full=True)
    return {"truth": truth, "audit": tmp / "audit.jsonl", "paths": paths, "full": full,
            "html": paths["html"].read_text(), "md": paths["md"].read_text(),
            "json": json.loads(paths["json"].read_text())}


def test_each_run_has_its_own_summary_without_false_mismatches(churn):
    summary = churn["json"]["summary"]
    truth = churn["truth"]
    assert summary["warnings"] == [] and summary["complete"]
    assert [r["index"] for r in summary["runs"]] == [1, 2]
    for run, expected in zip(summary["runs"], truth["runs"]):
        end = expected["end_summary"]
        assert run["end_summary"] == end and run["warnings"] == []
        assert run["counts"]["transitions"] == end["transitions"]
        assert run["counts"]["actions"] == end["actions"]
        assert run["counts"]["retired"] == end["retired"]
    assert summary["counts"]["retired"] == truth["dead_pids"] > 300


def test_the_adopted_change_carries_the_policy_and_rule_that_made_it(churn):
    adopted = [d for d in churn["json"]["decisions"] if d.get("outcome") == "adopted"]
    assert len(adopted) == 1
    row = adopted[0]
    assert (row["run"], row["policy"], row["rule"], row["target"]) == (2, "nccl-congestion-dscp",
                                                                        "bulk-competes-with-collective", "*")
    assert row["attributed"] and row["note"] == "reconciled at start"
    assert "(not recorded)" not in churn["html"]


def test_latencies_count_from_the_breach_that_led_to_the_action(churn):
    """Trainer 4100 breached at 120 s and cleared; the breach that fired began at 150 s."""
    rows = {(r["run"], r["target"]): r for r in churn["json"]["summary"]["rules"]}
    repin = rows[(1, "trainer=4100")]
    t0 = churn["truth"]["t0"]
    assert repin["onset"] - t0 == pytest.approx(150.0)
    assert repin["first_action_s"] == pytest.approx(15.05) and repin["remediated_s"] == pytest.approx(40.0)
    starve = rows[(1, "job=llama")]
    assert starve["first_action_s"] == pytest.approx(10.1) and starve["remediated_s"] is None
    assert rows[(2, "trainer=4300")]["remediated_s"] == pytest.approx(37.0)


def test_incidents_say_what_happened_and_why(churn):
    t0 = churn["truth"]["t0"]
    incidents = churn["json"]["incidents"]
    got = sorted((i["run"], i["status"], i["policy"], i["target"], round(i["onset"] - t0, 2),
                  None if i["fired"] is None else round(i["fired"] - t0, 2)) for i in incidents)
    assert got == sorted(churn["truth"]["incidents"])
    by = {(i["run"], i["target"], i["status"]): i for i in incidents}
    starve = by[(1, "job=llama", "escalated")]
    assert [a["outcome"] for a in starve["actions"]] == ["applied", "notified"]
    assert starve["verify"]["ok"] is False and starve["verify"]["evidence"][0]["value"] == 40.0
    assert [(a["outcome"], a["why"]) for a in starve["rollback"]] == [("reverted", "not verified within 60s")]
    repin = by[(1, "trainer=4100", "remediated")]
    assert {e["condition"]: e["value"] for e in repin["evidence"]} == {P99: 250.0, MIGR: 40.0, REMOTE: 0.9}
    assert repin["verify"]["ok"] and [(a["outcome"], a["why"]) for a in repin["rollback"]] == [("reverted",
                                                                                               "at shutdown")]
    dscp = by[(1, "*", "remediated")]
    assert [(a["outcome"], a["why"]) for a in dscp["rollback"]] == [("adopted", "by run 2: reconciled at start")]
    assert by[(2, "*", "adopted")]["made_in"]["run"] == 1
    assert churn["json"]["incident_counts"] == {"1": {"escalated": 1, "remediated": 2},
                                                "2": {"remediated": 1, "adopted": 1}}


class Dom(HTMLParser):
    """The element tree of a page: tag, attributes, children, text."""

    VOID = {"meta", "br", "img", "input", "hr", "link", "col", "area", "base", "wbr", "source"}

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.root = {"tag": "#root", "attrs": {}, "children": [], "text": ""}
        self.stack = [self.root]
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        node = {"tag": tag, "attrs": dict(attrs), "children": [], "text": ""}
        self.stack[-1]["children"].append(node)
        if tag not in self.VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag, attrs):
        self.stack[-1]["children"].append({"tag": tag, "attrs": dict(attrs), "children": [], "text": ""})

    def handle_endtag(self, tag):
        while len(self.stack) > 1:
            if self.stack.pop()["tag"] == tag:
                break

    def handle_data(self, data):
        self.stack[-1]["children"].append({"tag": "#text", "attrs": {}, "children": [], "text": data})

    @staticmethod
    def text(node) -> str:
        return node["text"] + "".join(Dom.text(c) for c in node["children"])

    def find_all(self, pred, node=None):
        node = node or self.root
        for child in node["children"]:
            if pred(child):
                yield child
            yield from self.find_all(pred, child)


def has_class(name):
    return lambda n: name in (n["attrs"].get("class") or "").split()


def test_the_page_opens_with_what_happened_and_folds_the_quiet_targets(churn):
    dom = Dom(churn["html"])
    (main,) = dom.find_all(lambda n: n["tag"] == "main")
    sections = [c for c in main["children"] if c["tag"] == "section"]
    assert sections[0]["attrs"]["id"] == "what-happened"
    articles = list(dom.find_all(has_class("incident"), sections[0]))
    assert [(a["attrs"]["data-run"], a["attrs"]["data-status"]) for a in articles] == [
        ("1", "escalated"), ("1", "remediated"), ("1", "remediated"), ("2", "remediated"), ("2", "adopted")]
    quiet = [r for r in churn["json"]["summary"]["rules"] if not r["active"]]
    assert len(quiet) > 500
    # one line per rule for the targets that never fired, with their count
    lines = {(n["attrs"]["data-quiet"], Dom.text(n)) for n in dom.find_all(has_class("rule-line"))}
    per_rule = Counter((r["run"], r["rule"]) for r in quiet)
    assert {int(q) for q, _ in lines} == set(per_rule.values()) | {0}
    assert any(f"{per_rule[(1, 'worker-read-slow')]} targets never fired" in text for _, text in lines)
    # charts only for the targets that did something; the others are counted
    active = [r for r in churn["json"]["summary"]["rules"] if r["active"]]
    assert churn["html"].count('class="timeline"') == len(active) == 5
    counted = [int(n["attrs"]["data-count"]) for n in dom.find_all(has_class("quiet-charts"))]
    assert sum(counted) == len(quiet)
    full = churn["full"]["html"].read_text()
    assert full.count('class="timeline"') == len(active) + len(quiet)
    assert len(churn["html"].encode()) < 200_000 < len(full.encode())


def test_counts_use_the_outcome_names_of_the_audit(churn):
    dom = Dom(churn["html"])
    for run in dom.find_all(lambda n: n["tag"] == "div" and has_class("run")(n)):
        cards = {c["attrs"]["data-count"]: Dom.text(c["children"][0]) for c in dom.find_all(has_class("card"), run)}
        counts = churn["json"]["summary"]["runs"][int(run["attrs"]["data-run"]) - 1]["counts"]
        outcomes = {k: v for k, v in cards.items()
                    if k not in ("transitions", "held back", "targets", "gone", "errors")}
        assert outcomes == {o: str(n) for o, n in counts["actions"].items()}
    run1 = churn["json"]["summary"]["runs"][0]["counts"]["actions"]
    assert run1 == {"applied": 3, "notified": 1, "reverted": 2} and "alerted" not in run1
    verdicts = {r["target"]: r["verdict"] for r in churn["json"]["summary"]["rules"] if r["run"] == 1}
    assert verdicts["job=llama"] == "fired 1x; applied 1; notified 1; reverted 1; escalated at the end"


def test_any_and_all_are_shown_as_written(churn):
    dom = Dom(churn["html"])
    repin = next(a for a in dom.find_all(has_class("incident")) if "trainer=4100" in Dom.text(a))
    (expr,) = [n for n in dom.find_all(has_class("expr"), repin)][:1]
    top = [c for c in expr["children"] if c["tag"] == "ul"][0]["children"][0]
    assert Dom.text(top["children"][0]) == "all of"
    inner = [c for c in top["children"] if c["tag"] == "ul"][0]["children"]
    assert Dom.text(inner[0]).startswith("✓" + P99)
    assert Dom.text(inner[1]["children"][0]) == "any of"
    nested = [c for c in inner[1]["children"] if c["tag"] == "ul"][0]["children"]
    assert [Dom.text(n)[1:].startswith(c) for n, c in zip(nested, (MIGR, REMOTE))] == [True, True]
    assert escape(f"all({P99}, any({MIGR}, {REMOTE}))") in churn["html"]


def test_the_rule_comes_from_the_audit_or_else_the_policy_file(tmp_path):
    """A run record carries the rule's expression with its nesting; an older one
    lists the conditions flat, and the repository's policy file has the nesting."""
    import json
    from reflexarc.controller.runtime.simulate import run_scenario
    from reflexarc.controller.report.rules import rule_specs
    result = run_scenario("numa-remote-worker", out_dir=tmp_path, report=True)
    html = result.reports["html"].read_text()
    key = ("dataloader-numa-repin", "loader-p99-remote")
    assert rule_specs(load_audit(result.audit_path).runs[0])[key].when_from == "audit"
    older = tmp_path / "older.jsonl"
    with open(result.audit_path) as src, open(older, "w") as dst:
        for line in src:
            rec = json.loads(line)
            if rec.get("kind") == "run":
                for policy in rec["policies"]:
                    for rule in policy["rules"]:
                        rule.pop("when", None), rule.pop("verify_when", None)
            dst.write(json.dumps(rec) + "\n")
    spec = rule_specs(load_audit(older).runs[0])[key]
    assert spec.when_from == "policy file"
    text = when_text(spec.when)
    assert text.startswith("all(max(dataloader_read_latency_us") and ", any(delta(" in text
    assert '<span class="op">any of</span>' in html
    # where neither the audit nor the file says, the page does not guess a word
    enforce = write_report(FIXTURES / "enforce.jsonl", tmp_path / "enforce")["html"].read_text()
    assert "(the audit does not say how they combine)" in enforce and " and " not in re.sub(r"<[^>]+>", "", enforce
                                                                                             ).split("Timelines")[0]


def test_charts_are_steps_that_show_the_jump(churn):
    """Sparse evaluations: P99 was 60 until 118 s, then 250. A step holds 60 until the
    evaluation at 118 s and jumps there; no line slopes between two evaluations."""
    html = churn["html"]
    svg = next(s for s in re.findall(r'<svg class="timeline".*?</svg>', html, flags=re.S)
               if "<title>dataloader-numa-repin / loader-p99-remote / trainer=4100</title>" in s)
    values = re.findall(r'<path class="value" d="([^"]+)"', svg)
    assert len(values) == 4                       # 3 when conditions and the verify condition
    for d in values:
        assert re.fullmatch(r"(M\d+,[\d.]+|h-?\d+|v-?[\d.]+)+", d), d      # horizontal and vertical moves only
    first = values[0]
    m = re.match(r"M(\d+),([\d.]+)h(\d+)v(-[\d.]+)", first)
    x0, hold, jump = int(m[1]), int(m[3]), float(m[4])
    t0, t1 = churn["truth"]["t0"], churn["truth"]["t0"] + 420.05
    x_jump = 84 + (t0 + 118.0 - t0) / (t1 - t0) * 892
    assert abs(x0 + hold - x_jump) <= 1.5 and jump < -30       # holds, then rises at once
    assert values[3] and "v" in values[3]                       # the verify chart has its values
    for label in re.findall(r'text-anchor="end" fill="#495057">([^<]+)</text>', svg):
        if label in ("state", "actions"):
            continue
        assert re.fullmatch(r"-?\d+(\.\d+)?[kMG]?", label), label
        assert not (label.isdigit() and int(label) >= 1000), label    # 1k, never 1000


def test_markdown_starts_with_what_happened(churn):
    md = churn["md"].splitlines()
    headings = [line for line in md if line.startswith("## ")]
    assert headings[0] == "## What happened"
    first = next(i for i, line in enumerate(md) if "**remediated**" in line and "trainer=4100" in line)
    assert first < 40
    block = "\n".join(md[first:first + 14])
    assert "- **all of**" in block and "  - **any of**" in block and "**250** > 180" in block
    assert "Rollback: **reverted** affinity" in block and "(at shutdown)" in block


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    require(path is not None, "a headless Chromium (chromium) on PATH")
    return path


PROBE = """<script>
addEventListener('DOMContentLoaded', () => {
  const first = document.querySelector('main > section');
  const seen = [...document.querySelectorAll('#what-happened article.incident')].map(a => {
    const r = a.getBoundingClientRect();
    return [a.dataset.status, a.dataset.run, Math.round(r.top + scrollY), Math.round(r.bottom + scrollY),
            a.querySelector('header').innerText];
  });
  document.body.dataset.first = first.id;
  document.body.dataset.layout = JSON.stringify(seen);
});
</script>"""


def test_a_browser_shows_the_remediations_on_the_first_screen(churn, tmp_path):
    """Chromium lays the page out at 1300x1400: the first section is what happened,
    and the incidents of run 1, remediations with them, lie on the first screen."""
    browser = chromium()
    page = churn["paths"]["html"]
    shot = tmp_path / "first-screen.png"
    r = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                        f"--window-size={WIDTH},{HEIGHT}", page.as_uri()], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert shot.stat().st_size > 10_000 and png_size(shot) == (WIDTH, HEIGHT)

    probed = tmp_path / "probed.html"      # the page itself has no script; a copy measures its layout
    probed.write_text(churn["html"].replace("</head>", PROBE + "</head>", 1))
    r = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--window-size={WIDTH},{HEIGHT}",
                        "--dump-dom", probed.as_uri()], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", r.stdout)[1]
    assert 'data-first="what-happened"' in body
    layout = json.loads(re.search(r'data-layout="([^"]*)"', body)[1].replace("&quot;", '"').replace("&amp;", "&"))
    assert [(s, run) for s, run, *_ in layout] == [("escalated", "1"), ("remediated", "1"), ("remediated", "1"),
                                                   ("remediated", "2"), ("adopted", "2")]
    remediation = next(item for item in layout if item[0] == "remediated")
    assert "dataloader-numa-repin / loader-p99-remote" in remediation[4] and "trainer=4100" in remediation[4]
    assert remediation[3] <= HEIGHT, layout          # the whole card: breach, why, action, verify, rollback
    assert layout[0][3] <= HEIGHT                    # and the escalation above it
    dom = r.stdout
    text = re.sub(r"<[^>]+>", " ", dom.split('id="what-happened"')[1].split('id="runs"')[0])
    for words in ("affinity", "applied", "verified", "reverted", "at shutdown", "250", "all of", "any of",
                  "verify failed", "framework_hook", "notified"):
        assert words in text, words


def test_two_runs_without_a_run_record_between_them_are_still_told_apart():
    """An `end` closes a run: records after it (e.g. `reflexarc act`) are a run of their own, not the last one's."""
    records = [{"ts": 0, "kind": "run", "source": "live", "policies": []},
               {"ts": 1, "kind": "transition", "policy": "p", "rule": "r", "target": "*", "from": "ok",
                "to": "pending", "trigger": "breach", "evidence": []},
               {"ts": 2, "kind": "end", "summary": {"transitions": 1}},
               {"ts": 3, "kind": "action", "policy": "manual", "rule": "act", "target": "pid=1", "mode": "dry-run",
                "step": 0, "actuator": "affinity", "params": {}, "outcome": "planned", "change": None},
               {"ts": 4, "kind": "run", "source": "live", "policies": []},
               {"ts": 5, "kind": "transition", "policy": "p", "rule": "r", "target": "*", "from": "ok",
                "to": "pending", "trigger": "breach", "evidence": []},
               {"ts": 6, "kind": "end", "summary": {"transitions": 1}}]
    audit = Audit.from_records(records)
    assert [(r.index, r.run is not None, r.complete, len(r.transitions), len(r.actions)) for r in audit.runs] == [
        (1, True, True, 1, 0), (2, False, False, 0, 1), (3, True, True, 1, 0)]
    summary = summarize(audit)
    assert summary["warnings"] == [] and summary["complete"]
    assert [r["source"] for r in summary["runs"]] == ["live", "manual", "live"]


def test_a_reload_is_read_and_its_policies_described():
    """A `reload` record is a known kind: the rules it brings are the run's, no 'unknown kind' warning."""
    rule = {"name": "r2", "conditions": ["last(x{}[10s]) > 1"], "actions": ["log"], "verify": None,
            "rollback": "never"}
    records = [{"ts": 0, "kind": "run", "source": "live", "mode_override": None, "policies": []},
               {"ts": 1, "kind": "reload", "reason": "SIGHUP", "outcome": "ok", "added": ["p2"], "removed": [],
                "changed": [], "kept_rules": [], "ended_rules": [],
                "policies": [{"name": "p2", "mode": "dry-run", "file": None, "rules": [rule]}]},
               {"ts": 2, "kind": "reload", "reason": "file changed", "outcome": "refused", "errors": ["p.yaml:1:1: x"],
                "running": ["p2"]},
               {"ts": 3, "kind": "eval", "policy": "p2", "rule": "r2", "target": "*", "state": "ok", "result": False,
                "values": []},
               {"ts": 4, "kind": "end", "summary": {"transitions": 0}}]
    audit = Audit.from_records(records)
    assert not audit.unknown_kinds and [r["outcome"] for r in audit.runs[0].reloads] == ["ok", "refused"]
    summary = summarize(audit)
    assert summary["warnings"] == [] and summary["runs"][0]["modes"] == ["dry-run"]


def test_the_cli_prints_what_acted_and_folds_the_rest(churn, tmp_path, cli):
    """`reflexarc report` prints a row per target that did something and a line per
    rule for the quiet ones; `--full` draws every target."""
    r = cli("report", str(churn["audit"]), "--out", str(tmp_path / "a"), timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["RUN", "POLICY", "RULE"] and len(lines) < 20
    assert sum(1 for line in lines if line.startswith(("1 ", "2 "))) == 5          # the targets that did something
    assert any(line.startswith("run 1: dataloader-worker-io / worker-read-slow: ") and "targets never fired" in line
               for line in lines)
    assert "run 1 (live): 19 transitions; applied 3, notified 1, reverted 2" in lines
    r = cli("report", str(churn["audit"]), "--out", str(tmp_path / "b"), "--full", timeout=300)
    assert r.returncode == 0, r.stderr
    quiet = sum(1 for row in churn["json"]["summary"]["rules"] if not row["active"])
    assert (tmp_path / "b" / "report.html").read_text().count('class="timeline"') == 5 + quiet
    assert (tmp_path / "a" / "report.html").read_text().count('class="timeline"') == 5
