"""The PromQL source against a real Prometheus: the test starts Prometheus on
loopback, scraping real HTTP exporters it runs (one shaped like NVIDIA
dcgm-exporter per node, one per training rank of a 3-rank job whose rank 2
straggles), and checks the samples, labels and values the source publishes,
its failures (a bad query, Prometheus down), the configuration's located
errors, readiness, and a controller run whose straggler policy plans the
remediation for rank 2."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, require, spawn_cli
from exporters import DcgmExporter, RankExporter
from prometheus_client import CollectorRegistry
from reflexarc.simulations.testbed.prometheus import BINARY, PrometheusServer

from reflexarc.controller.policy.loader import load_policies
from reflexarc.controller.signals.producers import NodeFacts
from reflexarc.controller.signals.catalogue import why_unproduced
from reflexarc.controller.sources.promql import Kind, PromqlSource, load_checked
from reflexarc.controller.sources.promql_config import PromqlConfigError, load_config, static_type
from reflexarc.controller.policy.readiness import findings, idle_reason

EXAMPLE = ROOT / "docs" / "examples" / "promql.yaml"
STRAGGLER = ROOT / "policies" / "rank-straggler.yaml"
# Rank 2 (on node-b) runs 190 ms before its collective, ranks 0 and 1 (node-a) ~100 ms.
PRE_COLLECTIVE = {0: ("node-a", 100.0), 1: ("node-a", 104.0), 2: ("node-b", 190.0)}
MEDIAN = 104.0


def example_for(tmp_path: Path, url: str, node: str, extra: str = "") -> Path:
    """The shipped example configuration, pointed at the test's Prometheus and node."""
    text = EXAMPLE.read_text().replace("http://prometheus.monitoring.svc:9090", url)
    assert url in text
    path = tmp_path / f"promql-{node}.yaml"
    path.write_text(text.replace("# node: gpu-node-07", f"node: {node}") + extra)
    return path


def config(tmp_path: Path, url: str, queries: str, node: str = "node-a", name: str = "promql.yaml") -> Path:
    path = tmp_path / name
    path.write_text(f"prometheus: {url}\ninterval: 1s\ntimeout: 900ms\nnode: {node}\nqueries:\n{queries}")
    return path


@pytest.fixture(scope="module")
def cluster():
    """Prometheus scraping two nodes' dcgm-exporters and the job's three ranks."""
    require(Path(BINARY).exists(), f"Debian's prometheus at {BINARY} (scripts/bootstrap installs it)")
    dcgm_a, dcgm_b = DcgmExporter("node-a", {0: 87.0, 1: 12.0}), DcgmExporter("node-b", {0: 55.0})
    ranks = [RankExporter("llama", rank, node, ms, step_ms=210.0) for rank, (node, ms) in PRE_COLLECTIVE.items()]
    exporters = [dcgm_a, dcgm_b, *ranks]
    for exporter in exporters:
        exporter.__enter__()
    try:
        with PrometheusServer({"dcgm": [dcgm_a.address, dcgm_b.address], "ranks": [r.address for r in ranks]},
                              honor_labels=("ranks",)) as prom:
            prom.wait_for("DCGM_FI_DEV_GPU_UTIL", lambda r: len(r) == 3)
            prom.wait_for("reflexarc_step_pre_collective_seconds", lambda r: len(r) == 3)
            yield prom
    finally:
        for exporter in exporters:
            exporter.__exit__()


def by_labels(samples):
    return {tuple(sorted(labels.items())): (name, value) for name, labels, value in samples}


# --- the configuration ---------------------------------------------------------------------

@pytest.mark.parametrize("query,kind", [
    ("x[5m]", "matrix"), ("rate(x[5m])[10m:1m]", "matrix"), ("x[5m] offset 1h", "matrix"),
    ("42", "scalar"), ("(1.5e3)", "scalar"), ("scalar(sum(x))", "scalar"), ("time()", "scalar"),
    ('"text"', "string"), ("rate(x[5m])", None), ("x offset 5m", None), ("scalar(x) * y", None),
    ("vector(1)", None), ('x{a="]"}', None), ('label_replace(x, "a", "$1", "b", "(.*)")', None),
])
def test_the_text_of_a_query_says_when_it_is_no_vector(query, kind):
    assert static_type(query) == kind


