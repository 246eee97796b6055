"""The YAML policy loader: valid files become the model; every mistake is one located
diagnostic; nothing a file contains makes ``validate_paths`` raise."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reflexarc.actuators.specs import SPECS
from reflexarc.core.diagnostics import Diagnostic
from reflexarc.controller.policy.loader import PolicyError, load_policies, validate_paths
from reflexarc.controller.policy.model import Combo, Condition

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "policies"
VALID = FIXTURES / "valid"
INVALID = FIXTURES / "invalid"
LOADER_ONLY = FIXTURES / "loader-only"


def _errors(diagnostics):
    return [d for d in diagnostics if d.severity == "error"]


def _where(diagnostics):
    return [(d.line, d.col, d.message) for d in diagnostics]


def _write(tmp_path: Path, name: str, text: str | bytes) -> str:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return str(path)


# ---- valid files -----------------------------------------------------------------------------

def test_valid_fixtures_load_into_the_model():
    policies = {p.name: p for p in load_policies([str(VALID)])}
    assert sorted(policies) == ["all-params", "collective-dscp", "dataloader-numa-repin", "slow-link-tracing",
                                "step-time-log"]

    numa = policies["dataloader-numa-repin"]
    assert numa.mode == "enforce"
    assert numa.selector.match == {"job": "llama"}
    assert numa.selector.processes == ("pt_data_worker",)
    assert numa.selector.pids == (1234,)
    assert numa.selector.cgroup == "/sys/fs/cgroup/job.slice"
    assert numa.selector.ports == ((29500, 29510), (12345, 12345))
    rule = numa.rules[0]
    assert rule.name == "loader-p99" and rule.by == ("pid",)
    assert (rule.for_, rule.clear_for, rule.cooldown) == (15.0, 60.0, 300.0)
    assert isinstance(rule.when, Combo) and rule.when.kind == "all"
    latency, migrations = rule.when.items
    assert (latency.signal, latency.agg, latency.window, latency.op) == ("dataloader_read_latency_us", "max", 30.0, ">")
    assert latency.relative and latency.threshold == 3.0 and latency.baseline_window == 600.0
    assert latency.match == {"quantile": "0.99"}
    assert not migrations.relative and migrations.threshold == 0.0 and migrations.agg == "delta"
    assert [(a.actuator, a.params) for a in rule.actions] == [
        ("affinity", {"node": 0}), ("alert", {"severity": "warning", "summary": "loader still slow"})]
    assert rule.verify.timeout == 90.0 and rule.verify.when.threshold == 1.5 and rule.verify.when.relative
    assert rule.rollback.on == frozenset({"verify-failed", "ttl", "shutdown", "clear"})
    assert rule.rollback.ttl == 3600.0 and rule.rollback.on_restart == "revert" and not rule.rollback.never
    assert (rule.max_actions.count, rule.max_actions.window) == (3, 3600.0)
    assert str(rule.loc).endswith("dataloader-numa.yaml:14:9")
    assert (latency.loc.line, latency.loc.col) == (18, 15)


def test_nested_combinations_relative_thresholds_and_normalised_params():
    policies = {p.name: p for p in load_policies([str(VALID / "network.yaml")])}
    rule = policies["collective-dscp"].rules[0]
    assert rule.when.kind == "any"
    retransmits, inner = rule.when.items
    assert isinstance(retransmits, Condition) and retransmits.threshold == 50.0
    assert isinstance(inner, Combo) and inner.kind == "all"
    srtt, step = inner.items
    assert srtt.relative and srtt.threshold == 2.0 and srtt.baseline_window == 5400.0
    assert step.relative and step.threshold == 1.5 and step.window == 120.0
    assert [c.signal for c in rule.conditions()] == ["tcp_retransmits_total", "tcp_srtt_us", "step_time_ms"]
    assert rule.for_ == 0.25
    assert policies["collective-dscp"].selector.ports == ((29500, 29500), (29600, 29610))
    assert policies["collective-dscp"].selector.match == {"job": "~llama-.*", "node": "!node-7"}
    assert rule.actions[0].params["ports"] == [(29500, 29510), (29600, 29600)]
    assert rule.rollback.on_restart == "adopt"

    tracing = policies["slow-link-tracing"]
    assert tracing.mode == "dry-run" and tracing.description == ""
    rule = tracing.rules[0]
    assert rule.rollback.never and not rule.escalate
    assert rule.actions[0].params == {"ttl": 120.0, "uprobes": ["libibverbs.so:ibv_post_send"]}
    assert rule.actions[1].params == {"handler": "checkpoint.now", "args": {"reason": "slow link", "keep": 2},
                                      "timeout": 90.0}


def test_parameters_written_as_people_write_them_are_normalised():
    """(Every parameter of every actuator, from the specs: tests/test_actuator_specs.py.)"""
    (policy,) = load_policies([str(VALID / "all-params.yaml")])
    actions = policy.rules[0].actions
    by_name = {}
    for action in actions:
        by_name.setdefault(action.actuator, {}).update(action.params)
    assert by_name["dscp"]["dscp"] == 46                         # a DSCP given as a number
    assert by_name["dscp"]["ports"] == [(29500, 29500), (29600, 29610)]
    assert by_name["dscp"]["match_cgroup"] is True and by_name["dscp"]["class"] == "1:3"
    assert by_name["dscp"]["addresses"] == ["10.0.0.0/8"] and by_name["dscp"]["netns"] == "train"
    assert by_name["deep_tracing"]["ttl"] == 600.0
    assert by_name["framework_hook"]["timeout"] == 2.5 and by_name["framework_hook"]["at_step_boundary"] is False
    assert by_name["affinity"]["cpus"] == [0, 1] and by_name["affinity"]["device"] == "0000:3b:00.0"
    assert by_name["sysctl"] == {"key": "kernel.numa_balancing", "value": "0"}
    assert by_name["alert"]["labels"] == {"team": "infra", "page": True}


# ---- invalid files ---------------------------------------------------------------------------

def test_unknown_key_misspelled_actuator_and_bad_duration_give_exactly_three_errors():
    path = str(INVALID / "three-errors.yaml")
    policies, diagnostics = validate_paths([path])
    assert policies == []
    assert [str(d) for d in diagnostics] == [
        f"{path}:9:19: error: 'window': bad duration '5 min': use a number with a unit, "
        "e.g. '250ms', '30s', '5m', '1h30m', '2d' (a bare number is seconds)",
        f"{path}:12:9: error: unknown key 'clearfor'; did you mean 'clear_for'?",
        f"{path}:14:23: error: unknown actuator 'afinity'; did you mean 'affinity'?",
    ]


ERROR_CASES = {
    "invalid/unknown-signal.yaml": [
        (5, 24, "unknown signal 'dataloader_read_latency'; did you mean 'dataloader_read_latency_us'?")],
    "invalid/wrong-types.yaml": [
        (3, 18, "'description' must be a string, got a list"),
        (4, 11, "'mode' 'enforced' is not valid; did you mean 'enforce'?"),
        (6, 20, "item of 'pids' must be an integer, got a string 'abc'"),
        (7, 15, "'cgroup' must be an absolute path"),
        (9, 15, "rule name 'Step_Time' must match"),
        (11, 19, "'escalate' must be true or false, got a string 'yes'"),
        (14, 30, "'count' must be an integer, got a number (1.5)")],
    "invalid/bad-threshold.yaml": [
        (5, 81, "bad threshold '3 times baseline': use a number (e.g. 200), a duration for a time signal "
                "(e.g. '5ms') or '<factor>x baseline'"),
        (8, 81, "bad threshold '0x baseline': the factor must be greater than 0")],
    "invalid/label-not-carried.yaml": [
        (7, 19, "signal 'dataloader_read_latency_us' has no label 'quantil'; did you mean 'quantile'?"),
        (7, 36, "signal 'dataloader_read_latency_us' has no label 'dev'; expected one of: node, job, pid, quantile")],
    "invalid/params.yaml": [
        (10, 21, "actuator 'dscp' needs parameter 'dscp'"),
        (10, 22, "actuator 'dscp' has no parameter 'protocl'; did you mean 'protocol'?"),
        (12, 28, "parameter 'node' of 'affinity' must be an integer, got a string 'zero'"),
        (14, 32, "parameter 'severity' of 'alert': 'warn' is not one of info, warning, critical; "
                 "did you mean 'warning'?"),
        (16, 27, "parameter 'key' of 'sysctl': 'kernel.panic' is not one of kernel.numa_balancing")],
    "invalid/missing-rollback.yaml": [
        (4, 9, "rule 'cross-numa' has actions that change the system (affinity) but no 'rollback'")],
    "invalid/rollback-never-mixed.yaml": [
        (8, 33, "'never' keeps the changes, so 'on' cannot be set with it")],
    "invalid/rollback-ttl.yaml": [
        (8, 32, "rollback trigger 'ttl' needs a 'ttl' value, e.g. ttl: 1h"),
        (13, 33, "'ttl' is set but 'ttl' is not in 'on'")],
    "invalid/verify-missing.yaml": [
        (8, 25, "rollback on 'verify-failed' needs a 'verify' in rule 'verify-failed-without-verify'"),
        (11, 9, "rule 'escalation-without-verify' escalates through 2 actions but has no 'verify'")],
    "invalid/empty-actions.yaml": [
        (6, 18, "rule 'slow-step' has no actions; 'actions' needs at least one")],
    "invalid/bad-windows.yaml": [
        (5, 56, "'window' must be greater than 0, got 0"),
        (6, 14, "'for': duration '-5s' is negative"),
        (7, 20, "'clear_for': duration -1 is negative")],
    "loader-only/yaml-syntax.yaml": [
        (6, 16, "YAML syntax error: expected ',' or '}', but got ':' (while parsing a flow mapping at 5:15)")],
    "loader-only/duplicate-names.yaml": [
        (7, 15, "duplicate rule name 'slow-step' in this policy (first at line 4)"),
        (10, 11, "duplicate policy name 'step-time' (first defined at ")],
    "loader-only/by-not-carried.yaml": [
        (4, 15, "no signal read by policy 'loader-by' carries label 'gpu'; expected one of: job, node, pid"),
        (7, 14, "no signal of rule 'per-worker' carries label 'pidd'; did you mean 'pid'?"),
        (7, 20, "no signal of rule 'per-worker' carries label 'dev'")],
    "loader-only/dscp-no-interfaces.yaml": [
        (7, 23, "'dscp' needs interfaces: set params.interfaces or the policy's selector.interfaces"),
        (8, 28, "or a number 0-63, got 'ef'; did you mean 'EF'?"),
        (8, 40, "parameter 'ports' of 'dscp': bad port range '29510-29500'")],
}


@pytest.mark.parametrize("fixture", sorted(ERROR_CASES))
def test_each_error_class_is_reported_at_its_node(fixture):
    path = str(FIXTURES / fixture)
    policies, diagnostics = validate_paths([path])
    found = _errors(diagnostics)
    expected = ERROR_CASES[fixture]
    assert policies == []
    assert all(d.file == path for d in found)
    assert [(d.line, d.col) for d in found] == [(line, col) for line, col, _ in expected], _where(found)
    for diagnostic, (_, _, text) in zip(found, expected):
        assert text in diagnostic.message


def test_every_invalid_fixture_is_rejected_by_load_policies():
    for path in sorted(INVALID.glob("*.yaml")):
        with pytest.raises(PolicyError) as info:
            load_policies([str(path)])
        assert _errors(info.value.diagnostics), path
        assert str(info.value.diagnostics[0]) in str(info.value)


def test_warnings_do_not_fail_validation():
    path = str(LOADER_ONLY / "warnings.yaml")
    policies, diagnostics = validate_paths([path])
    assert [p.name for p in policies] == ["odd-aggregations"]
    assert all(d.severity == "warning" for d in diagnostics)
    assert [(d.line, d.col) for d in diagnostics] == [(4, 19), (7, 43), (10, 53), (10, 96)]
    assert "kernel truncates comm names" in diagnostics[0].message
    assert "'rate' of gauge 'step_time_ms'" in diagnostics[1].message
    assert "'p99' of counter 'dataloader_reads_total'" in diagnostics[2].message
    assert "'baseline' only matters for a relative threshold" in diagnostics[3].message
    assert [p.name for p in load_policies([path])] == ["odd-aggregations"]


def test_a_bad_policy_is_dropped_and_its_good_neighbour_kept(tmp_path):
    good = open(VALID / "minimal.yml").read()
    bad = "  - name: broken\n    rules: []\n"
    path = _write(tmp_path, "mixed.yaml", good + bad)
    policies, diagnostics = validate_paths([path])
    assert [p.name for p in policies] == ["step-time-log"]
    assert _where(diagnostics) == [(10, 12, "policy 'broken' has no rules; 'rules' needs at least one")]


DSCP_POLICY = """\
policies:
  - name: demote
    selector: {{interfaces: [eth0]{selector}}}
    rules:
      - name: bulk
        when: {{signal: tcp_retransmits_total, agg: rate, window: 10s, op: ">", threshold: 50}}
        actions:
          - actuator: dscp
            params: {{dscp: CS1, {params}}}
        rollback: {{on: [clear]}}
"""


def test_priority_is_rejected_and_points_to_class(tmp_path):
    path = _write(tmp_path, "priority.yaml", DSCP_POLICY.format(selector="", params="priority: 65584"))
    policies, diagnostics = validate_paths([path])
    assert policies == []
    assert [str(d) for d in diagnostics] == [
        f"{path}:9:33: error: actuator 'dscp' has no parameter 'priority' any more; use 'class', the class "
        "of the host's qdisc as tc prints it, e.g. class: \"1:30\" (it sets skb->priority 0x10030)"]


@pytest.mark.parametrize("selector, params, expected", [
    (", netns: r0", 'class: "1:30"', ("r0", {"class": "1:30"})),
    (", netns: /proc/4242/ns/net", "class: 1:30", ("/proc/4242/ns/net", {"class": "1:30"})),  # YAML 1.1: 90
    ("", 'class: "01:0A", netns: r1, addresses: [10.1.2.3/8, "fd00::1"]',
     ("", {"class": "1:a", "netns": "r1", "addresses": ["10.0.0.0/8", "fd00::1/128"]})),
])
def test_selector_netns_and_dscp_class_are_read_in_canonical_form(tmp_path, selector, params, expected):
    path = _write(tmp_path, "dscp.yaml", DSCP_POLICY.format(selector=selector, params=params))
    (policy,) = load_policies([path])
    netns, values = expected
    assert policy.selector.netns == netns and policy.selector.to_dict()["netns"] == netns
    assert policy.rules[0].actions[0].params == {"dscp": 8, **values}


def test_bad_netns_class_and_addresses_are_located_errors(tmp_path):
    path = _write(tmp_path, "bad.yaml", DSCP_POLICY.format(
        selector=", netns: a/b", params='class: "1:0", addresses: [10.0.0.0/33], netns: ".."'))
    policies, diagnostics = validate_paths([path])
    assert policies == []
    assert _where(diagnostics) == [
        (3, 43, "'netns': 'a/b' is not a network namespace: use a name in /run/netns (as 'ip netns list' "
                "shows it) or a path /proc/PID/ns/net"),
        (9, 40, "parameter 'class' of 'dscp': '1:0' is not a tc class id: use major:minor in hex as "
                "'tc class show' prints it, e.g. '1:30' (major 1-fffe, minor not 0)"),
        (9, 58, "parameter 'addresses' of 'dscp': '10.0.0.0/33' is not an IPv4 or IPv6 prefix; write e.g. "
                "10.0.0.0/8, fd00::/64 or 192.0.2.7"),
        (9, 80, "parameter 'netns' of 'dscp': '..' is not a network namespace: use a name in /run/netns "
                "(as 'ip netns list' shows it) or a path /proc/PID/ns/net"),
    ]


def test_selector_link_speeds_are_rates_per_interface(tmp_path):
    path = _write(tmp_path, "speeds.yaml", DSCP_POLICY.format(
        selector=", link_speeds: {eth0: 200mbit, eth1: 25Gbit, eth2: 1000000}", params="ports: [443]"))
    (policy,) = load_policies([path])
    assert policy.selector.link_speeds == {"eth0": 200_000_000, "eth1": 25_000_000_000, "eth2": 1_000_000}
    assert policy.selector.to_dict()["link_speeds"] == policy.selector.link_speeds
    bad = _write(tmp_path, "bad.yaml", DSCP_POLICY.format(
        selector=", link_speeds: {eth0: fast, eth0/x: 1gbit, eth1: 0}", params="ports: [443]"))
    policies, diagnostics = validate_paths([bad])
    assert policies == []
    assert _where(diagnostics) == [
        (3, 56, "speed of 'eth0': 'fast' is not a rate (e.g. \"200mbit\", \"25gbit\" or bits per second)"),
        (3, 62, "'eth0/x' is not a valid interface name (1-15 bytes, no '/' or spaces)"),
        (3, 83, "speed of 'eth1': '0' is not a rate above 0 (e.g. \"200mbit\", \"25gbit\" or bits per second)"),
    ]


def test_quantile_series_must_be_selected(tmp_path):
    path = _write(tmp_path, "q.yaml", """\
policies:
  - name: loader
    rules:
      - name: p99
        when: {signal: dataloader_read_latency_us, agg: max, window: 30s, op: ">", threshold: 2000}
        actions: [{actuator: log}]
""")
    _, diagnostics = validate_paths([path])
    assert [(d.line, d.col, d.severity) for d in diagnostics] == [(5, 24, "warning")]
    assert "without match: {quantile: \"0.99\"} the condition mixes them" in diagnostics[0].message


def test_combinations_must_be_well_formed(tmp_path):
    path = _write(tmp_path, "combo.yaml", """\
policies:
  - name: combos
    rules:
      - name: both
        when:
          all: [{signal: step_time_ms, agg: max, window: 30s, op: ">", threshold: 5}]
          any: [{signal: mfu_pct, agg: min, window: 30s, op: "<", threshold: 40}]
        actions: [{actuator: log}]
      - name: empty
        when: {any: []}
        actions: [{actuator: log}]
      - name: bare-list
        when: [{signal: step_time_ms, agg: max, window: 30s, op: ">", threshold: 5}]
        actions: [{actuator: log}]
""")
    _, diagnostics = validate_paths([path])
    assert [(d.line, d.col) for d in diagnostics] == [(7, 11), (10, 21), (13, 15)]
    assert "either 'all' or 'any', not both" in diagnostics[0].message
    assert "'any' needs at least one condition" in diagnostics[1].message
    assert "all: [...] or any: [...]" in diagnostics[2].message


def test_rollback_must_say_when(tmp_path):
    path = _write(tmp_path, "rb.yaml", """\
