"""The controller in the user's monitoring stack, all real and on loopback: a
Prometheus scrapes a dcgm-exporter-shaped exporter and the controller's own
metrics; the controller's PromQL source reads GPU utilisation back from that
Prometheus; a rule on it fires and its alert reaches a real Alertmanager;
Prometheus then holds the controller's signal and rule state.

There is no GPU here: the exporter serves dcgm-exporter's metric names and
labels, which is what the controller reads on a real node through PromQL.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import require, spawn_cli, wait_until
from exporters import DcgmExporter
from reflexarc.simulations.testbed.prometheus import BINARY as PROMETHEUS, PrometheusServer, free_port

from reflexarc.simulations.testbed.alertmanager import BINARY as ALERTMANAGER, Alertmanager

pytestmark = [pytest.mark.slow]        # a real Prometheus and Alertmanager, their scrape and group timers

POLICY = """\
policies:
  - name: gpu-idle
    mode: alert-only
    rules:
      - name: starved-gpu
        by: [gpu]
        when: {signal: gpu_utilization_pct, agg: mean, window: 3s, op: "<", threshold: 20}
        for: 2s
        actions:
          - actuator: alert
            params: {severity: warning, summary: "GPU idle: the input pipeline is not keeping up"}
        rollback: never
"""
PROMQL = """\
prometheus: {url}
interval: 1s
timeout: 900ms
node: node-a
queries:
  - signal: gpu_utilization_pct
    query: avg by (gpu) (DCGM_FI_DEV_GPU_UTIL{{Hostname="$NODE"}})
    labels: {{gpu: gpu}}
"""


def test_prometheus_promql_rule_alertmanager_loop(tmp_path):
    require(Path(PROMETHEUS).exists(), f"Debian's prometheus at {PROMETHEUS} (scripts/bootstrap installs it)")
    require(Path(ALERTMANAGER).exists(), f"Debian's prometheus-alertmanager at {ALERTMANAGER}")
    port = free_port()
    policy, state, hooks = tmp_path / "gpu.yaml", tmp_path / "state", tmp_path / "hooks"
    policy.write_text(POLICY)
    hooks.mkdir(mode=0o755)
    with DcgmExporter("node-a", {0: 4.0}) as dcgm, \
            PrometheusServer({"dcgm": [dcgm.address], "reflexarc": [f"127.0.0.1:{port}"]},
                             honor_labels=("reflexarc",)) as prom, Alertmanager() as am:
        prom.wait_for("DCGM_FI_DEV_GPU_UTIL", lambda r: len(r) == 1)
        config = tmp_path / "promql.yaml"
        config.write_text(PROMQL.format(url=prom.url))
        proc = spawn_cli("--state-dir", str(state), "--hook-dir", str(hooks), "--alertmanager-url", am.url, "run",
                         "--no-probes", "--policy", str(policy), "--mode", "policy", "--promql-config", str(config),
                         "--metrics-addr", f"127.0.0.1:{port}", "--duration", "90", stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
        try:
            alert = wait_until("the alert in Alertmanager", lambda: [
                a for a in am.alerts() if a["labels"].get("alertname") == "reflexarc_gpu_idle_starved_gpu"])[0]
            assert alert["labels"]["gpu"] == "0" and alert["labels"]["severity"] == "warning"
            assert "gpu_utilization_pct" in alert["annotations"]["description"]
            # the signal the PromQL source read, exported in its base unit and scraped back
            util = wait_until("the signal in Prometheus", lambda: prom.query('reflexarc_gpu_utilization_ratio{gpu="0"}'))
            assert abs(float(util[0]["value"][1]) - 0.04) < 1e-9, util
            # the rule's state, past pending (it acted on the PromQL-fed signal), scraped by Prometheus
            acted = wait_until("the rule state in Prometheus", lambda: [
                r for r in prom.query('reflexarc_rule_state{policy="gpu-idle", rule="starved-gpu"} == 1')
                if r["metric"]["reflexarc_rule_state"] not in ("ok", "pending")])
            assert acted[0]["metric"]["target"] == "gpu=0", acted
        finally:
            proc.terminate()
            out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    records = [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]
    fired = [r for r in records if r["kind"] == "transition" and r.get("to") == "firing"]
    assert fired and fired[0]["evidence"][0]["value"] == 4.0, fired[:1]
