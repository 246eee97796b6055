"""One report across nodes: ``reflexarc report`` of several audits, or of a
directory of them. The nodes' trails here are the live-churn fixture (two
controller runs of a real node's shape) copied under node directories, and
hand-written records of the fleet's refusals and rollout events; the same
report of real controllers' audits, after a real breaker opened in etcd, is
checked in ``test_fleet_rollout.py``."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from fixtures.audit.live_churn import write_live_churn
from reflexarc.controller.report import FleetInputError, find_audits, write_fleet_report
from reflexarc.controller.report.fleet import NO_JOB, job_of, node_of, unique_name
from reflexarc.controller.report.audit import Audit

T0 = 1_780_000_000.0


def _fleet_records(node: str | None) -> list[dict]:
    """A controller run that a rollout's breaker held back: one refusal by the
    stage, the breaker opened by this node, two refusals by the breaker."""
    policy = {"name": "canary", "mode": "enforce", "file": "p.yaml", "job": "llama",
              "rules": [{"name": "slow", "conditions": ["max(step_time_ms{}[2s]) > 300"], "actions": ["sysctl"],
                         "verify": "max(step_time_ms{}[1s]) < 300 within 1s", "rollback": "on ['verify-failed']"}]}
    base = {"policy": "canary", "rule": "slow", "target": "rank=0", "target_labels": {"rank": "0"},
            "mode": "enforce"}
    refused = {**base, "kind": "action", "step": 0, "actuator": "sysctl", "params": {}, "outcome": "refused",
               "change": None, "journal_id": None}
    return [
        {"kind": "run", "ts": T0, "source": "live", "node": node, "mode_override": None, "policies": [policy]},
        {**base, "kind": "transition", "ts": T0 + 1, "from": "ok", "to": "pending", "trigger": "breach",
         "evidence": []},
        {**base, "kind": "transition", "ts": T0 + 2, "from": "pending", "to": "firing", "trigger": "fire",
         "evidence": []},
        {**refused, "ts": T0 + 3, "error": "fleet rollout: rollout-stage: canary: stage 1 of 2 admits 1 node(s)",
         "refusal": "rollout-stage"},
        {"kind": "rollout", "ts": T0 + 4, "policy": "canary", "event": "opened", "stage": 1,
         "detail": "3 of the fleet's last 4 verifications failed", "node": node},
        {**refused, "ts": T0 + 14, "error": "fleet rollout: breaker-open: canary: open", "refusal": "breaker-open"},
        {**refused, "ts": T0 + 24, "error": "fleet rollout: breaker-open: canary: open", "refusal": "breaker-open"},
        {"kind": "end", "ts": T0 + 30, "summary": {}},
    ]


def _write(path, records) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture
def collected(tmp_path):
    """collected/gpu-1, collected/gpu-2 (the churn trail each, named by their
    directories) and collected/x/audit.jsonl (a run held back by the breaker, named gpu-3 in its run record)."""
    root = tmp_path / "collected"
    for node in ("gpu-1", "gpu-2"):
        (root / node).mkdir(parents=True)
        write_live_churn(root / node / "audit.jsonl")
    _write(root / "x" / "audit.jsonl", _fleet_records("gpu-3"))
    return root


def test_a_directory_of_trails_is_one_report_with_each_nodes_own(collected, tmp_path):
    paths, fold = write_fleet_report(find_audits([collected]), tmp_path / "out")
    report = json.loads(paths["json"].read_text())
    nodes = {n["node"]: n for n in report["nodes"]}
    assert sorted(nodes) == ["gpu-1", "gpu-2", "gpu-3"]
    churn = Counter({"remediated": 3, "escalated": 1, "adopted": 1})      # the fixture's incidents, by status
    assert Counter(nodes["gpu-1"]["incidents"]) == Counter(nodes["gpu-2"]["incidents"]) == churn
    assert nodes["gpu-3"]["refused_by_reason"] == {"rollout-stage": 1, "breaker-open": 2}
    for n in nodes.values():
        node_report = json.loads((paths["json"].parent / n["report"]).with_suffix(".json").read_text())
        assert node_report["format"] == "reflexarc-report/2", "each node's own report, as for one audit"
    jobs = {j["job"]: j for j in report["jobs"]}
    assert jobs["llama"]["nodes"] == ["gpu-1", "gpu-2", "gpu-3"], "a target's job label, or its policy's job"
    assert jobs["llama"]["incidents"]["escalated"] == 2
    assert jobs[NO_JOB]["nodes"] == ["gpu-1", "gpu-2"]          # the re-pins by trainer, the policy-wide retag
    assert [(e["node"], e["event"]) for e in report["rollout_events"]] == [("gpu-3", "opened")]
    groups = {(r["node"], r["reason"]): (r["count"], r["first"], r["last"]) for r in report["refusals"]}
    assert groups == {("gpu-3", "rollout-stage"): (1, T0 + 3, T0 + 3),
                      ("gpu-3", "breaker-open"): (2, T0 + 14, T0 + 24)}
    page, md = paths["html"].read_text(), paths["md"].read_text()
    for text in (page, md):
        assert "3 nodes" in text and "breaker of canary opened by gpu-3" in text
        assert "nodes/gpu-1/report.html" in text and "refused: breaker-open" in text
    assert fold.nodes[0].node == "gpu-1"


def test_the_cli_takes_files_and_directories_and_says_what_it_wrote(cli, collected, tmp_path):
    out = tmp_path / "out"
    done = cli("report", str(collected / "gpu-1"), str(collected / "x" / "audit.jsonl"), "--out", str(out),
               check=0)
    assert done.stdout.splitlines()[:2] == [
        f"gpu-1: 2 run(s), 5 incident(s), 0 refused change(s) ({collected / 'gpu-1' / 'audit.jsonl'})",
        f"gpu-3: 1 run(s), 1 incident(s), 3 refused change(s) ({collected / 'x' / 'audit.jsonl'})"]
    assert (out / "report.html").is_file() and (out / "nodes" / "gpu-3" / "report.html").is_file()
    one = cli("report", str(collected / "gpu-1" / "audit.jsonl"), "--out", str(tmp_path / "one"), check=0)
    assert "html:" in one.stdout and not (tmp_path / "one" / "nodes").exists(), "one audit: the one-node report"
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = cli("report", str(empty), "--out", str(tmp_path / "o2"), check=1)
    assert bad.stderr.strip() == f"error: {empty}: no audit.jsonl in it or below it", bad.stderr


def test_node_names_come_from_the_run_record_or_the_path(tmp_path):
    named = Audit.from_records(_fleet_records("gpu-9"))
    anonymous = Audit.from_records(_fleet_records(None))
    assert node_of(named, tmp_path / "whatever" / "audit.jsonl") == "gpu-9"
    assert node_of(anonymous, tmp_path / "gpu-4" / "audit.jsonl") == "gpu-4"
    assert node_of(anonymous, tmp_path / "gpu-5.jsonl") == "gpu-5"
    taken: set[str] = set()
    assert [unique_name(n, taken) for n in ("a", "a", "../a b", "")] == ["a", "a-2", "a_b", "node"]


def test_two_trails_of_one_node_name_keep_both_reports(tmp_path):
    for where in ("day1", "day2"):
        _write(tmp_path / where / "audit.jsonl", _fleet_records("gpu-3"))
    paths, fold = write_fleet_report(find_audits([tmp_path]), tmp_path / "out")
    assert sorted(n.link for n in fold.nodes) == ["nodes/gpu-3-2/report.html", "nodes/gpu-3/report.html"]
    assert all((paths["html"].parent / n.link).is_file() for n in fold.nodes)


def test_jobs_are_read_from_the_records():
    assert job_of("job=llama,rank=0") == "llama"
    assert job_of("rank=0", "from-policy") == "from-policy"
    assert job_of("*") == NO_JOB


def test_node_names_and_details_are_escaped(tmp_path):
    records = _fleet_records("<script>alert(1)</script>")
    records[4]["detail"] = "a | b <img src=x onerror=alert(1)>"
    _write(tmp_path / "n" / "audit.jsonl", records)
    _write(tmp_path / "m" / "audit.jsonl", _fleet_records("gpu-1"))
    paths, _ = write_fleet_report(find_audits([tmp_path]), tmp_path / "out")
    page, md = paths["html"].read_text(), paths["md"].read_text()
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<img" not in page and "<img" not in md and "a \\| b" in md
    assert (tmp_path / "out" / "nodes" / "script_alert_1_script" / "report.html").is_file()


def test_a_directory_without_a_trail_is_refused(tmp_path):
    with pytest.raises(FleetInputError, match="no audit.jsonl"):
        find_audits([tmp_path])