policies:
  - name: rollbacks
    rules:
      - name: no-on
        when: {signal: numa_cross_migrations_total, agg: delta, window: 60s, op: ">", threshold: 10}
        actions: [{actuator: affinity, params: {node: 0, cpus: [1]}}]
        rollback: {on_restart: adopt}
      - name: empty-on
        when: {signal: numa_cross_migrations_total, agg: delta, window: 60s, op: ">", threshold: 10}
        actions: [{actuator: affinity, params: {node: 0}}]
        rollback: {on: [], on_restart: keep}
      - name: not-never
        when: {signal: numa_cross_migrations_total, agg: delta, window: 60s, op: ">", threshold: 10}
        actions: [{actuator: affinity, params: {node: 0}}]
        rollback: always
""")
    _, diagnostics = validate_paths([path])
    assert _where(diagnostics) == [
        (6, 58, "'cpus' and 'node' are alternatives for 'affinity'; give only one of node, cpus, device, locality"),
        (7, 19, "'rollback' needs 'on' (the events that undo the change), or write 'rollback: never' to keep "
                "the changes"),
        (11, 24, "'on' is empty, so nothing would undo the change; list triggers (verify-failed, clear, ttl, "
                 "shutdown) or write 'rollback: never'"),
        (11, 40, "'on_restart' 'keep' is not valid; expected one of: revert, adopt"),
        (15, 19, "'rollback' must be a mapping or 'never', got a string 'always'"),
    ]


def test_keys_are_checked_everywhere_with_suggestions(tmp_path):
    path = _write(tmp_path, "keys.yaml", """\
