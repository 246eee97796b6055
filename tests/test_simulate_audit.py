"""``reflexarc simulate`` samples its audit as ``run`` does: the size of a quiet
simulated hour at 100 rules x 10 targets, ``--all-evals`` keeping every
evaluation, and a sampled run keeping every tick on the way to acting, with the
same decisions and charts as one that writes everything.

Everything runs in simulated time on the simulated plant (no hardware); the
bounds are on bytes and record counts, never on time."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from conftest import run_cli

from reflexarc.controller.engine.audit import EVERY_TICK_STATES
from reflexarc.controller.report import load_audit
from reflexarc.controller.runtime.simulate import AUDIT_SAMPLE, run_scenario

RULES, TARGETS = 100, 10
WARMUP = 300.0                # s of simulated time before the measured hour: windows fill, the first evaluations pass
HOUR = 3600.0
MB = 1_000_000


def quiet_node(where: Path, duration: str, tick: str) -> Path:
    """A scenario of a healthy node: ``RULES`` policies of one rule each, by rank, two
    conditions over 30 s windows (as ``bench/engine_policies.py``), thresholds far above
    the 10 ranks' signals, so no rule ever leaves ``ok``."""
    lines = ["policies:"]
    for i in range(RULES):
        lines += [f"  - name: quiet-{i}", "    mode: alert-only", "    rules:", f"      - name: r{i}",
                  "        by: [rank]", "        when:", "          all:",
                  f'            - {{signal: step_time_ms, agg: max, window: 30s, op: ">", threshold: {300 + i}}}',
                  f'            - {{signal: dataloader_batch_wait_ms, agg: p99, window: 30s, op: ">", '
                  f'threshold: {20 + i / 100}}}',
                  "        for: 5s", "        actions:", "          - {actuator: log, params: {message: slow}}"]
    (where / "quiet-policies.yaml").write_text("\n".join(lines) + "\n")
    ranks = ", ".join(f'"{r}"' for r in range(TARGETS))
    scenario = where / "quiet-node.yaml"
    scenario.write_text(f"""\
name: quiet-node
description: A healthy node under {RULES} rules for each of {TARGETS} ranks; nothing breaches.
duration: {duration}
tick: {tick}
seed: 3
policies: [./quiet-policies.yaml]
signals:
  - {{name: step_time_ms, labels: {{job: bench, rank: [{ranks}]}}, baseline: 180, noise: 0.05}}
  - {{name: dataloader_batch_wait_ms, labels: {{job: bench, rank: [{ranks}]}}, baseline: 2, noise: 0.1}}
expect: {{alert-only: {{actions: []}}}}
""")
    return scenario


def simulate(scenario: Path, out: Path, *extra: str) -> list[tuple[int, dict]]:
    """Run ``reflexarc simulate`` and return the audit's records with each line's size in bytes."""
    r = run_cli("simulate", str(scenario), "--out", str(out), *extra, timeout=600)
    assert r.returncode == 0, r.stderr
    assert (out / "report.html").is_file(), r.stdout
    assert not list(out.glob("audit.jsonl.*")), "the audit rotated"
    return [(len(line), json.loads(line)) for line in (out / "audit.jsonl").read_bytes().splitlines(keepends=True)]


