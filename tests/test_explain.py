"""``reflexarc explain``: each shipped policy said in plain words, with its
thresholds, sustain, actions, verification, rollback and node needs; nesting
as written; bad input as located errors and exit 1."""
from __future__ import annotations

import re

import pytest

from reflexarc.controller.policy.explain import explain
from reflexarc.controller.policy.loader import load_policies
from reflexarc.controller.policy.model import Combo
from reflexarc.controller.signals.producers import NodeFacts
from reflexarc.core.devices import Devices


def node(tmp_path, gpu=False, rdma=False) -> NodeFacts:
    """A node described by fake roots: with or without a GPU and an RDMA device."""
    dev, sys_root = tmp_path / "dev", tmp_path / "sys"
    dev.mkdir(parents=True, exist_ok=True)
    (sys_root / "class" / "infiniband").mkdir(parents=True, exist_ok=True)
    if gpu:
        (dev / "nvidia0").write_text("")
    if rdma:
        (sys_root / "class" / "infiniband" / "mlx5_0").mkdir(exist_ok=True)
    return NodeFacts(Devices(dev_root=str(dev), sys_root=str(sys_root)))


def said(repo_root, name, facts, receiver=False) -> str:
    """The explanation of one shipped policy, whitespace folded so wrapped phrases match."""
    policies = [p for p in load_policies([str(repo_root / "policies")]) if p.name == name]
    assert len(policies) == 1, name
    return " ".join(explain(policies, facts, receiver).split())


def assert_says(text: str, *phrases: str) -> None:
    for phrase in phrases:
        assert phrase in text, f"missing: {phrase!r}\nin: {text}"


def test_dataloader_starvation(repo_root, tmp_path):
    text = said(repo_root, "dataloader-starvation", node(tmp_path))
    assert_says(
        text,
        "mode dry-run: it will only plan and log",
        "--mode enforce to act",
        "rule loader-starved: when, for one job (by: job), all of:",
        "- the mean of dataloader_batch_wait_ms over 5 s is above 10 ms",
        '- the max of dataloader_read_latency_us{quantile="0.99"} over 10 s is above 1000 us',
        "for 10 s in a row, it 1. calls the training script's `dataloader.prefetch` hook with "
        "prefetch_factor=8, num_workers=8",
        "it then checks for up to 60 s that the mean of dataloader_batch_wait_ms over 10 s is below 5 ms",
        "2. if that check fails or the change cannot be made, it rolls the change back and sends a warning "
        'alert "Training loop starved of batches; more DataLoader prefetch did not help"',
        "A change is undone when the check fails and when the controller shuts down, not when the rule clears",
        "a controller restarted while it is applied adopts it",
        "It clears once the condition has been false for 60 s",
        "then a 10 m cooldown; at most 2 changes an hour for one job.",
        "dataloader_batch_wait_ms (ms)",
        "from the framework hooks (the training script reports it through reflexarc.actuators.hooks",
        "from probe dataloader_io",
        "the training script's `dataloader.prefetch` handler, registered through reflexarc.actuators.hooks",
    )


def test_dataloader_numa(repo_root, tmp_path):
    text = said(repo_root, "dataloader-numa-repin", node(tmp_path))
    assert_says(
        text,
        "It may touch processes named pt_data_worker.",
        "when, for one training process (by: trainer, per job where several jobs run), all of:",
        '- the max of dataloader_read_latency_us{quantile="0.99"} over 30 s is above 3x its baseline '
        "(the median of the last 10 m while healthy)",
        "- any of: - the increase of numa_cross_migrations_total over 60 s is above 0 "
        "- the mean of numa_remote_ratio over 30 s is above 0.5",
        "for 15 s in a row, it 1. re-pins every thread of the selected DataLoader workers to the CPUs of "
        "the job's NUMA node (that of the device it reads from or sends on, else the one holding most of "
        "its training process's memory)",
        'it then checks for up to 90 s that the max of dataloader_read_latency_us{quantile="0.99"} over 30 s '
        "is below 1.5x its baseline",
        "rolls the change back and sends a warning alert",
        "A change is undone when the check fails, 1 h after it was made and when the controller shuts down",
        "a controller restarted while it is applied reverts it.",
        "then a 5 m cooldown; at most 3 changes an hour for one training process.",
        "numa_cross_migrations_total (a count)",
        "from probe sched_numa",
    )


