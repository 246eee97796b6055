"""Build the Grafana dashboard of reflexarc nodes: deploy/grafana/reflexarc-dashboard.json
and its copy in the Helm chart (deploy/helm/reflexarc/dashboards/reflexarc.json).

Rows: rule states; actions by outcome and would-have-acted counts; the
fleet's budget slots, refusals, rollout stages and breakers (empty on nodes
run without ``--fleet-etcd``); probe health; the controller's own cost; the
live signals. The controller's metrics
are those of ``controller/engine/metrics.py`` and ``controller/runtime/exporter.py``; a live
signal of the catalogue is exported under the name ``controller/runtime/signal_metrics.py``
gives it (its unit suffix in a base unit: ``step_time_ms`` is
``reflexarc_step_time_seconds``).

Series are selected by ``node`` (the ServiceMonitor of the chart, or
deploy/prometheus/scrape-config.yml, adds it from the pod's node; a systemd
node's scrape configuration sets it) and, for the process metrics, by the
scrape ``job`` (default ``reflexarc``). The training-job variable lists the
jobs of ``reflexarc_job_info``, which the controller exports for every job it
finds on a node (hook-instrumented or not), not only those that report step
signals.

Usage::

    python deploy/grafana/dashboard.py          # rewrite both files
    python deploy/grafana/dashboard.py --check  # exit 1 if either differs

Overhead: none at run time; a few milliseconds to write the JSON.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUTPUTS = (HERE / "reflexarc-dashboard.json", HERE.parent / "helm" / "reflexarc" / "dashboards" / "reflexarc.json")

DS = {"type": "prometheus", "uid": "${datasource}"}
NODE = 'node=~"$node"'
RATE = "$__rate_interval"


class Layout:
    """Panels left to right in rows of 24 grid units."""

    def __init__(self) -> None:
        self.panels: list[dict] = []
        self.x = self.y = 0
        self.height = 0
        self.next_id = 1

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append({"type": "row", "title": title, "id": self._id(), "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.y += 1

    def add(self, panel: dict, w: int = 8, h: int = 8) -> None:
        if self.x + w > 24:
            self._newline()
        panel["id"] = self._id()
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.panels.append(panel)
        self.x += w
        self.height = max(self.height, h)

    def _newline(self) -> None:
        if self.x:
            self.y += self.height
        self.x, self.height = 0, 0

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False) -> dict:
    t = {"datasource": DS, "expr": expr, "refId": ref, "legendFormat": legend or "__auto"}
    if instant:
        t.update(instant=True, range=False, format="table")
    return t


def panel(kind: str, title: str, targets: list[dict], unit: str = "short", description: str = "",
          **options) -> dict:
    p = {"type": kind, "title": title, "description": description, "datasource": DS, "targets": targets,
         "fieldConfig": {"defaults": {"unit": unit}, "overrides": []}, "options": options or {}}
    if kind == "timeseries":
        p["fieldConfig"]["defaults"]["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10,
                                                  "showPoints": "never"}
        p["options"] = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "desc"}, **options}
    return p


def series(title: str, exprs: list[tuple[str, str]], unit: str = "short", description: str = "") -> dict:
    refs = "ABCDEFGH"
    return panel("timeseries", title, [target(e, legend, refs[i]) for i, (e, legend) in enumerate(exprs)],
                 unit, description)


def stat(title: str, expr: str, unit: str = "short", description: str = "", thresholds=None) -> dict:
    p = panel("stat", title, [target(expr, "{{node}}")], unit, description,
              reduceOptions={"calcs": ["lastNotNull"], "fields": "", "values": False},
              colorMode="background", graphMode="none", textMode="value_and_name")
    if thresholds:
        p["fieldConfig"]["defaults"]["thresholds"] = {"mode": "absolute", "steps": thresholds}
    return p


GREEN_RED = [{"color": "green", "value": None}, {"color": "red", "value": 1}]
RED_GREEN = [{"color": "red", "value": None}, {"color": "green", "value": 1}]


def build() -> dict:
    g = Layout()

    g.row("Rules")
    g.add(series("Rule-targets by state", [
        (f"sum by (reflexarc_rule_state) (reflexarc_rule_state{{{NODE}}})", "{{reflexarc_rule_state}}")],
        description="How many (policy, rule, target) runs are in each lifecycle state; "
                    "ok is the steady state."), w=12)
    p = panel("table", "Rule-targets not ok", [target(
        f'reflexarc_rule_state{{{NODE}, reflexarc_rule_state!="ok"}} == 1', instant=True)],
        description="Each run away from its steady state, with the state it is in.")
    p["transformations"] = [{"id": "organize", "options": {
        "excludeByName": {"Time": True, "Value": True, "__name__": True, "container": True, "endpoint": True,
                          "instance": True, "namespace": True, "pod": True, "service": True},
        "renameByName": {"reflexarc_rule_state": "state"}}}]
    g.add(p, w=12)
    g.add(series("Transitions", [
        (f"sum by (policy, rule, to_state) (rate(reflexarc_transitions_total{{{NODE}}}[{RATE}]))",
         "{{policy}}/{{rule}} -> {{to_state}}")], unit="ops"), w=8)
    g.add(series("Rule errors", [
        (f"sum by (policy, rule) (increase(reflexarc_rule_errors_total{{{NODE}}}[{RATE}]))", "{{policy}}/{{rule}}")],
        description="Unexpected errors in a rule's run, contained: the run went to failed."), w=8)
    g.add(series("Rule-targets and bus series", [
        (f"sum by (node) (reflexarc_rule_targets{{{NODE}}})", "{{node}} rule-targets"),
        (f"sum by (node) (reflexarc_bus_series{{{NODE}}})", "{{node}} bus series")]), w=8)

    g.row("Actions")
    g.add(series("Actions by outcome", [
        (f"sum by (outcome, mode) (increase(reflexarc_actions_total{{{NODE}}}[{RATE}]))", "{{mode}}: {{outcome}}")],
        description="Actuator steps: applied, planned (dry-run), failed, reverted..."), w=8)
    g.add(panel("bargauge", "Would have acted (dry-run, alert-only)", [target(
        f"sum by (policy, rule, actuator) (increase(reflexarc_would_have_acted_total{{{NODE}}}[$__range]))",
        "{{policy}}/{{rule}}: {{actuator}}", instant=True)],
        description="What enforcement would have done over the dashboard's range: the evidence to move a "
                    "policy from dry-run to enforce.",
        displayMode="basic", orientation="horizontal",
        reduceOptions={"calcs": ["lastNotNull"], "fields": "", "values": False}), w=8)
    g.add(series("Held back by a limit", [
        (f"sum by (reason) (increase(reflexarc_actions_limited_total{{{NODE}}}[{RATE}]))", "{{reason}}")],
        description="Actions the node's limits refused: kill switch, max active, actions per hour."), w=8)
    g.add(stat("Active remediations", f"sum by (node) (reflexarc_active_remediations{{{NODE}}})",
               description="Changes applied and not yet reverted."), w=12, h=5)
    g.add(stat("Kill switch", f"max by (node) (reflexarc_kill_switch_engaged{{{NODE}}})",
               description="1 while /run/reflexarc/disable exists: nothing is enforced.",
               thresholds=GREEN_RED), w=12, h=5)

    g.row("Fleet")
    g.add(series("Fleet slots in use", [
        (f"sum by (pool) (reflexarc_fleet_slots_held{{{NODE}}})", "{{pool}}")],
        description="Budget slots held, summed over the nodes shown: at most the pool's limit "
                    "(--fleet-max-nodes, --fleet-max-percent; docs/fleet.md)."), w=8)
    g.add(series("Refused by the fleet", [
        (f"sum by (reason) (increase(reflexarc_budget_refused_total{{{NODE}}}[{RATE}]))", "{{reason}}")],
        description="Enforce changes the budget or a rollout refused, nothing applied: budget-full, "
                    "rollout-stage, breaker-open, store-unreachable (fail closed)..."), w=8)
    g.add(stat("Nodes registered", f"sum(reflexarc_fleet_registered{{{NODE}}})",
               description="Nodes whose lease in etcd is live and renewed; one at 0 refuses every enforce "
                           "change until the store answers."), w=8)
    g.add(stat("Breaker open", f"max by (policy) (reflexarc_rollout_breaker_open{{{NODE}}})",
               description="1 while a policy's fleet circuit breaker is open: no node enforces it until "
                           "reflexarc fleet reset POLICY --reason TEXT.", thresholds=GREEN_RED), w=12, h=5)
    g.add(stat("Rollout stage", f"max by (policy) (reflexarc_rollout_stage{{{NODE}}})",
               description="The stage (1 = first) each policy's rollout is at, as the nodes last read it."),
          w=12, h=5)

    g.row("Probes and intake")
    g.add(stat("Probe up", f'sum by (node, probe) (reflexarc_probe_up{{{NODE}, state=~"ok|degraded"}})',
               description="1 while a probe is loaded and attached.", thresholds=RED_GREEN), w=8)
    g.add(series("Lost probe events", [
        (f"sum by (node, probe) (rate(reflexarc_probe_events_lost_total{{{NODE}}}[{RATE}]))", "{{node}} {{probe}}")],
        unit="ops", description="Events dropped because a ring buffer was full."), w=8)
    g.add(series("Samples published", [
        (f"sum by (source) (rate(reflexarc_signal_samples_total{{{NODE}}}[{RATE}]))", "{{source}}")],
        unit="ops"), w=8)
    g.add(series("Samples dropped and rejected", [
        (f"sum by (signal, reason) (rate(reflexarc_samples_dropped_total{{{NODE}}}[{RATE}]))",
         "dropped {{signal}}: {{reason}}"),
        (f"sum by (signal, reason) (rate(reflexarc_samples_rejected_total{{{NODE}}}[{RATE}]))",
         "rejected {{signal}}: {{reason}}", )], unit="ops"), w=12)
    g.add(series("Hook sockets ignored", [
        (f"sum by (reason) (rate(reflexarc_hook_rejected_total{{{NODE}}}[{RATE}]))", "{{reason}}")],
        unit="ops", description="Framework hook sockets and replies ignored as untrusted (docs/hooks.md)."), w=12)

    g.row("Controller cost")
    g.add(series("CPU", [
        (f'rate(process_cpu_seconds_total{{job=~"$job", {NODE}}}[{RATE}])', "{{node}}")],
        unit="percentunit", description="CPU seconds per second of the controller process."), w=6)
    g.add(series("Resident memory", [
        (f'process_resident_memory_bytes{{job=~"$job", {NODE}}}', "{{node}}")], unit="bytes"), w=6)
    g.add(series("Loop lag", [
        (f"max by (node) (reflexarc_loop_lag_seconds{{{NODE}}})", "{{node}}")], unit="s",
        description="How late a tick started after its interval."), w=6)
    g.add(series("Journal size", [
        (f"max by (node) (reflexarc_journal_bytes{{{NODE}}})", "{{node}}")], unit="bytes"), w=6)

    g.row("Live signals")
    T = 'node=~"$node", job=~"$training_job"'
    g.add(series("Step time", [(f"reflexarc_step_time_seconds{{{T}}}", "{{job}} rank {{rank}}")], unit="s"))
    g.add(series("Batch wait", [(f"reflexarc_dataloader_batch_wait_seconds{{{T}}}", "{{job}} rank {{rank}}")],
                 unit="s"))
    g.add(series("MFU", [(f"reflexarc_mfu_ratio{{{T}}}", "{{job}} rank {{rank}}")], unit="percentunit"))
    g.add(series("DataLoader read latency", [
        (f'reflexarc_dataloader_read_latency_seconds{{{T}, quantile="0.99"}}', "p99 {{job}} pid {{pid}}"),
        (f'reflexarc_dataloader_read_latency_seconds{{{T}, quantile="0.5"}}', "p50 {{job}} pid {{pid}}")], unit="s"))
    g.add(series("DataLoader run-queue latency", [
        (f'reflexarc_dataloader_runq_latency_seconds{{{T}, quantile="0.99"}}', "p99 {{job}} pid {{pid}}")],
        unit="s"))
    g.add(series("DataLoader reads", [
        (f"sum by (job, pid) (rate(reflexarc_dataloader_reads_total{{{T}}}[{RATE}]))", "{{job}} pid {{pid}}")],
        unit="ops"))
    g.add(series("NUMA remote share", [(f"reflexarc_numa_remote_ratio{{{T}}}", "{{job}} pid {{pid}}")],
                 unit="percentunit"))
    g.add(series("NUMA migrations", [
        (f"sum by (job) (rate(reflexarc_numa_migrations_total{{{T}}}[{RATE}]))", "{{job}} all"),
        (f"sum by (job) (rate(reflexarc_numa_cross_migrations_total{{{T}}}[{RATE}]))", "{{job}} cross-node")],
        unit="ops"))
    g.add(series("Block request latency", [
        (f'reflexarc_block_rq_latency_seconds{{{NODE}, quantile="0.99"}}', "p99 {{dev}}")], unit="s"))
    g.add(series("Block requests", [
        (f"sum by (dev) (rate(reflexarc_block_requests_total{{{NODE}}}[{RATE}]))", "{{dev}}"),
        (f"reflexarc_block_small_io_ratio{{{NODE}}}", "{{dev}} small share")], unit="short"))
    g.add(series("Link utilisation", [
        (f"reflexarc_link_utilization_ratio{{{NODE}}}", "{{iface}} {{job}} {{traffic}}")], unit="percentunit"))
    g.add(series("Link egress", [     # per job: each job's "other" holds the other jobs' traffic too
        (f"sum by (iface, job, traffic) (rate(reflexarc_link_tx_bytes_total{{{NODE}}}[{RATE}]))",
         "{{iface}} {{job}} {{traffic}}")],
        unit="Bps"))
    g.add(series("Qdisc", [
        (f"reflexarc_qdisc_backlog_bytes{{{NODE}}}", "{{iface}} backlog"),
        (f"sum by (iface) (rate(reflexarc_qdisc_drops_total{{{NODE}}}[{RATE}]))", "{{iface}} drops/s")]))
    g.add(series("TCP", [
        (f"sum by (job, port) (rate(reflexarc_tcp_retransmits_total{{{T}}}[{RATE}]))", "{{job}}:{{port}} retransmits/s"),
        (f'reflexarc_tcp_srtt_seconds{{{T}, quantile="0.99"}}', "{{job}}:{{port}} srtt p99")]))
    g.add(series("GPU", [
        (f"reflexarc_gpu_utilization_ratio{{{NODE}}}", "gpu {{gpu}} utilisation"),
        (f"reflexarc_gpu_submit_rate_hz{{{T}}}", "{{job}} pid {{pid}} submits/s")]))
    g.add(series("GPU submit gap", [
        (f'reflexarc_gpu_submit_gap_seconds{{{T}, quantile="0.99"}}', "p99 {{job}} pid {{pid}}")], unit="s"))
    g.add(series("RDMA", [
        (f'reflexarc_rdma_qp_completion_latency_seconds{{{NODE}, quantile="0.99"}}', "qp {{qp}} p99 completion"),
        (f"reflexarc_rdma_hw_counter_rate{{{NODE}}}", "{{dev}}:{{port}} {{counter}}/s")]))
    g.add(series("NCCL link latency", [
        (f'reflexarc_nccl_link_latency_seconds{{{NODE}, quantile="0.99"}}', "p99 {{link}}")], unit="s"))
    g.add(series("Deep probe tier", [
        (f"reflexarc_deep_probe_events_per_second{{{NODE}}}", "{{probe}}")], unit="ops"))

    def query_var(name: str, label: str, query: str, default: str = "All") -> dict:
        return {"name": name, "label": label, "type": "query", "datasource": DS, "refresh": 2,
                "query": {"query": query, "refId": name}, "definition": query, "includeAll": True,
                "multi": True, "allValue": ".*", "sort": 1,
                "current": {"text": default, "value": "$__all" if default == "All" else default}}

    templating = [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0},
        query_var("node", "Node", "label_values(reflexarc_rule_targets, node)"),
        # every job the controller found on a node, hooks or not (reflexarc jobs); the probes'
        # signals carry the same job label
        query_var("training_job", "Training job", "label_values(reflexarc_job_info, job)"),
        {"name": "job", "label": "Scrape job", "type": "custom", "query": "reflexarc",
         "current": {"text": "reflexarc", "value": "reflexarc"},
         "options": [{"text": "reflexarc", "value": "reflexarc", "selected": True}], "hide": 2},
    ]
    return {
        "uid": "reflexarc-nodes", "title": "reflexarc: node remediation", "tags": ["reflexarc"],
        "description": "Rules, actions, probes, controller cost and live signals of reflexarc nodes.",
        "editable": True, "graphTooltip": 1, "schemaVersion": 39, "version": 1, "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"}, "timezone": "", "timepicker": {},
        "annotations": {"list": []}, "links": [], "templating": {"list": templating},
        "panels": g.panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=False) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        stale = [str(p) for p in OUTPUTS if not p.exists() or p.read_text() != text]
        for path in stale:
            print(f"{path}: differs from deploy/grafana/dashboard.py (run it to rewrite)", file=sys.stderr)
        return 1 if stale else 0
    for path in OUTPUTS:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
