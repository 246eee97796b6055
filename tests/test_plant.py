"""The simulated plant, its scenarios and simulated actuators, and the built-in
policies played against them in simulated time."""
from __future__ import annotations

import statistics
import textwrap
from pathlib import Path

import pytest

from reflexarc.actuators.base import PermanentActuatorError, Target
from reflexarc.actuators.specs import SPECS
from reflexarc.controller.policy.loader import load_policies
from reflexarc.controller.signals.catalogue import CATALOGUE
from reflexarc.simulations import (Expectation, ExpectedAction, Plant, ScenarioError, check_expectation,
                                   list_scenarios, load_scenario)
from reflexarc.simulations.params import covers

SCENARIOS = ("numa-remote-worker", "dataloader-starvation", "rdma-qp-slow", "nccl-congestion", "gpu-submit-gap",
             "unfixable", "flapping")
TRAINER = Target({"trainer": "4100"}, {"processes": ["pt_data_worker"]})   # owns the slow worker 4102


def run(plant: Plant, start: float, end: float, step: float = 1.0) -> list[tuple]:
    samples = []
    t = start
    while t <= end + 1e-9:
        plant.step(t, lambda name, labels, value, ts: samples.append((name, labels, value, ts)))
        t += step
    return samples


def values(samples, name: str, **labels) -> list[float]:
    return [v for n, lab, v, _ in samples if n == name and all(lab.get(k) == w for k, w in labels.items())]


def write_scenario(tmp_path: Path, body: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body).lstrip())
    return path


MINIMAL = """
    description: a small scenario for tests
    duration: 2m
    policies: [dataloader-numa.yaml]
    signals:
      - {name: step_time_ms, labels: {job: j, rank: "0"}, baseline: 100}
    faults:
      - name: slow
        onset: 60s
        affects: {signal: step_time_ms, factor: 2}
    expect:
      enforce: {fixed: false}
"""


# --- the shipped scenarios ----------------------------------------------------------

def test_every_scenario_ships_with_description_expectations_and_loadable_policies():
    listed = dict(list_scenarios())
    assert set(SCENARIOS) <= set(listed)
    for name in SCENARIOS:
        sc = load_scenario(name)
        assert sc.name == name and sc.path.stem == name
        assert listed[name] == sc.description and len(sc.description) > 40
        assert sc.duration == 600.0 and sc.tick == 1.0
        assert {"enforce", "dry-run"} <= set(sc.expect)
        assert sc.faults and all(f.onset >= 120 for f in sc.faults), "faults need a healthy baseline first"
        assert load_policies(sc.policies), name


def test_scenario_series_use_catalogued_signals_with_their_labels_and_kind():
    for name in SCENARIOS:
        for s in load_scenario(name).series:
            spec = CATALOGUE[s.name]
            # every label the scenario gives is declared; a declared label may be missing, as live: pod
            # only on a pod's processes, rank only where discovery found one, pid and trainer only on
            # the probes' step signals
            assert set(s.labels) <= set(spec.labels), (name, s.name, s.labels)
            assert set(spec.labels) - {"pod", "rank", "pid", "trainer"} <= set(s.labels), (name, s.name, s.labels)
            assert s.kind == spec.kind, (name, s.name)


def test_builtin_policy_files_start_with_the_schema_comment_and_load():
    files = sorted((Path(__file__).resolve().parents[1] / "policies").glob("*.yaml"))
    assert {f.name for f in files} >= {"dataloader-numa.yaml", "dataloader-starvation.yaml",
                                       "nccl-congestion-dscp.yaml", "rdma-deep-tracing.yaml", "gpu-gap-alert.yaml"}
    for f in files:
        assert f.read_text().startswith("# yaml-language-server: $schema=schema.json\n"), f.name
    modes = {p.name: p.mode for p in load_policies([str(f) for f in files])}
    assert modes["gpu-submit-gap"] == "alert-only"
    assert modes["dataloader-numa-repin"] == modes["dataloader-starvation"] == "dry-run"
    assert modes["nccl-congestion-dscp"] == "dry-run"