def test_nccl_congestion_dscp(repo_root, tmp_path):
    text = said(repo_root, "nccl-congestion-dscp", node(tmp_path))
    assert_says(
        text,
        "It may touch interfaces eth0.",
        "rule bulk-competes-with-collective: when, node-wide (per job where several jobs run), all of:",
        '- the max of link_utilization_pct{traffic="other"} over 10 s is above 20%',
        "- step_time_ms rises to 1.3x its reference (the median of the last 2 m while healthy), seen by a CUSUM",
        "as soon as it holds, it 1. retags the egress tcp flows on ports 443 out of eth0 with DSCP CS1 (8)",
        "it then checks for up to 60 s that the mean of step_time_ms over 10 s is below 1.2x its baseline",
        "A change is undone when the check fails, 30 m after it was made and when the controller shuts down",
        "then a 5 m cooldown; at most 3 changes an hour.",
        "from probe link_traffic",
    )


def test_gpu_gap_alert_requires_a_gpu(repo_root, tmp_path):
    text = said(repo_root, "gpu-submit-gap", node(tmp_path))
    assert_says(
        text,
        "mode alert-only: it sends its alerts and changes nothing",
        "It needs a GPU (requires: gpu): on a node without one it is idle.",
        "- the mean of gpu_utilization_pct over 60 s is below 0.9x its baseline",
        '- the p50 of gpu_submit_gap_us{quantile="0.99"} over 60 s is above 3x its baseline',
        "for 30 s in a row, it 1. sends a warning alert",
        "It changes nothing on the node.",
        "It clears once the condition has been false for 2 m, and resolves its alerts; then a 30 m cooldown.",
        "from NVML (nvidia-ml-py on a node with a GPU): not here: no GPU",
        "note: policy gpu-submit-gap requires gpu: idle on this node: no GPU",
    )
    with_gpu = said(repo_root, "gpu-submit-gap", node(tmp_path / "gpu", gpu=True))
    assert "It needs a GPU (requires: gpu)" in with_gpu
    assert "idle on this node" not in with_gpu and "not here: no GPU" not in with_gpu


def test_without_this_node_explain_says_what_it_did_not_check(repo_root):
    from reflexarc.controller.policy.readiness import CatalogueFacts
    text = said(repo_root, "gpu-submit-gap", CatalogueFacts("not root"))
    assert_says(
        text,
        "from NVML (nvidia-ml-py on a node with a GPU): not checked (not root)",
        "from probe gpu_submit (light tier, always on): not checked (not root)",
        f"readiness here: {repo_root}/policies/gpu-gap-alert.yaml:10:5: warning: policy gpu-submit-gap "
        "(alert-only) sends alerts, but no alert receiver is configured",
    )
    assert "idle on this node" not in text and "can run here" not in text
    quiet = said(repo_root, "gpu-submit-gap", CatalogueFacts("not root"), receiver=True)
    assert_says(quiet, "readiness here: nothing in the signal catalogue keeps it from working (this node not "
                       "checked: not root).")


def test_rdma_deep_tracing_requires_rdma(repo_root, tmp_path):
    text = said(repo_root, "rdma-deep-tracing", node(tmp_path))
    assert_says(
        text,
        "mode enforce: it acts under `reflexarc run --mode policy`",
        "while the kill-switch file exists it only plans",
        "It needs an RDMA device (requires: rdma): on a node without one it is idle.",
        "- the mean of step_time_ms over 60 s is above 2x its baseline (the median of the last 10 m while healthy)",
        '- the max of rdma_hw_counter_rate{counter=~"local_ack_timeout_err|out_of_sequence|packet_seq_err"} '
        "over 60 s is above 1/s",
        "for 15 s in a row, it 1. switches the deep probe rdma_qp on for 5 m at most",
        "A change is undone 5 m after it was made and when the controller shuts down, not when the rule clears",
        "then a 15 m cooldown; at most 2 changes an hour.",
        "rule qp-completion-slow: when, for one device and queue pair (by: dev, qp, per job where several jobs run), "
        "the max of "
        'rdma_qp_completion_latency_us{quantile="0.99"} over 30 s is above 50 us for 10 s in a row, '
        'it 1. sends a critical alert "RDMA queue pair completions above 50 us',
        "note: policy rdma-deep-tracing requires rdma: idle on this node: no RDMA device",
    )
    with_rdma = said(repo_root, "rdma-deep-tracing", node(tmp_path / "rdma", rdma=True))
    assert "idle on this node" not in with_rdma
    assert "from probe rdma_qp: not here: no RDMA device" not in with_rdma