polices: []
policies:
  - name: keys
    selectr: {}
    rules:
      - name: r
        when: {signal: step_time_ms, agg: max, windw: 30s, op: ">", threshold: 5}
        actions: [{actuator: log, param: {}}]
        verify: {when: {signal: step_time_ms, agg: max, window: 30s, op: "<", threshold: 5}, timout: 1m}
        max_actions: {count: 1, window: 1h, burst: 2}
        rollback: {on: [clear], ttl_: 5m}
        name: again
""")
    _, diagnostics = validate_paths([path])
    assert _where(diagnostics) == [
        (1, 1, "unknown key 'polices'; did you mean 'policies'?"),
        (4, 5, "unknown key 'selectr'; did you mean 'selector'?"),
        (7, 15, "condition is missing required key 'window'"),
        (7, 48, "unknown key 'windw'; did you mean 'window'?"),
        (8, 35, "unknown key 'param'; did you mean 'params'?"),
        (9, 17, "'verify' is missing required key 'timeout'"),
        (9, 94, "unknown key 'timout'; did you mean 'timeout'?"),
        (10, 45, "unknown key 'burst'; expected one of: count, window"),
        (11, 33, "unknown key 'ttl_'; did you mean 'ttl'?"),
        (12, 9, "duplicate key 'name' (first at line 6)"),
    ]


def test_label_matchers_and_ports_are_checked(tmp_path):
    path = _write(tmp_path, "match.yaml", """\
policies:
  - name: matchers
    selector:
      match:
        job: "~llama-("
        node: !node-7
      ports: [0, "80-70", http, 70000]
      interfaces: [this-name-is-too-long]
    rules:
      - name: r
        when: {signal: step_time_ms, match: {rank: [0]}, agg: max, window: 30s, op: ">", threshold: 5}
        actions: [{actuator: log}]
""")
    _, diagnostics = validate_paths([path])
    expected = [
        (5, 14, "bad regular expression 'llama-(' for label 'job': missing )"),
        (6, 15, "matcher for label 'node' must be a string, got a value tagged '!node-7' (YAML reads a leading "
                "'!' as a tag: quote the text)"),
        (7, 15, "'ports': bad port range '0': ports are 1-65535 and lo <= hi"),
        (7, 18, "'ports': bad port range '80-70': ports are 1-65535 and lo <= hi"),
        (7, 27, "'ports': bad port 'http': use a port (12345) or a range 'lo-hi' ('29500-29510')"),
        (7, 33, "'ports': bad port range '70000': ports are 1-65535 and lo <= hi"),
        (8, 20, "'this-name-is-too-long' is not a valid interface name (1-15 bytes, no '/' or spaces)"),
        (11, 52, "matcher for label 'rank' must be a string, got a list"),
    ]
    assert [(d.line, d.col) for d in diagnostics] == [(line, col) for line, col, _ in expected], _where(diagnostics)
    for diagnostic, (_, _, text) in zip(diagnostics, expected):
        assert diagnostic.message.startswith(text)


def test_merge_keys_share_a_rule_and_own_keys_override(tmp_path):
    path = _write(tmp_path, "merge.yaml", """\
policies:
  - name: base
    rules:
      - &slow
        name: slow-step
        when: {signal: step_time_ms, agg: max, window: 30s, op: ">", threshold: 500}
        actions: [{actuator: log}]
  - name: derived
    rules:
      - <<: *slow
        name: slower-step
        for: 1m
""")
    policies, diagnostics = validate_paths([path])
    assert diagnostics == []
    derived = policies[1].rules[0]
    assert (derived.name, derived.for_, derived.when.threshold) == ("slower-step", 60.0, 500.0)
    assert policies[0].rules[0].name == "slow-step"


def test_policy_names_are_unique_across_files(tmp_path):
    first = tmp_path / "a.yaml"
    second = tmp_path / "b.yaml"
    shutil.copy(VALID / "minimal.yml", first)
    shutil.copy(VALID / "minimal.yml", second)
    policies, diagnostics = validate_paths([str(tmp_path)])
    assert [p.name for p in policies] == ["step-time-log"]
    assert [str(d) for d in diagnostics] == [
        f"{second}:2:11: error: duplicate policy name 'step-time-log' (first defined at {first}:2:11)"]


# ---- files and paths -------------------------------------------------------------------------

def test_directories_skip_subfolders_non_yaml_and_repeats(tmp_path):
    shutil.copy(VALID / "minimal.yml", tmp_path / "minimal.yml")
    (tmp_path / "tests").mkdir()
    shutil.copy(INVALID / "three-errors.yaml", tmp_path / "tests" / "three-errors.yaml")
    (tmp_path / "schema.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("not a policy")
    (tmp_path / ".minimal.yml.swp.yaml").write_text("junk: [")
    policies, diagnostics = validate_paths([str(tmp_path), str(tmp_path / "minimal.yml")])
    assert diagnostics == []
    assert [p.name for p in policies] == ["step-time-log"]


def test_missing_path_and_empty_directory_are_clean_diagnostics(tmp_path):
    missing = str(tmp_path / "nope.yaml")
    (tmp_path / "empty").mkdir()
    policies, diagnostics = validate_paths([missing, str(tmp_path / "empty")])
    assert policies == []
    assert [str(d) for d in diagnostics] == [
        f"{missing}:1:1: error: no such file or directory",
        f"{tmp_path / 'empty'}:1:1: warning: no policy files (*.yaml, *.yml) here",
    ]
    with pytest.raises(PolicyError) as info:
        load_policies([missing])
    assert info.value.diagnostics == [Diagnostic(missing, 1, 1, "error", "no such file or directory")]


def test_a_single_path_string_is_accepted():
    assert [p.name for p in load_policies(str(VALID / "minimal.yml"))] == ["step-time-log"]


JUNK = {
    "random.yaml": bytes(range(256)) * 4,
    "latin1.yaml": "policies:\n  - name: café\n".encode("latin-1"),
    "nul.yaml": b"policies:\n  - name: \x00x\n",
    "list.yaml": "- policies\n- more\n",
    "scalar.yaml": "just some words\n",
    "number.yaml": "42\n",
    "empty.yaml": "",
    "comment-only.yaml": "# nothing here\n",
    "two-documents.yaml": "policies: []\n---\npolicies: []\n",
    "tabs.yaml": "policies:\n\t- name: x\n",
    "deep.yaml": "policies: " + "[" * 200 + "]" * 200 + "\n",
    "policies-scalar.yaml": "policies: all of them\n",
    "policy-scalar.yaml": "policies: [hello, 3, null]\n",
    "recursive.yaml": "policies:\n  - name: loop\n    rules:\n      - name: r\n        when: &w {all: [*w]}\n"
                      "        actions: [{actuator: framework_hook, params: {handler: h, args: &a {x: *a}}}]\n"
                      "        rollback: never\n",
    "tags.yaml": "policies:\n  - !!python/object:os.system {name: x}\n  - name: !!binary aGVsbG8=\n"
                 "    rules: !!set {a}\n",
    "odd-scalars.yaml": "policies:\n  - name: odd\n    rules:\n      - name: r\n"
                        "        when: {signal: step_time_ms, agg: max, window: 2024-13-45, op: '>', threshold: .nan}\n"
                        "        for: .inf\n        ? [a, b]\n        : c\n        ~: 1\n"
                        "        actions: [{actuator: framework_hook, params: {handler: h, args: {d: 2024-13-45}}}]\n",
    "merge.yaml": "base: &b {name: x}\npolicies:\n  - &p {<<: *p}\n",
}


@pytest.mark.parametrize("name", sorted(JUNK))
def test_junk_becomes_located_errors_never_tracebacks(tmp_path, name):
    path = _write(tmp_path, name, JUNK[name])
    policies, diagnostics = validate_paths([path])
    assert policies == []
    assert _errors(diagnostics), diagnostics
    for d in diagnostics:
        assert d.file == path and d.line >= 1 and d.col >= 1
        assert "internal error" not in d.message


def test_junk_errors_point_at_the_fault(tmp_path):
    def first(name):
        _, diagnostics = validate_paths([_write(tmp_path, name, JUNK[name])])
        return diagnostics[0].line, diagnostics[0].col, diagnostics[0].message

    assert first("latin1.yaml") == (2, 14, "not UTF-8 text: byte 0xe9 cannot be decoded")
    assert first("nul.yaml") == (2, 11, "unreadable character #x0000: special characters are not allowed")
    assert first("list.yaml") == (1, 1, "a policy file is a mapping with a 'policies' list, got a list")
    assert first("scalar.yaml") == (1, 1, "a policy file is a mapping with a 'policies' list, "
                                          "got a string 'just some words'")
    assert first("comment-only.yaml") == (1, 1, "empty file: expected 'policies:' with a list of policies")
    assert first("tabs.yaml")[:2] == (2, 1)
    assert first("two-documents.yaml")[:2] == (2, 1)
    assert first("deep.yaml") == (1, 74, "YAML syntax error: nested more than 64 levels deep")
    assert first("recursive.yaml") == (5, 15, "conditions are nested more than 8 levels deep")
    assert first("tags.yaml") == (2, 5, "policy must be a plain mapping; YAML tag "
                                        "'tag:yaml.org,2002:python/object:os.system' is not allowed here")
    assert first("merge.yaml") == (1, 1, "unknown key 'base'; expected one of: policies")


def test_diagnostic_text_is_compiler_style():
    d = Diagnostic("p.yaml", 3, 7, "warning", "look here")
    assert str(d) == "p.yaml:3:7: warning: look here"
    assert sorted([Diagnostic("p.yaml", 9, 1, "error", "b"), d])[0] is d


TIMED = """\
policies:
  - name: timed
    rules:
      - name: r
        when: {{signal: {signal}, agg: {agg}, window: 30s, op: ">", threshold: {threshold}}}
        actions: [{{actuator: log}}]