@pytest.mark.slow
def test_a_quiet_simulated_hour_at_100_rules_x_10_targets_writes_at_most_2_mb(tmp_path):
    """The simulated hour after a 5-minute warm-up writes at most 2 MB: each of the
    1,000 rule-targets once per ``--audit-sample`` (1200 s), nothing else. The tick is
    10 s: sampled, the volume follows rule-targets x hours, not ticks (every evaluation
    at a 1 s tick would be about 1.9 GB)."""
    scenario = quiet_node(tmp_path, duration=f"{int(WARMUP + HOUR)}s", tick="10s")
    records = simulate(scenario, tmp_path / "out")
    hour = [(size, rec) for size, rec in records if WARMUP <= rec["ts"] < WARMUP + HOUR]
    written = sum(size for size, _ in hour)
    assert written <= 2 * MB, f"{written:,} bytes in a quiet simulated hour"
    assert {rec["kind"] for _, rec in hour} == {"eval"}, "a quiet node has nothing but evaluations to say"
    per_target = Counter((rec["policy"], rec["target"]) for _, rec in hour)
    assert len(per_target) == RULES * TARGETS
    assert set(per_target.values()) == {int(HOUR // AUDIT_SAMPLE)}
    assert {rec["state"] for _, rec in hour} == {"ok"}


@pytest.mark.slow
def test_all_evals_keeps_every_evaluation(tmp_path):
    """``--all-evals``: one ``eval`` per rule-target per tick; without it, the same
    quiet minute writes one per rule-target."""
    scenario = quiet_node(tmp_path, duration="60s", tick="10s")
    ticks = 60 // 10 + 1
    every = [rec for _, rec in simulate(scenario, tmp_path / "all", "--all-evals") if rec["kind"] == "eval"]
    sampled = [rec for _, rec in simulate(scenario, tmp_path / "sampled") if rec["kind"] == "eval"]
    assert len(every) == RULES * TARGETS * ticks
    assert len(sampled) == RULES * TARGETS
    assert {rec["ts"] for rec in sampled} == {0.0}


def test_a_rerun_in_the_same_directory_reports_only_itself(tmp_path):
    """A rotated audit left by an earlier run in ``--out`` is removed, not read
    into the new report."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "audit.jsonl.1").write_text('{"ts": 0, "kind": "run", "source": "an earlier run"}\n')
    result = run_scenario("numa-remote-worker", out_dir=out, report=True)
    assert not (out / "audit.jsonl.1").exists()
    assert len(load_audit(result.audit_path).runs) == 1


def _evals(records: list[dict]) -> dict[tuple, dict]:
    return {(r["policy"], r["rule"], r["target"], r["ts"]): r for r in records if r["kind"] == "eval"}


def test_sampled_run_keeps_the_way_to_acting_and_the_same_decisions_and_charts(tmp_path):
    """numa-remote-worker, enforcing, sampled and with every evaluation: the same
    transitions and actions; the sampled audit has every evaluation in pending,
    firing and verifying and every change of result or state, each identical to
    the full run's; the reports chart the same targets with the same markers, and
    each chart's series hold the values of those evaluations."""
    full = run_scenario("numa-remote-worker", mode="enforce", out_dir=tmp_path / "all", report=True, evals="all")
    sampled = run_scenario("numa-remote-worker", mode="enforce", out_dir=tmp_path / "sampled", report=True)
    events = lambda res: [{k: v for k, v in r.items() if k != "journal_id"}   # noqa: E731 - ids are random
                          for r in res.records if r["kind"] in ("transition", "action", "limit")]
    assert events(sampled) and events(sampled) == events(full)
    full_evals, kept = _evals(full.records), _evals(sampled.records)
    assert len(kept) < len(full_evals) / 5
    last: dict[tuple, tuple] = {}
    must = []
    for key, rec in full_evals.items():
        seen = (rec["state"], rec["result"])
        if rec["state"] in EVERY_TICK_STATES or last.get(key[:3]) != seen:
            must.append(key)
        last[key[:3]] = seen
    assert any(full_evals[k]["state"] in EVERY_TICK_STATES for k in must)
    missing = [k for k in must if kept.get(k) != full_evals[k]]
    assert not missing, missing[:5]

    runs = {name: load_audit(res.audit_path).runs[0] for name, res in (("all", full), ("sampled", sampled))}
    active = {name: {k for k, t in run.tracks.items() if t.active} for name, run in runs.items()}
    assert active["sampled"] and active["sampled"] == active["all"]
    for key in active["sampled"]:
        track = runs["sampled"].tracks[key]
        assert track.transitions == runs["all"].tracks[key].transitions
        drawn = {(text, ts, value) for text, series in track.series.items()
                 for ts, value in zip(series.ts, series.value)}
        written = {(item["condition"], ts, item["value"]) for (*k, ts), rec in kept.items() if tuple(k) == key
                   for item in rec["values"] if item["value"] is not None}
        assert written and written <= drawn
    pages = {name: res.reports["html"].read_text() for name, res in (("all", full), ("sampled", sampled))}
    charts = {name: {o: p.count(f'data-outcome="{o}"') for o in ("applied", "reverted", "planned", "notified")}
              for name, p in pages.items()}
    assert charts["sampled"]["applied"]
    assert charts["sampled"] == charts["all"]
    assert pages["sampled"].count('class="timeline') == pages["all"].count('class="timeline')
