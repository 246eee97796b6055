"""Numbers in policies: every number out of range is one error at the number
itself (``file:line:col``), whatever its size, never a checker failure at 1:1."""
from __future__ import annotations

import pytest

from reflexarc.controller.policy.loader import validate_paths

BIG = "1" + "0" * 400
HUGE = "9" * 5000         # past Python's 4300-digit limit for reading integers

POLICY = """\
policies:
  - name: numa
    mode: dry-run
    selector:
      pids: [PIDS]
      link_speeds: {eth0: SPEED}
    rules:
      - name: remote
        when:
          all:
            - {signal: numa_remote_ratio, agg: mean, window: WINDOW, op: ">", threshold: THRESHOLD}
            - {signal: dataloader_read_latency_us, match: {quantile: "0.99"}, agg: max, window: 30s, op: ">",
               threshold: FACTOR, baseline: 10m}
        for: FOR
        actions:
          - actuator: affinity
            params: {PARAMS}
          - actuator: dscp
            params: {dscp: DSCP, interfaces: [eth0], ports: [PORT]}
        verify:
          when: {signal: numa_remote_ratio, agg: mean, window: 30s, op: "<", threshold: 0.1}
          timeout: 90s
        rollback: {on: [verify-failed]}
        max_actions: {count: COUNT, window: 1h}
"""
GOOD = {"PIDS": "1234", "SPEED": "100Gbit", "WINDOW": "30s", "THRESHOLD": "0.5", "FACTOR": "3x baseline",
        "FOR": "15s", "PARAMS": "node: 0", "DSCP": "CS1", "PORT": "29500", "COUNT": "3"}


def check(tmp_path, **values):
    text = POLICY
    for key, value in {**GOOD, **values}.items():
        text = text.replace(key, value)
    path = tmp_path / "p.yaml"
    path.write_text(text)
    _, diagnostics = validate_paths([str(path)])
    return text, [d for d in diagnostics if d.is_error]


def test_the_policy_of_these_cases_is_valid(tmp_path):
    assert check(tmp_path)[1] == []


# (placeholder, its bad value, what the error column points at, what the error says)
CASES = [
    ("THRESHOLD", BIG, BIG, "'threshold' is out of range"),
    ("THRESHOLD", "-" + BIG, "-" + BIG, "'threshold' is out of range"),
    ("THRESHOLD", HUGE, HUGE, "'threshold' is out of range"),
    ("THRESHOLD", "1.0e+400", "1.0e+400", "'threshold' must be a finite number"),
    ("THRESHOLD", ".nan", ".nan", "'threshold' must be a finite number"),
    ("FACTOR", BIG + "x baseline", BIG + "x baseline", "the factor must be a finite number"),
    ("WINDOW", BIG, BIG, "'window': duration 100000000000000000000000... (401 characters) is out of range"),
    ("FOR", HUGE, HUGE, "'for': duration"),
    ("PARAMS", f"node: {BIG}", BIG, "parameter 'node' of 'affinity' is out of range (0..1023)"),
    ("PARAMS", "node: -1", "-1", "parameter 'node' of 'affinity' must be >= 0"),
    ("PARAMS", f"cpus: [0, {BIG}]", BIG, "item of parameter 'cpus' of 'affinity' is out of range (0..8191)"),
    ("PARAMS", "node: 0, reserved_cpus: [8192]", "8192", "is out of range (0..8191)"),
    ("PIDS", "4194305", "4194305", "item of 'pids' is out of range (1..4194304)"),
    ("PIDS", HUGE, HUGE, "item of 'pids' is out of range"),
    ("COUNT", BIG, BIG, "'count' is out of range (1..9223372036854775807)"),
    ("DSCP", BIG, BIG, "parameter 'dscp' of 'dscp' is out of range (0..63)"),
    ("PORT", BIG, BIG, "is out of range"),
    ("SPEED", BIG, BIG, "speed of 'eth0' is out of range"),
    ("SPEED", HUGE, HUGE, "speed of 'eth0' is out of range"),
]


@pytest.mark.parametrize("key,value,at,message", CASES, ids=[f"{c[0]}={c[1][:12]}" for c in CASES])
def test_a_number_out_of_range_is_an_error_at_the_number(tmp_path, key, value, at, message):
    text, errors = check(tmp_path, **{key: value})
    assert len(errors) == 1, [str(e) for e in errors]
    (error,) = errors
    assert message in error.message, error.message
    line = text.splitlines()[error.line - 1]
    assert line[error.col - 1:].startswith(at), (error.line, error.col, line[:120])
    assert len(error.message) < 200, "the number is shortened in the message"