# --- signals --------------------------------------------------------------------------

def test_same_seed_same_samples_other_seed_other_noise():
    sc = load_scenario("numa-remote-worker")
    a = run(Plant(sc, seed=5), 0, 240)
    b = run(Plant(sc, seed=5), 0, 240)
    c = run(Plant(sc, seed=6), 0, 240)
    assert a == b
    assert [s[2] for s in a] != [s[2] for s in c]
    assert [s[:2] for s in a] == [s[:2] for s in c]


def test_every_series_is_emitted_every_tick_with_the_node_label():
    sc = load_scenario("numa-remote-worker")
    samples = run(Plant(sc), 0, sc.duration)
    assert len(samples) == len(sc.series) * 601
    assert {lab["node"] for _, lab, _, _ in samples} == {"gpu-node-07"}


def test_fault_changes_only_its_series_from_onset():
    plant = Plant(load_scenario("numa-remote-worker"))
    samples = run(plant, 0, 600)
    before = [s for s in samples if s[3] < 180]
    after = [s for s in samples if s[3] >= 180]
    p99 = dict(quantile="0.99")
    hit = statistics.median(values(after, "dataloader_read_latency_us", pid="4102", **p99))
    base = statistics.median(values(before, "dataloader_read_latency_us", pid="4102", **p99))
    other = statistics.median(values(after, "dataloader_read_latency_us", pid="4101", **p99))
    assert 165 < base < 195 and 165 < other < 195
    assert 3.6 < hit / base < 4.4
    cross = values(samples, "numa_cross_migrations_total", pid="4102")
    assert cross[179] == 0 and cross[-1] > 100          # ~0.4/s for 420 s
    assert values(samples, "numa_cross_migrations_total", pid="4101")[-1] == 0
    reads = values(samples, "dataloader_reads_total", pid="4101")
    assert all(b >= a for a, b in zip(reads, reads[1:])) and 600 * 800 < reads[-1] < 600 * 900


def test_ramp_and_flap_shapes(tmp_path):
    path = write_scenario(tmp_path, MINIMAL.replace("onset: 60s", "onset: 60s\n        shape: ramp\n        ramp: 20s"))
    plant = Plant(load_scenario(path))
    steps = dict((ts, v) for _, _, v, ts in run(plant, 0, 100))
    assert steps[59] == 100 and steps[60] == 100 and steps[70] == pytest.approx(150) and steps[80] == 200
    assert plant.fault_active("slow", 60) and not plant.fault_active("slow", 59)

    path = write_scenario(tmp_path, MINIMAL.replace("onset: 60s", "onset: 60s\n        end: 100s\n        "
                                                                  "shape: flap\n        period: 10s\n        duty: 0.3"))
    plant = Plant(load_scenario(path))
    steps = dict((ts, v) for _, _, v, ts in run(plant, 0, 110))
    assert [steps[t] for t in range(60, 71)] == [200] * 3 + [100] * 7 + [200]
    assert steps[99] == 100 and steps[100] == 100 and steps[92] == 200
    assert plant.fault_active("slow", 61) and not plant.fault_active("slow", 64) and not plant.fault_active("slow", 101)


def test_counter_faults_add_to_the_rate(tmp_path):
    path = write_scenario(tmp_path, """
        description: counter rate test
        duration: 10m
        policies: [dataloader-numa.yaml]
        signals:
          - {name: tcp_retransmits_total, kind: counter, labels: {job: j, flow: f, port: "1"}, baseline: 2}
        faults:
          - {name: loss, onset: 5m, affects: {signal: tcp_retransmits_total, add: 18}}
        expect: {enforce: {fixed: false}}
    """)
    totals = [v for _, _, v, _ in run(Plant(load_scenario(path), seed=3), 0, 600)]
    assert 2 * 300 * 0.8 < totals[300] < 2 * 300 * 1.2
    assert 20 * 300 * 0.9 < totals[600] - totals[300] < 20 * 300 * 1.1