@pytest.mark.parametrize("body,where,message", [
    ("prometheus: http://p:9090\nqueries:\n  - {signal: gpu_utilisation_pct, query: x}\n", "3:14",
     "unknown signal 'gpu_utilisation_pct'; did you mean 'gpu_utilization_pct'?"),
    ("prometheus: http://p:9090\nqueries:\n  - {signal: step_time_ms, query: x}\n", "3:14",
     "signal 'step_time_ms' is not fed by PromQL (its producers: probe batch_wait (light tier, always on), "
     "the framework hooks); PromQL feeds "),
    ("prometheus: http://p:9090\nqueries:\n  - {signal: gpu_utilization_pct, query: 'x[5m]'}\n", "3:42",
     "the query's result is a matrix, not an instant vector"),
    ("prometheus: http://p:9090\nqueries:\n  - {signal: gpu_utilization_pct, query: '1'}\n", "3:42",
     "the query's result is a scalar, not an instant vector"),
    ("prometheus: http://p:9090\nqueries:\n  - {signal: gpu_utilization_pct, query: x, labels: {gpus: gpu}}\n",
     "3:54", "signal 'gpu_utilization_pct' has no label 'gpus'; did you mean 'gpu'?"),
    ("prometheus: http://p:9090\nqueries:\n  - {signal: gpu_utilization_pct, query: x, labels: {gpu: 0}}\n",
     "3:59", "the result label for 'gpu' must be a Prometheus label name"),
    ("prometheus: http://p:9090\nqueries:\n  - {signal: gpu_utilization_pct, query: 'x{h=\"$HOST\"}'}\n", "3:42",
     "unknown substitution '$HOST' in the query: only $NODE"),
    ("prometheus: http://p:9090\nqueries:\n  - {signal: gpu_utilization_pct, qurey: x}\n", "3:35",
     "unknown key 'qurey' in a query; did you mean 'query'?"),
    ("prometheus: p:9090\nqueries:\n  - {signal: gpu_utilization_pct, query: x}\n", "1:13",
     "'prometheus' must be the http(s) URL of a Prometheus server"),
    ("prometheus: http://p:9090\ninterval: 5s\ntimeout: 5s\nqueries:\n  - {signal: gpu_utilization_pct, query: x}\n",
     "3:10", "'timeout' (5s) must be shorter than 'interval' (5s)"),
    ("prometheus: http://p:9090\ninterval: 5 min\nqueries:\n  - {signal: gpu_utilization_pct, query: x}\n", "2:11",
     "'interval': bad duration '5 min'"),
    ("prometheus: http://p:9090\nqueries: []\n", "2:10", "'queries' is empty"),
    ("queries:\n  - {signal: gpu_utilization_pct, query: x}\n", "1:1",
     "the PromQL configuration is missing required key 'prometheus'"),
    ("", "1:1", "empty file"),
])
def test_configuration_errors_are_located(tmp_path, body, where, message, cli):
    path = tmp_path / "promql.yaml"
    path.write_text(body)
    with pytest.raises(PromqlConfigError) as raised:
        load_config(path)
    assert any(str(d).startswith(f"{path}:{where}: error: {message}") for d in raised.value.diagnostics), \
        "\n".join(map(str, raised.value.diagnostics))
    r = cli("validate", "--promql-config", str(path), str(STRAGGLER))
    assert r.returncode == 1 and f"{path}:{where}: error: {message}" in r.stdout, r.stdout + r.stderr
    assert "Traceback" not in r.stderr