NESTED = """\
policies:
  - name: nested
    rules:
      - name: deep
        by: [trainer]
        when:
          any:
            - {signal: numa_remote_ratio, agg: mean, window: 30s, op: ">", threshold: 0.5}
            - all:
                - {signal: dataloader_read_latency_us, match: {quantile: "0.99"}, agg: p99, window: 20s,
                   op: ">=", threshold: 2x baseline, baseline: 5m}
                - any:
                    - {signal: numa_cross_migrations_total, agg: rate, window: 1m, op: ">", threshold: 0.1}
                    - {signal: dataloader_reads_total, agg: count, window: 10s, op: "<", threshold: 3}
            - {signal: dataloader_runq_latency_us, match: {quantile: "0.5"}, agg: last, window: 250ms,
               op: "!=", threshold: 7}
        actions:
          - actuator: log
            params: {message: nested}
"""


def _tree(lines: list[str]):
    """Read the rendered condition block back: ('all'|'any', [items]) or a condition's text."""
    def parse(i: int, indent: int):
        text = lines[i].strip().removeprefix("- ")
        if not text.endswith(" of:"):
            return text, i + 1
        kind, items, j = text.split()[0], [], i + 1
        while j < len(lines) and len(lines[j]) - len(lines[j].lstrip()) > indent:
            item_indent = len(lines[j]) - len(lines[j].lstrip())
            assert lines[j].lstrip().startswith("- "), lines[j]
            item, j = parse(j, item_indent)
            items.append(item)
        return (kind, items), j
    tree, end = parse(0, len(lines[0]) - len(lines[0].lstrip()))
    assert end == len(lines), lines[end:]
    return tree


def _shape(expr):
    if isinstance(expr, Combo):
        return (expr.kind, [_shape(item) for item in expr.items])
    return expr.signal


def _signals(tree):
    """The rendered tree with each condition's text reduced to its signal name."""
    if isinstance(tree, tuple):
        return (tree[0], [_signals(item) for item in tree[1]])
    return re.search(r" of (\w+)(?:\{| over )", tree).group(1)


def test_nested_any_all_render_as_written(tmp_path):
    path = tmp_path / "nested.yaml"
    path.write_text(NESTED)
    policy = load_policies([str(path)])[0]
    lines = explain([policy], node(tmp_path), False).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  rule deep:"))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("    as soon as it holds"))
    joined = []          # a wrapped condition's continuation lines belong to the line above
    for line in lines[start + 1:end]:
        if joined and not line.lstrip().startswith("- ") and not line.strip().endswith(" of:"):
            joined[-1] += " " + line.strip()
        else:
            joined.append(line)
    expected = ("any", ["numa_remote_ratio",
                        ("all", ["dataloader_read_latency_us",
                                 ("any", ["numa_cross_migrations_total", "dataloader_reads_total"])]),
                        "dataloader_runq_latency_us"])
    assert _shape(policy.rules[0].when) == expected
    assert _signals(_tree(joined)) == expected, "\n".join(joined)
    assert_says(
        " ".join(joined),
        '- the p99 of dataloader_read_latency_us{quantile="0.99"} over 20 s is at or above 2x its baseline '
        "(the median of the last 5 m while healthy)",
        "- the rate per second of numa_cross_migrations_total over 60 s is above 0.1/s",
        "- the number of samples of dataloader_reads_total over 10 s is below 3",
        '- the last value of dataloader_runq_latency_us{quantile="0.5"} over 250 ms is not equal to 7 us',
    )