# --- simulated actuators and fixes ------------------------------------------------------

def test_registry_has_a_simulated_stand_in_for_every_actuator():
    plant = Plant(load_scenario("numa-remote-worker"))
    reg = plant.registry()
    assert reg.names() == sorted(SPECS)
    assert plant.registry() is reg
    for name in SPECS:
        assert reg.spec(name) is SPECS[name] and reg.get(name).spec is SPECS[name]


def test_affinity_fixes_only_the_right_training_process_and_the_fault_returns_on_revert():
    plant = Plant(load_scenario("numa-remote-worker"))
    act = plant.registry().get("affinity")
    run(plant, 0, 200)
    assert plant.fault_effective("worker-on-remote-node", 200)

    wrong_node = act.plan(TRAINER, {"node": 1})
    wrong_trainer = act.plan(Target({"trainer": "4200"}, TRAINER.selector), {"node": 0})
    act.apply(wrong_node)
    act.apply(wrong_trainer)
    assert plant.fault_effective("worker-on-remote-node", 200)

    change = act.plan(TRAINER, {"locality": True})      # the plant's job keeps its memory on node 0
    assert change.before == {"cpus": list(range(16, 32))} and change.after == {"cpus": list(range(16))}
    assert "16-31 -> 0-15" in change.summary
    act.apply(change)
    assert not plant.fault_effective("worker-on-remote-node", 201)
    fixed = run(plant, 201, 300)
    assert max(values(fixed[60 * 27:], "dataloader_read_latency_us", pid="4102", quantile="0.99")) < 400
    assert plant.fixed and plant.unfixed == []

    act.revert(change)
    assert act.read_current(TRAINER) == change.before
    broken = run(plant, 301, 360)
    assert statistics.median(values(broken, "dataloader_read_latency_us", pid="4102", quantile="0.99")) > 600
    assert plant.unfixed == ["worker-on-remote-node"] and not plant.fixed


def test_plan_changes_nothing_apply_is_idempotent_revert_restores_exactly():
    plant = Plant(load_scenario("dataloader-starvation"))
    reg = plant.registry()
    job = Target({"job": "llama"}, {"interfaces": ["eth0"], "ports": [[443, 443]]})
    cases = [
        ("affinity", Target({"pid": "5201"}, {"processes": ["pt_data_worker"]}), {"cpus": [0, 1, 2, 3]}),
        ("dscp", job, {"dscp": "CS1"}),
        ("deep_tracing", job, {"probe": "rdma_qp", "ttl": "5m"}),
        ("framework_hook", job, {"handler": "dataloader.prefetch", "args": {"prefetch_factor": 8}}),
        ("sysctl", job, {"key": "kernel.numa_balancing", "value": "0"}),
    ]
    for name, target, params in cases:
        act = reg.get(name)
        start = act.read_current(target, params)
        change = act.plan(target, params)
        assert change.before == start and not change.noop, name
        assert act.read_current(target, params) == start and plant.applied == [], name
        act.apply(change)
        act.apply(change)
        assert plant.applied == [change], name
        assert act.plan(target, params).before != start, name
        act.revert(change)
        act.revert(change)
        assert act.read_current(target, params) == start and plant.applied == [], name
    hook = reg.get("framework_hook")
    change = hook.plan(job, {"handler": "dataloader.prefetch", "args": {"prefetch_factor": 8}})
    hook.apply(change)
    again = hook.plan(job, {"handler": "dataloader.prefetch", "args": {"prefetch_factor": 8}})
    assert again.noop and again.before == {"prefetch_factor": 8, "num_workers": 4}