def test_the_example_configuration_substitutes_this_node(tmp_path):
    cfg = load_config(example_for(tmp_path, "http://127.0.0.1:9", "gpu-node-07"))
    assert cfg.interval == 15.0 and cfg.timeout == 5.0 and cfg.node == "gpu-node-07"
    assert cfg.signals == {"gpu_utilization_pct", "rank_pre_collective_ratio"}
    assert cfg.queries[0].expr == 'avg by (gpu) (DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-node-07"})'
    assert "$NODE" not in cfg.queries[1].expr and 'node="gpu-node-07"' in cfg.queries[1].expr


# --- readiness -------------------------------------------------------------------------------

def test_promql_fed_signals_count_as_produced_only_when_configured():
    [policy] = load_policies([str(STRAGGLER)])
    assert policy.requires == ("promql",)
    assert idle_reason(policy, NodeFacts()) == "no PromQL source configured"
    facts = NodeFacts(promql=frozenset({"rank_pre_collective_ratio"}))
    assert idle_reason(policy, facts) is None
    assert why_unproduced("rank_pre_collective_ratio", facts) is None
    assert why_unproduced("nccl_link_latency_us", facts) == \
        "a PromQL source: the PromQL configuration has no query for it"
    assert [f for f in findings([policy], facts, receiver=True) if f.severity != "note"] == []


@pytest.mark.slow
def test_validate_notes_the_straggler_policy_idle_without_a_source_and_checks_it_with_one(tmp_path, cluster, cli):
    r = cli("validate", str(ROOT / "policies"))
    assert r.returncode == 0 and "warning:" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert "policy rank-straggler requires promql: idle on this node: no PromQL source configured" in r.stdout
    cfg = example_for(tmp_path, cluster.url, "node-b")
    r = cli("--webhook-url", "http://127.0.0.1:9/hook", "validate", "--promql-config", str(cfg), str(STRAGGLER))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rank-straggler" not in r.stdout and "warning:" not in r.stdout, r.stdout   # produced: no note
    # node-c has neither a GPU nor a rank: both queries match nothing, which is a note, not a problem
    cfg_c = example_for(tmp_path, cluster.url, "node-c")
    r = cli("validate", "--promql-config", str(cfg_c), str(STRAGGLER))
    notes = [line for line in r.stdout.splitlines() if ": note: the query matches no series now" in line]
    assert len(notes) == 2 and notes[0].startswith(f"{cfg_c}:14:12: note:"), r.stdout


@pytest.mark.slow
def test_queries_prometheus_refuses_are_located_errors_at_load(tmp_path, cluster, cli):
    path = config(tmp_path, cluster.url,
                  "  - {signal: gpu_utilization_pct, query: 'avg by (gpu) (DCGM_FI_DEV_GPU_UTIL'}\n"
                  "  - {signal: nccl_link_latency_us, query: '1 + 1'}\n")
    r = cli("validate", "--promql-config", str(path), str(STRAGGLER))
    assert r.returncode == 1, r.stdout + r.stderr
    assert (f"{path}:6:42: error: Prometheus refuses the query: HTTP 400: bad_data: invalid parameter "
            '"query": 1:35: parse error: unclosed left parenthesis') in r.stdout, r.stdout
    assert f"{path}:7:43: error: the query is not usable: the result is a scalar, not an instant vector" in r.stdout
    r = cli("--state-dir", str(tmp_path / "state"), "run", "--no-probes", "--promql-config", str(path),
            "--policy", str(STRAGGLER), "--duration", "1")
    assert r.returncode == 1 and r.stderr.splitlines()[-1] == f"error: 2 error(s) in {path}", r.stderr


def test_prometheus_unreachable_at_load_is_a_warning_not_an_error(tmp_path):
    path = config(tmp_path, "http://127.0.0.1:9", "  - {signal: gpu_utilization_pct, query: x}\n")
    checked = load_checked(str(path))
    assert checked.config is not None
    [d] = checked.diagnostics
    assert d.severity == "warning" and "the queries are not checked: http://127.0.0.1:9 did not answer" in d.message


# --- the source --------------------------------------------------------------------------------

