"""The closed loop on the testbed, shortened: a real two-rank gloo job in
network namespaces, a real fault, the real controller (`reflexarc run` in
enforce with the real probes, actuators and shipped policies, selectors filled
in), a real Alertmanager. Asserts what happened, not how fast."""
from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest
from conftest import require, require_bpf

from reflexarc.simulations.testbed import residue
from reflexarc.simulations.testbed.alertmanager import BINARY as ALERTMANAGER
from reflexarc.simulations.testbed.closed_loop import run_fault

pytestmark = [pytest.mark.kernel, pytest.mark.testbed, pytest.mark.slow]


def require_loop() -> None:
    require_bpf()
    require(bool(shutil.which("ip") and shutil.which("tc")), "ip and tc (iproute2)")
    require(importlib.util.find_spec("torch") is not None, "torch (pip install torch==2.13.0)")
    require(os.path.exists(ALERTMANAGER), f"{ALERTMANAGER} (Debian prometheus-alertmanager)")


def loop(key: str, tmp_path: Path, **options) -> dict:
    result = run_fault(key, tmp_path, baseline=35.0, settle=6.0, log=lambda _text: None, **options)
    assert residue(result["testbed"]) == [], "the testbed left something behind"
    assert result["state_diff"] == [], "the controller left a change behind:\n" + "\n".join(result["state_diff"])
    assert result["end_summary"]["errors"] == 0
    return result


def outcomes(result: dict) -> list[tuple[str, str]]:
    return [(a["actuator"], a["outcome"]) for a in result["actions"]]


def test_a_bulk_upload_is_demoted_and_the_steps_come_back(tmp_path):
    require_loop()
    r = loop("a", tmp_path)
    assert outcomes(r)[0] == ("dscp", "applied"), r["actions"]
    assert "CS1" in r["actions"][0]["summary"] and r["testbed"] in r["actions"][0]["summary"]
    assert r["after_onset_s"]["verified"] is not None, r["after_onset_s"]
    assert r["ratio_to_baseline"]["fault"] >= 1.3 and r["ratio_to_baseline"]["remediated"] <= 1.2, r["steps_ms"]
    # reverted at shutdown (on a loaded machine another policy may hold a change too; loop() checks that
    # nothing at all was left behind)
    assert ("dscp", "reverted") in outcomes(r) or r["end_summary"]["reverted"] >= 1


def test_b_a_slow_store_gets_more_loader_workers_through_the_hook(tmp_path):
    require_loop()
    r = loop("b", tmp_path)
    assert outcomes(r)[0] == ("framework_hook", "applied"), r["actions"]
    assert r["after_onset_s"]["verified"] is not None, r["after_onset_s"]
    assert r["ratio_to_baseline"]["fault"] >= 1.3 and r["ratio_to_baseline"]["remediated"] <= 1.2, r["steps_ms"]


def test_d_a_throughput_capped_store_is_rolled_back_and_alerted(tmp_path):
    require_loop()
    r = loop("d", tmp_path)
    steps = r["after_onset_s"]
    assert outcomes(r)[0] == ("framework_hook", "applied"), r["actions"]
    assert steps["verify_failed"] is not None and steps["rolled_back"] is not None, steps
    assert ("framework_hook", "reverted") in outcomes(r) and ("alert", "notified") in outcomes(r), r["actions"]
    assert r["alerts_at_receiver"], "the alert did not reach Alertmanager"
    assert r["alerts_after_stop"] == [], "the stopping controller resolves the alerts it fired"