def test_starvation_hook_removes_the_wait_but_reads_stay_slow():
    plant = Plant(load_scenario("dataloader-starvation"))
    hook = plant.registry().get("framework_hook")
    run(plant, 0, 300)
    hook.apply(hook.plan(Target({"job": "llama"}), {"handler": "dataloader.prefetch",
                                                     "args": {"prefetch_factor": 8, "num_workers": 8}}))
    samples = run(plant, 301, 360)
    assert max(values(samples, "dataloader_batch_wait_ms")) < 3
    assert statistics.median(values(samples, "dataloader_read_latency_us", quantile="0.99")) > 1500


def test_dscp_fix_matches_covering_port_ranges_on_the_right_interface():
    plant = Plant(load_scenario("nccl-congestion"))
    dscp = plant.registry().get("dscp")
    target = Target({}, {"interfaces": ["eth0"]})
    for params in ({"dscp": "CS1", "ports": ["8000-9000"]}, {"dscp": "AF41", "ports": ["443"]},
                   {"dscp": "CS1", "ports": ["443"], "interfaces": ["eth1"]}):
        change = dscp.plan(target, params)
        dscp.apply(change)
        assert plant.fault_effective("checkpoint-upload-burst", 300), params
        dscp.revert(change)
    change = dscp.plan(target, {"dscp": 8, "ports": ["400-500"]})
    assert change.after == {"dscp": 8, "class": None} and change.before is None
    dscp.apply(change)
    assert not plant.fault_effective("checkpoint-upload-burst", 300)


def test_cover_rules():
    spec = SPECS["dscp"]
    assert covers(spec, {"dscp": "CS1", "ports": ["443"]}, {"dscp": "8", "ports": [[400, 500]]})
    assert covers(spec, {"protocol": "tcp"}, {"dscp": "EF"})             # a left-out parameter is its default
    assert not covers(spec, {"ports": ["443", "8443"]}, {"ports": ["443"]})
    assert not covers(spec, {"dscp": "CS1"}, {"dscp": "CS2"})
    assert covers(SPECS["framework_hook"], {"handler": "h", "args": {"a": 1}}, {"handler": "h", "args": {"a": 1, "b": 2}})


def test_deep_tracing_reveals_qp_series_until_reverted_or_its_ttl_runs_out():
    plant = Plant(load_scenario("rdma-qp-slow"))
    deep = plant.registry().get("deep_tracing")
    before = run(plant, 0, 200)
    assert not values(before, "rdma_qp_completion_latency_us") and values(before, "step_time_ms")
    assert values(before, "rdma_hw_counter_rate")

    change = deep.plan(Target(), {"probe": "rdma_qp", "ttl": 60})
    deep.apply(change)
    on = run(plant, 201, 230)
    slow = {lab["qp"] for name, lab, v, _ in on
            if name == "rdma_qp_completion_latency_us" and lab["quantile"] == "0.99" and v > 50}
    assert slow == {"453"}
    assert len(values(on, "rdma_qp_completion_latency_us")) == 30 * 12
    assert statistics.median(values(on, "rdma_qp_completion_latency_us", qp="453", dev="mlx5_1",
                                    quantile="0.5")) == pytest.approx(380, rel=0.1)
    assert values(on, "deep_probe_events_per_s")
    deep.revert(change)
    assert deep.read_current(Target(), {"probe": "rdma_qp"}) == change.before
    assert not values(run(plant, 231, 240), "rdma_qp_completion_latency_us")

    deep.apply(deep.plan(Target(), {"probe": "rdma_qp", "ttl": "30s"}))
    tier = run(plant, 241, 300)
    seen = sorted({ts for n, _, _, ts in tier if n == "rdma_qp_completion_latency_us"})
    assert seen[0] == 241 and seen[-1] == 269        # the tier switched itself off after the TTL
    assert deep.read_current(Target(), {"probe": "rdma_qp"})["on"] is False