@pytest.mark.slow
def test_dcgm_gpu_utilisation_through_promql(tmp_path, cluster):
    """The shipped example's query over dcgm-exporter's metrics: this node's GPUs only,
    labelled gpu and node; every other label dropped, also without an aggregation."""
    extra = ('  - signal: gpu_utilization_pct\n'
             '    query: DCGM_FI_DEV_GPU_UTIL{Hostname="$NODE"} * 0 + 1\n'      # every dcgm label kept, then dropped
             '    labels: {gpu: gpu, job: modelName}\n')
    src = PromqlSource(load_config(example_for(tmp_path, cluster.url, "node-a", extra)))
    result = src.evaluate()
    assert result.failures == []
    gpu = [s for s in result.samples if s[0] == "gpu_utilization_pct"]
    assert sorted(gpu, key=repr) == sorted([
        ("gpu_utilization_pct", {"node": "node-a", "gpu": "0"}, 87.0),
        ("gpu_utilization_pct", {"node": "node-a", "gpu": "1"}, 12.0),
        ("gpu_utilization_pct", {"node": "node-a", "gpu": "0", "job": DcgmExporter.MODEL}, 1.0),
        ("gpu_utilization_pct", {"node": "node-a", "gpu": "1", "job": DcgmExporter.MODEL}, 1.0),
    ], key=repr)
    b = PromqlSource(load_config(example_for(tmp_path, cluster.url, "node-b"))).evaluate()
    assert [s for s in b.samples if s[0] == "gpu_utilization_pct"] == \
        [("gpu_utilization_pct", {"node": "node-b", "gpu": "0"}, 55.0)]


@pytest.mark.slow
def test_rank_ratio_over_the_jobs_median_names_the_straggler_on_its_node(tmp_path, cluster):
    b = PromqlSource(load_config(example_for(tmp_path, cluster.url, "node-b"))).evaluate()
    [(name, labels, value)] = [s for s in b.samples if s[0] == "rank_pre_collective_ratio"]
    assert labels == {"node": "node-b", "job": "llama", "rank": "2"}
    assert value == pytest.approx(190.0 / MEDIAN)
    a = PromqlSource(load_config(example_for(tmp_path, cluster.url, "node-a"))).evaluate()
    ratios = {labels["rank"]: value for name, labels, value in a.samples if name == "rank_pre_collective_ratio"}
    assert ratios == {"0": pytest.approx(100.0 / MEDIAN), "1": pytest.approx(1.0)}


@pytest.mark.slow
def test_a_failing_query_is_counted_logged_once_and_the_others_go_on(tmp_path, cluster, caplog):
    registry = CollectorRegistry()
    path = config(tmp_path, cluster.url,
                  "  - {signal: nccl_link_latency_us, query: 'sum(DCGM_FI_DEV_GPU_UTIL) by (gpu) / on(x) y{'}\n"
                  "  - {signal: nccl_link_latency_us, query: '1 + 1'}\n"
                  "  - {signal: gpu_utilization_pct, query: 'DCGM_FI_DEV_GPU_UTIL', labels: {job: modelName}}\n"
                  "  - {signal: rank_pre_collective_ratio, query: 'reflexarc_step_pre_collective_seconds{rank=\"1\"} / 0.104',"
                  " labels: {job: job, rank: rank}}\n")
    src = PromqlSource(load_config(path), registry)
    caplog.set_level(logging.WARNING, "reflexarc.promql")
    rounds = [src.evaluate() for _ in range(3)]
    for result in rounds:
        assert [(f.signal, f.kind) for f in result.failures] == [
            ("nccl_link_latency_us", Kind.BAD_QUERY), ("nccl_link_latency_us", Kind.NOT_A_VECTOR),
            ("gpu_utilization_pct", Kind.DUPLICATE_SERIES)]
        assert ("rank_pre_collective_ratio", {"node": "node-a", "job": "llama", "rank": "1"},
                pytest.approx(1.0)) in result.samples
    count = registry.get_sample_value
    assert count("reflexarc_promql_errors_total", {"signal": "nccl_link_latency_us", "kind": "bad_query"}) == 3
    assert count("reflexarc_promql_errors_total", {"signal": "nccl_link_latency_us", "kind": "not_a_vector"}) == 3
    assert count("reflexarc_promql_errors_total", {"signal": "gpu_utilization_pct", "kind": "duplicate_series"}) == 3
    assert count("reflexarc_promql_retries_total", {"kind": "bad_query"}) is None, "a bad query is never retried"
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 3, logged                                  # one line per distinct error, not per round
    assert any("(bad_query): HTTP 400: bad_data" in line for line in logged), logged
    assert any("maps onto" in line and "aggregate by the mapped labels" in line for line in logged), logged
    # the folded query still gave its first series
    assert sum(1 for s in rounds[0].samples if s[0] == "gpu_utilization_pct") == 1


