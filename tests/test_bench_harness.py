"""The engine benchmark's harness runs and writes what the README table is
made from (``--quick``: a few ticks per size; the figures are not checked,
timed assertions do not belong in tests)."""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT


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