def test_alerts_are_recorded_with_target_labels_and_cannot_be_taken_back():
    plant = Plant(load_scenario("rdma-qp-slow"))
    alert = plant.registry().get("alert")
    run(plant, 0, 5)
    change = alert.plan(Target({"dev": "mlx5_1", "qp": "453"}), {"severity": "critical", "summary": "QP slow",
                                                                  "labels": {"team": "net"}})
    assert plant.alerts == []
    alert.apply(change)
    alert.revert(change)
    assert plant.alerts == [{"ts": 5.0, "target": "dev=mlx5_1,qp=453", "severity": "critical", "summary": "QP slow",
                             "labels": {"dev": "mlx5_1", "qp": "453", "team": "net"}}]
    assert plant.applied == []


@pytest.mark.parametrize("actuator,target,params,message", [
    ("affinity", TRAINER, {"node": 5}, "NUMA node 5 does not exist"),
    ("affinity", TRAINER, {"device": "0000:99:00.0"}, "no PCI device"),
    ("affinity", Target({"job": "llama"}), {"node": 0}, "needs a pid target"),
    ("affinity", TRAINER, {"cpus": [0, 99]}, "CPUs 99 do not exist"),
    ("affinity", TRAINER, {"node": 0, "cpus": [1]}, "exactly one of"),
    ("dscp", Target({}, {"interfaces": ["eth9"]}), {"dscp": "CS1", "ports": ["443"]}, "eth9 does not exist"),
    ("dscp", Target({}, {"interfaces": ["eth0"]}), {"dscp": "CS1"}, "never retags every flow"),
    ("dscp", Target({}, {"interfaces": ["eth0"]}), {"dscp": "XX", "ports": ["443"]}, "bad DSCP"),
    ("framework_hook", Target(), {"handler": "checkpoint.now"}, "no handler 'checkpoint.now'"),
    ("sysctl", Target(), {"key": "vm.overcommit_memory", "value": "1"}, "is not one of"),
    ("deep_tracing", Target(), {"probe": "rdma_qp"}, "needs parameter 'ttl'"),
    ("alert", Target(), {"severity": "page"}, "'page' is not one of info"),
    ("affinity", TRAINER, {"node": 0, "speed": 3}, "has no parameter 'speed'"),
])
def test_bad_parameters_and_missing_targets_are_permanent_errors(actuator, target, params, message):
    plant = Plant(load_scenario("numa-remote-worker"))
    with pytest.raises(PermanentActuatorError, match=message):
        plant.registry().get(actuator).plan(target, params)


# --- scenario file errors ---------------------------------------------------------------

@pytest.mark.parametrize("old,new,where,message", [
    ("duration: 2m", "duraton: 2m", "2:1", "unknown key 'duraton' in a scenario file; did you mean 'duration'?"),
    ("duration: 2m", "duration: 2 min", "2:11", "'duration': bad duration '2 min'"),
    ("duration: 2m", "duration: 2m\n    duration: 3m", "3:1", "duplicate key 'duration' (first at line 2)"),
    ("signals:", "signals: [", "5:3", "node content"),
    ("[dataloader-numa.yaml]", "[no-such.yaml]", "3:12", "policy file 'no-such.yaml' is not among the built-in"),
    ("[dataloader-numa.yaml]", "[./mine.yaml]", "3:12", "policy file './mine.yaml' is not next to the scenario"),
    ("baseline: 100}", "baseline: 100}\n      - {name: step_time_ms, labels: {job: j, rank: \"0\"}, baseline: 5}",
     "6:5", "is already defined at line 5"),
    ("{signal: step_time_ms", "{signal: mfu_pct", "9:23", "the scenario emits no signal 'mfu_pct'"),
    ("factor: 2}", "factor: 2, match: {rank: \"7\"}}", "9:55", "no series of 'step_time_ms' has labels {'rank': '7'}"),
    ("onset: 60s", "onset: 60s\n        fixed_by: {actuator: affinity, params: {nodes: 0}}", "9:44",
     "actuator 'affinity' has no parameter 'nodes'"),
    ("onset: 60s", "onset: 60s\n        fixed_by: {actuator: alert}", "9:26", "'alert' cannot fix a fault"),
    ("onset: 60s", "onset: 60s\n        period: 10s", "9:5", "'period' only applies to shape 'flap'"),
    ("onset: 60s", "onset: 60s\n        end: 30s", "9:10", "ends (30s) before its onset (60s)"),
    ("enforce: {fixed: false}", "enforce: {fixed: nope}", "11:20", "'fixed': expected true or false"),
    ("enforce: {fixed: false}", "enforced: {fixed: false}", "11:3", "unknown key 'enforced' in 'expect'; "
                                                                    "did you mean 'enforce'?"),
    ("enforce: {fixed: false}", "enforce: {actions: [{actuator: affinity, outcome: done}]}", "11:53",
     "'outcome': expected one of applied"),
])
def test_scenario_errors_point_at_the_place(tmp_path, old, new, where, message):
    assert old in MINIMAL
    path = write_scenario(tmp_path, MINIMAL.replace(old, new, 1), "bad.yaml")
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    text = str(err.value)
    assert text.startswith(f"{path}:{where}: error: "), text
    assert message in text