@pytest.mark.slow
def test_prometheus_down_is_retried_then_reported_and_the_source_recovers(tmp_path, caplog):
    require(Path(BINARY).exists(), f"Debian's prometheus at {BINARY}")
    with DcgmExporter("node-a", {0: 87.0}) as dcgm, PrometheusServer({"dcgm": [dcgm.address]}) as prom:
        prom.wait_for("DCGM_FI_DEV_GPU_UTIL", lambda r: len(r) == 1)
        registry = CollectorRegistry()
        cfg = load_config(config(tmp_path, prom.url,
                                 "  - {signal: gpu_utilization_pct, query: DCGM_FI_DEV_GPU_UTIL, labels: {gpu: gpu}}\n"
                                 "  - {signal: nccl_link_latency_us, query: 'DCGM_FI_DEV_GPU_UTIL * 10'}\n"))
        src = PromqlSource(cfg, registry, attempts=3, backoff=0.05)
        caplog.set_level(logging.WARNING, "reflexarc.promql")
        assert src.evaluate().failures == []
        prom.stop()
        down = [src.evaluate() for _ in range(2)]
        for result in down:
            assert result.samples == []
            assert [(f.signal, f.kind) for f in result.failures] == [
                ("gpu_utilization_pct", Kind.UNREACHABLE), ("nccl_link_latency_us", Kind.UNREACHABLE)]
            assert "gave up after 3 attempts" in result.failures[0].message
        count = registry.get_sample_value
        # 2 retries per round, for the first query only: the rest of the round is not tried
        assert count("reflexarc_promql_retries_total", {"kind": "unreachable"}) == 4
        assert count("reflexarc_promql_errors_total", {"signal": "gpu_utilization_pct", "kind": "unreachable"}) == 2
        reported = [r.getMessage() for r in caplog.records]
        assert len(reported) == 2 and all("(unreachable)" in line for line in reported), reported
        prom.start()
        back = src.evaluate()
        assert back.failures == [] and ("gpu_utilization_pct", {"node": "node-a", "gpu": "0"}, 87.0) in back.samples
        assert sum("works again" in r.getMessage() for r in caplog.records) == 2


@pytest.mark.slow
def test_polls_never_wait_for_prometheus_and_rounds_follow_the_interval(tmp_path, cluster):
    """The live loop's side: rounds run on the worker thread, at most one per
    ``interval`` of the loop's clock, each round's samples handed over once."""
    cfg = load_config(config(tmp_path, cluster.url,
                             "  - {signal: gpu_utilization_pct, query: 'DCGM_FI_DEV_GPU_UTIL{Hostname=\"$NODE\"}',"
                             " labels: {gpu: gpu}}\n"))
    src = PromqlSource(cfg)
    try:
        got = src.poll(100.0)                            # asks for the first round; does not wait for it
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
            got = src.poll(100.5)                        # within the interval: no new round asked
        assert sorted(labels["gpu"] for _, labels, _ in got) == ["0", "1"]
        time.sleep(0.5)
        assert src.poll(100.9) == [], "a round's samples are handed over once, and no round was asked"
        again = src.poll(101.0)                          # the interval passed: a second round is asked for
        deadline = time.monotonic() + 30
        while not again and time.monotonic() < deadline:
            time.sleep(0.05)
            again = src.poll(101.5)
        assert len(again) == 2
    finally:
        src.close()
    assert not src._thread.is_alive()