KEPT_AND_STOPPED = """\
policies:
  - name: odd-rules
    mode: enforce
    rules:
      - name: never-escalates
        when: {signal: step_time_ms, agg: max, window: 30s, op: ">", threshold: 400}
        actions:
          - actuator: sysctl
            params: {key: vm.swappiness, value: "10"}
          - actuator: alert
        escalate: false
        verify:
          when: {signal: step_time_ms, agg: max, window: 30s, op: "<", threshold: 300}
          timeout: 2m
        rollback: {on: [clear], on_restart: adopt}
      - name: kept-for-good
        when: {signal: block_small_io_ratio, agg: mean, window: 1m, op: ">", threshold: 0.9}
        actions:
          - actuator: affinity
            params: {cpus: [0, 1, 2, 5], reserved_cpus: [1]}
        rollback: never
"""


def test_escalation_off_kept_changes_and_no_receiver(tmp_path):
    path = tmp_path / "odd.yaml"
    path.write_text(KEPT_AND_STOPPED)
    policies = load_policies([str(path)])
    text = " ".join(explain(policies, node(tmp_path), receiver=False).split())
    assert_says(
        text,
        "as soon as it holds, it 1. sets the kernel tunable vm.swappiness to 10",
        "it then checks for up to 2 m that the max of step_time_ms over 30 s is below 300 ms",
        "(escalate is false: action 2 never runs)",
        "if that check fails, it keeps the change (rollback has no verify-failed) and stops there.",
        "A change is undone when the rule clears; a controller restarted while it is applied adopts it",
        "It clears as soon as the condition is false, and resolves its alerts; no cooldown.",
        "1. re-pins every thread of the selected DataLoader workers to CPUs 0-2,5, leaving CPUs 1 free",
        "Its changes are kept (rollback: never)",
        "sends alerts, but no alert receiver is configured",
    )
    assert "2. sends" not in text
    with_receiver = " ".join(explain(policies, node(tmp_path), receiver=True).split())
    assert "no alert receiver is configured" not in with_receiver


def test_cli_explains_one_policy_by_name(repo_root, cli):
    r = cli("explain", str(repo_root / "policies"), "--policy-name", "nccl-congestion-dscp")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("nccl-congestion-dscp (")
    assert "dataloader-starvation" not in r.stdout
    assert "retags the egress tcp flows on ports 443 out of eth0 with DSCP CS1 (8)" in " ".join(r.stdout.split())


def test_cli_explains_a_directory(repo_root, cli):
    r = cli("explain", str(repo_root / "policies"))
    assert r.returncode == 0, r.stderr
    heads = [line.split(" ")[0] for line in r.stdout.splitlines() if line and not line.startswith(" ")]
    assert heads == [p.name for p in load_policies([str(repo_root / "policies")])]
    assert {"dataloader-starvation", "gpu-submit-gap", "rdma-deep-tracing"} <= set(heads)


@pytest.mark.parametrize("name, hint", [("dataloader-starve", "did you mean 'dataloader-starvation'?"),
                                        ("zzz", "(there: dataloader-numa-repin, ")])
def test_cli_unknown_policy_name_is_one_error(repo_root, name, hint, cli):
    r = cli("explain", str(repo_root / "policies"), "--policy-name", name)
    assert r.returncode == 1
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: no policy '{name}'") and hint in lines[0], r.stderr


BAD = """\
policies:
  - name: bad
    rules:
      - name: r
        when: {signal: step_time_m, agg: max, window: 30s, op: ">", threshold: 400}
        for: 15 sec
        actions:
          - actuator: alert
"""


def test_cli_bad_file_gives_located_errors_and_exit_1(tmp_path, cli):
    f = tmp_path / "bad.yaml"
    f.write_text(BAD)
    r = cli("explain", str(f))
    assert r.returncode == 1
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert f"{f}:5:24: error: unknown signal 'step_time_m'; did you mean 'step_time_ms'?" in lines, r.stderr
    assert any(line.startswith(f"{f}:6:14: error: 'for'") for line in lines), r.stderr
    assert lines[-1] == "error: 2 error(s) in policy files"
    assert "Traceback" not in r.stderr