def test_scenario_by_unknown_name_suggests_one():
    with pytest.raises(ScenarioError, match="no scenario named 'numa-remote'; did you mean 'numa-remote-worker'"):
        load_scenario("numa-remote")


def test_scenario_local_policy_resolves_next_to_the_file(tmp_path):
    builtin = Path(__file__).resolve().parents[1] / "policies" / "dataloader-numa.yaml"
    (tmp_path / "mine.yaml").write_text(builtin.read_text())
    path = write_scenario(tmp_path, MINIMAL.replace("[dataloader-numa.yaml]", "[./mine.yaml, gpu-gap-alert.yaml]"))
    sc = load_scenario(path)
    assert sc.policies == [str(tmp_path / "mine.yaml"), str(builtin.parent / "gpu-gap-alert.yaml")]


# --- expectations -------------------------------------------------------------------------

def test_expectation_check_reports_each_broken_promise():
    plant = Plant(load_scenario("numa-remote-worker"))
    run(plant, 0, 200)
    records = [{"ts": 196, "actuator": "affinity", "outcome": "applied", "rule": "r"},
               {"ts": 300, "actuator": "affinity", "outcome": "applied", "rule": "r"},
               {"ts": 310, "actuator": "alert", "outcome": "notified", "rule": "r"}]
    ok = Expectation(actions=[ExpectedAction("affinity", "applied"), ExpectedAction("alert", "notified", "r")],
                     fixed=False, max_changes=2, alerts=[])
    assert check_expectation(ok, records, plant) == []
    problems = check_expectation(Expectation(actions=[ExpectedAction("alert", "notified"),
                                                      ExpectedAction("affinity", "applied")],
                                             fixed=True, max_changes=1, alerts=[{"pid": "4102"}]), records, plant)
    assert len(problems) == 4
    assert "expected 'affinity applied' (in order)" in problems[0]
    assert "still in effect: worker-on-remote-node" in problems[1]
    assert "at most 1 changes, got 2" in problems[2]
    assert "alert with labels {'pid': '4102'}" in problems[3]
    assert check_expectation(Expectation(actions=[]), records, plant)[0].startswith("expected no actions")


# --- the built-in policies against the scenarios, in simulated time -----------------------

CASES = [(name, mode) for name in SCENARIOS for mode in sorted(load_scenario(name).expect)]


@pytest.mark.parametrize("name,mode", CASES)
def test_scenario_reaches_its_expected_outcome(name, mode):
    from reflexarc.controller.runtime.simulate import run_scenario
    sc = load_scenario(name)
    result = run_scenario(sc, mode=mode)
    actions = result.actions()
    assert check_expectation(sc.expect[mode], actions, result.plant) == [], \
        [(a["ts"], a["actuator"], a["outcome"]) for a in actions]