# --- a controller run ----------------------------------------------------------------------------

class RankTwo:
    """Rank 2 of job llama on this node, serving the framework hooks: its loop
    waits ~40 ms a step for batches, and it registers dataloader.prefetch."""

    def __init__(self, hook_dir: Path) -> None:
        from reflexarc.actuators.hooks import Hooks
        self.settings = {"prefetch_factor": 2, "num_workers": 4}
        self.hooks = Hooks.start(job="llama", rank=2, hook_dir=str(hook_dir))
        self.hooks.handler("dataloader.prefetch", undo=lambda **kw: None,
                           preview=lambda **kw: {"before": dict(self.settings), "after": {**self.settings, **kw}})(
            lambda **kw: self.settings.update(kw))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        step = 0
        while not self._stop.wait(0.2):
            step += 1
            self.hooks.report(step_time_ms=210.0, dataloader_batch_wait_ms=40.0, iteration=step)
            self.hooks.step_boundary()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.hooks.close()


@pytest.mark.slow
def test_the_straggler_policy_plans_the_prefetch_hook_for_rank_2_in_a_controller_run(tmp_path, cluster):
    hooks, state = tmp_path / "hooks", tmp_path / "state"
    hooks.mkdir(mode=0o755)
    os.chmod(hooks, 0o755)
    cfg = example_for(tmp_path, cluster.url, "node-b").read_text().replace("interval: 15s", "interval: 1s") \
        .replace("timeout: 5s", "timeout: 900ms")
    (tmp_path / "promql.yaml").write_text(cfg)
    audit = state / "audit.jsonl"
    rank = RankTwo(hooks)
    ctl = spawn_cli("--state-dir", str(state), "--hook-dir", str(hooks), "run", "--no-probes", "--mode", "dry-run",
                    "--promql-config", str(tmp_path / "promql.yaml"), "--policy", str(STRAGGLER), "--interval", "1",
                    "--duration", "150", "--kill-switch", str(tmp_path / "disable"), "--audit", str(audit),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    planned = None
    try:
        deadline = time.monotonic() + 140
        while time.monotonic() < deadline and planned is None and ctl.poll() is None:
            time.sleep(1)
            if audit.exists():
                planned = next((r for r in map(json.loads, audit.read_text().splitlines())
                                if r["kind"] == "action" and r["outcome"] == "planned"), None)
    finally:
        ctl.send_signal(signal.SIGTERM)
        out, err = ctl.communicate(timeout=60)
        rank.close()
    records = [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []
    assert planned is not None, f"no planned action; controller: {err[-2000:]}; last records: {records[-3:]}"
    assert "warning:" not in err and "error" not in err.lower(), err
    assert planned["policy"] == "rank-straggler" and planned["rule"] == "straggler-loader-wait"
    assert planned["actuator"] == "framework_hook" and planned["mode"] == "dry-run"
    assert planned["target"] == "job=llama,rank=2"
    assert planned["change"]["after"]["endpoints"][0]["state"] == {"prefetch_factor": 8, "num_workers": 8}, \
        "the plan came from rank 2's live hook"
    firing = next(r for r in records if r["kind"] == "transition" and r["to"] == "firing")
    evidence = {e["signal"]: e["value"] for e in firing["evidence"]}
    assert evidence["rank_pre_collective_ratio"] == pytest.approx(190.0 / MEDIAN)     # from Prometheus
    assert evidence["dataloader_batch_wait_ms"] == pytest.approx(40.0)                # from the hooks
    assert rank.settings == {"prefetch_factor": 2, "num_workers": 4}, "dry-run changes nothing"
    assert not [r for r in records if r["kind"] == "action" and r["outcome"] == "applied"]