"""


@pytest.mark.parametrize("signal,threshold,value", [
    ("step_time_ms", "5ms", 5.0), ("step_time_ms", "0.3s", 300.0), ("step_time_ms", "1500us", 1.5),
    ("step_time_ms", "2m", 120_000.0), ("tcp_srtt_us", "5ms", 5000.0), ("tcp_srtt_us", "0.3ms", 300.0),
    ("dataloader_batch_wait_ms", "250 ms", 250.0), ("step_time_ms", "400", 400.0),
])
def test_a_duration_threshold_of_a_time_signal_is_in_the_signal_s_unit(tmp_path, signal, threshold, value):
    (policy,) = load_policies([_write(tmp_path, "t.yaml", TIMED.format(signal=signal, agg="max",
                                                                       threshold=threshold))])
    cond = policy.rules[0].when
    assert cond.threshold == value and not cond.relative


@pytest.mark.parametrize("signal,agg,message", [
    ("numa_remote_ratio", "max", "threshold '5ms' is a duration, but signal 'numa_remote_ratio' is not a time "
                                 "(its unit is 'ratio'): write a number in its unit"),
    ("link_utilization_pct", "mean", "threshold '5ms' is a duration, but signal 'link_utilization_pct' is not a "
                                     "time (its unit is '%'): write a number in its unit"),
    ("step_time_ms", "count", "threshold '5ms' is a duration, but the count of 'step_time_ms' is not a time: "
                              "write a number"),
])
def test_a_duration_threshold_of_anything_else_is_a_located_error(tmp_path, signal, agg, message):
    text = TIMED.format(signal=signal, agg=agg, threshold="5ms")
    policies, diagnostics = validate_paths([_write(tmp_path, "t.yaml", text)])
    assert policies == []
    col = text.splitlines()[4].index("5ms") + 1
    assert [(d.line, d.col, d.message) for d in _errors(diagnostics)] == [(5, col, message)]


PINNED = """\
policies:
  - name: pinned
    selector: {{pids: [1234]}}
    rules:
      - name: r
        when: {{signal: step_time_ms, agg: max, window: 30s, op: ">", threshold: 400}}
        actions:
          - {{actuator: affinity, params: {{cpus: {cpus}}}}}
        rollback: {{on: [clear]}}
"""


@pytest.mark.parametrize("cpus,text,expected", [
    ('"0-1"', "0-1", [0, 1]), ("[0, 1]", "0,1", [0, 1]), ("[1, 0, 1]", "1,0", [0, 1]),
    ('"0,2-3"', "0,2-3", [0, 2, 3]), ('" 4 - 5 "', "4-5", [4, 5]),
])
def test_cpus_read_alike_in_a_policy_and_on_the_act_command_line(tmp_path, cpus, text, expected):
    """A policy's list or CPU list text and ``act affinity cpus=TEXT`` go through one parser."""
    from reflexarc.core.params import check_params
    (policy,) = load_policies([_write(tmp_path, "p.yaml", PINNED.format(cpus=cpus))])
    assert policy.rules[0].actions[0].params["cpus"] == expected
    assert check_params(SPECS["affinity"], {"cpus": text})["cpus"] == expected


def test_bad_cpus_are_located_errors(tmp_path):
    cases = {'"3-1"': "range '3-1' runs backwards", '"x"': "'x' is not a CPU or a range",
             '"0-99999999999"': "CPU 99999999999 is out of range: CPUs are numbered 0-8191",
             "0": "must be a list of CPUs or a CPU list such as '0-3,8', got an integer (0)",
             "[0, 9000]": "item of parameter 'cpus' of 'affinity' is out of range (0..8191), got 9000"}
    for cpus, words in cases.items():
        text = PINNED.format(cpus=cpus)
        policies, diagnostics = validate_paths([_write(tmp_path, "p.yaml", text)])
        [error] = _errors(diagnostics)
        assert policies == [] and error.line == 8 and words in error.message, (cpus, diagnostics)