def test_cli_missing_file_is_a_located_error(tmp_path, cli):
    r = cli("explain", str(tmp_path / "nope.yaml"))
    assert r.returncode == 1
    assert r.stderr.splitlines() == [f"{tmp_path / 'nope.yaml'}:1:1: error: no such file or directory",
                                     "error: 1 error(s) in policy files"]


NEEDS_PROMQL = """\
policies:
  - name: needs-promql
    mode: alert-only
    requires: [promql]
    rules:
      - name: gpu-low
        when: {signal: gpu_utilization_pct, agg: mean, window: 60s, op: "<", threshold: 50}
        actions:
          - actuator: alert
"""


def test_cli_promql_config_counts_its_signals_as_produced(tmp_path, cli):
    policy = tmp_path / "p.yaml"
    policy.write_text(NEEDS_PROMQL)
    r = cli("--webhook-url", "http://127.0.0.1:9/hook", "explain", str(policy))
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert_says(text, "It needs a PromQL source (requires: promql)",
                "from a PromQL source (a query of --promql-config against the cluster's Prometheus): not here: "
                "no PromQL source configured",
                "note: policy needs-promql requires promql: idle on this node: no PromQL source configured")
    config = tmp_path / "promql.yaml"
    config.write_text("prometheus: http://127.0.0.1:9\nqueries:\n"
                      "  - {signal: gpu_utilization_pct, query: 'avg by (gpu) (DCGM_FI_DEV_GPU_UTIL)', "
                      "labels: {gpu: gpu}}\n")
    r = cli("--webhook-url", "http://127.0.0.1:9/hook", "explain", str(policy), "--promql-config", str(config))
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "Prometheus): can run here" in text
    assert "idle on this node" not in text and "readiness here: nothing keeps it from working on this node." in text
    assert r.stderr.startswith(f"{config}:3:") and ": warning: the queries are not checked" in r.stderr


def test_cli_bad_promql_config_is_a_located_error(repo_root, tmp_path, cli):
    config = tmp_path / "promql.yaml"
    config.write_text("prometheus: http://127.0.0.1:9\nqueries:\n  - {signal: step_time_mss, query: up}\n")
    r = cli("explain", str(repo_root / "policies"), "--promql-config", str(config))
    assert r.returncode == 1
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert lines[0].startswith(f"{config}:3:") and ": error: unknown signal 'step_time_mss'" in lines[0], r.stderr
    assert lines[-1] == f"error: 1 error(s) in {config}"


def test_a_fleet_rollout_and_budget_are_said_with_what_they_need(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(
        "policies:\n  - name: canary\n    mode: enforce\n"
        "    rollout: {stages: [1, '25%', all], promote_after: 3, success_rate: '80%', window: 5}\n"
        "    budget: {max_nodes: 2, per: job}\n    rules:\n      - name: r\n        by: [job]\n"
        "        when: {signal: step_time_ms, agg: max, window: 2s, op: '>', threshold: 300}\n"
        "        actions: [{actuator: sysctl, params: {key: kernel.numa_balancing, value: '0'}}]\n"
        "        verify: {when: {signal: step_time_ms, agg: max, window: 10s, op: '<', threshold: 300}, "
        "timeout: 30s}\n        rollback: {on: [verify-failed, shutdown]}\n")
    text = " ".join(explain(load_policies([str(path)]), node(tmp_path), False).split())
    assert_says(text, "Across the fleet it is enforced stage by stage: 1 node, then 25 %, then all; a stage "
                      "widens after 3 verified remediation(s) with at least 80 % of the fleet's last 5 verified",
                "until an operator runs reflexarc fleet reset canary --reason TEXT",
                "Its fleet budget: at most 2 nodes at once per job make its changes", "needs run --fleet-etcd")
    plain = [p for p in load_policies([str(path)]) if p.name == "canary"][0]
    plain.rollout = plain.budget = None
    assert "Across the fleet" not in explain([plain], node(tmp_path), False) and "budget" not in \
        explain([plain], node(tmp_path), False), "a policy of one node says nothing of a fleet"
