"""The engine benchmark's harness runs and writes what the table in
docs/benchmarks.md is made from (``--quick``: a few ticks per size; the figures are not checked,
timed assertions do not belong in tests)."""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT, require_bpf
from test_closed_loop import require_loop

from reflexarc.simulations.testbed import residue
from reflexarc.simulations.testbed.controller import open_changes
import pytest

pytestmark = [pytest.mark.kernel, pytest.mark.testbed, pytest.mark.slow]


def test_engine_bench_quick_writes_its_results(tmp_path):
    out = tmp_path / "engine.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "engine.py"), "--quick", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    sizes = {(row["rules"], row["mode"]) for row in result["throughput"]}
    assert sizes == {(n, m) for n in (10, 100, 1000) for m in ("idle", "busy")}
    for row in result["throughput"]:
        assert row["runs"] == row["rules"] * row["targets"], "every rule-target has its run"
        assert row["evaluations_per_s"] > 0
    busy = next(row for row in result["throughput"] if row["rules"] == 100 and row["mode"] == "busy")
    assert busy["transitions"] > 0, "the busy feed makes the state machines work"
    assert result["audit_idle"]["rule_targets"] == 1000
    assert "| 100 x 10 | idle |" in r.stdout


def test_probe_cost_bench_quick_measures_every_side_and_writes_its_table(tmp_path):
    """``bench/probe_overhead.py --quick``: one pair per row, the figures not
    checked; what is checked is that every side really ran: the workloads did
    work, the observers attached (none failed), the ratios exist."""
    require_bpf()
    out = tmp_path / "probe.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "probe_overhead.py"), "--quick", "--out", str(out)],
                       capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(out.read_text())
    workloads = {"training loader", "syscall loop (fio psync)", "syscall loop (fio io_uring)",
                 "TCP stream (fio net, loopback)"}
    assert set(result["headline"]["a_cpu_us_per_op"]) == {"training loader"}, "the headline is the loader's"
    assert result["headline"]["a_cpu_us_per_op"]["training loader"] > 0
    assert result["headline"]["control"]["training loader"]["cpu_ratio"]["n"] == 1
    rows = {row["name"]: row for row in result["table"]["rows"]}
    assert set(rows) == {"probe sched_numa", "sched:sched_switch", "runqlat", "run-queue latency"}
    assert [row.get("failed") for row in rows.values()] == [None] * 4, "every observer attached"
    assert all(row[w]["cpu_ratio"]["n"] == 1 for row in rows.values() for w in workloads)
    assert result["events"]["syscall loop (fio psync)"]["events_per_s"] > 0, "the tier's programs ran"
    assert "| probe sched_numa | reflexarc |" in r.stdout and "(cf. sched_numa)" in r.stdout


def test_reaction_bench_quick_runs_both_pipelines_on_the_real_fault(tmp_path):
    """``bench/reaction.py --quick``: reflexarc and the tightest Prometheus +
    Alertmanager + script pipeline, once each, on the testbed's fault a. The
    figures are not checked; what is checked is that each pipeline really
    acted on the fault, the ratios exist, and nothing was left behind."""
    require_loop()
    out, work = tmp_path / "reaction.json", tmp_path / "work"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "reaction.py"), "--quick", "--out", str(out),
                        "--work", str(work)], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(out.read_text())
    trials = {t["setting"]: t for t in result["trials"]}
    assert set(trials) == {"reflexarc", "tightest"}
    for name, t in trials.items():     # after the onset and its own for (the policy has none; PromQL's 5 s)
        wait = result["policy_for_s"] if name == "reflexarc" else result["for_s"]
        assert t["applied_s"] is not None and t["applied_s"] > wait, f"{name} did not act: {t}"
        assert t["lost_s"] > 0, f"{name}: the fault cost no step time: {t}"
    assert trials["tightest"]["error"] is None and trials["tightest"]["decided_s"] is not None
    assert trials["tightest"]["detected_s"] is not None, "Prometheus's activeAt was read"
    assert set(result["ratios"]["tightest"]) == {"applied", "beyond_for", "lost"}
    assert all(v is not None for v in result["ratios"]["tightest"].values())
    assert open_changes(work / "state-script") == [], "the script's change was rolled back"
    assert residue(result["testbed"]) == [], "the testbed left something behind"
    assert "| reflexarc " in r.stdout and "| tightest " in r.stdout


def test_arrivals_bench_quick_measures_both_settings(tmp_path):
    """``bench/arrivals.py`` with one short lifetime per setting: the real
    controller beside a churning DataLoader job, each setting measured; the
    figures are not checked."""
    require_bpf()
    out = tmp_path / "arrivals.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "arrivals.py"), "--rounds", "1", "--window", "3",
                        "--settle", "8", "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["controller_cpu_pct"]) == {"arrivals_0", "arrivals_0.2"}
    assert all(len(v) == 1 and v[0] > 0 for v in result["controller_cpu_pct"].values()), result
    assert result["ratio_0.2_over_0"] is not None
