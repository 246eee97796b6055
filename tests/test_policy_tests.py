"""``reflexarc test-policies``: the built-in policies' unit tests pass, and a
wrong expectation fails with a readable diff."""
from __future__ import annotations


def test_builtin_policy_tests_pass(repo_root, cli):
    r = cli("test-policies", str(repo_root / "policies" / "tests"), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    names = {line.split()[1] for line in r.stdout.splitlines() if line.startswith("PASS")}
    policies = {p.name for p in (repo_root / "policies").glob("*.yaml")}
    assert {n.split("/")[-1] for n in names} == policies, "every built-in policy has a policy test"


def test_wrong_expectation_fails_with_diff(tmp_path, repo_root, cli):
    f = tmp_path / "wrong.yaml"
    f.write_text(f"""\
policy: {repo_root}/policies/dataloader-numa.yaml
scenario: numa-remote-worker
cases:
  - mode: enforce
    actions:
      - {{actuator: affinity, outcome: applied, at: 60s, within: 5s}}
      - {{actuator: dscp, outcome: applied}}
      - {{actuator: affinity, outcome: reverted, target: {{trainer: "4200"}}}}
""")
    r = cli("test-policies", str(f))
    assert r.returncode == 1
    assert "FAIL" in r.stdout
    assert "- missing: affinity applied @60s±5s (seen at 198s)" in r.stdout
    assert "- missing: dscp applied" in r.stdout
    assert "- missing: affinity reverted on trainer=4200 (seen at 600s)" in r.stdout, "the other training process"
    assert "+ unexpected: affinity applied @198s" in r.stdout
    assert "0 passed, 1 failed" in r.stdout


def test_malformed_test_file_is_located(tmp_path, cli):
    f = tmp_path / "bad.yaml"
    f.write_text("policy: x.yaml\nscenario: numa-remote-worker\ncases:\n  - mode: enforce\n    expect: []\n")
    r = cli("test-policies", str(f), timeout=60)
    assert r.returncode == 1
    assert f"{f}:5:5: error: unknown key 'expect'" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr
