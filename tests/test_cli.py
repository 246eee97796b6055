"""The command line: clear errors, exit codes, no tracebacks."""
from __future__ import annotations

import subprocess
import sys

import pytest

RX = [sys.executable, "-m", "reflexarc.controller.cli"]

BAD = """\
policies:
  - name: bad-one
    mode: enforce
    rules:
      - name: r
        when: {signal: step_time_ms, agg: max, window: 30s, op: ">", threshold: 400}
        for: 15 sec
        actions:
          - actuator: afinity
            params: {node: 0}
        rollback: {on: [shutdown]}
        colldown: 5m
"""


def rx(*args, **kw):
    return subprocess.run(RX + list(args), capture_output=True, text=True, timeout=120, **kw)


def test_validate_reports_three_located_errors(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(BAD)
    r = rx("validate", str(f))
    assert r.returncode == 1
    errors = [line for line in r.stdout.splitlines() if ": error: " in line]
    assert len(errors) == 3, r.stdout
    locs = {line.split(": error: ")[0].replace(str(f) + ":", "") for line in errors}
    assert locs == {"7:14", "9:23", "12:9"}, errors
    text = r.stdout
    assert "did you mean 'affinity'" in text
    assert "did you mean 'cooldown'" in text
    assert "Traceback" not in r.stdout + r.stderr


def test_validate_builtin_policies_clean(repo_root):
    r = rx("validate", str(repo_root / "policies"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1].startswith("ok: ") and "warning" not in r.stdout + r.stderr


def test_validate_missing_file_is_one_clean_error(tmp_path):
    r = rx("validate", str(tmp_path / "nope.yaml"))
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert "nope.yaml" in r.stdout


def test_unknown_subcommand_and_option_one_error_line():
    for args in (("bogus",), ("simulate", "--frobnicate")):
        r = rx(*args)
        assert r.returncode == 2
        assert r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1


def test_simulate_unknown_scenario():
    r = rx("simulate", "no-such-scenario")
    assert r.returncode == 1
    assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr


def test_act_unknown_actuator_suggests(tmp_path):
    r = rx("--state-dir", str(tmp_path), "act", "afinity", "node=0")
    assert r.returncode == 1
    assert "did you mean 'affinity'" in r.stderr


def test_act_bad_params(tmp_path):
    r = rx("--state-dir", str(tmp_path), "act", "sysctl", "key=kernel.numa_balancing")
    assert r.returncode == 1 and "needs parameter 'value'" in r.stderr
    r = rx("--state-dir", str(tmp_path), "act", "sysctl", "kee=x", "value=1")
    assert r.returncode == 1 and "no parameter 'kee'" in r.stderr
    r = rx("--state-dir", str(tmp_path), "act", "affinity", "node=zero")
    assert r.returncode == 1 and "not a valid int" in r.stderr


def test_act_dry_run_is_default_and_changes_nothing(tmp_path):
    knob = tmp_path / "proc" / "sys" / "vm" / "swappiness"
    knob.parent.mkdir(parents=True)
    knob.write_text("60\n")
    r = rx("--state-dir", str(tmp_path / "state"), "--proc-root", str(tmp_path / "proc"),
           "act", "sysctl", "key=vm.swappiness", "value=10")
    assert r.returncode == 0, r.stderr
    assert '"outcome": "planned"' in r.stdout and '"before": "60"' in r.stdout and '"after": "10"' in r.stdout
    assert knob.read_text() == "60\n"
    assert not (tmp_path / "state" / "journal.jsonl").exists()


def test_report_missing_audit(tmp_path):
    r = rx("report", str(tmp_path / "audit.jsonl"), "--out", str(tmp_path))
    assert r.returncode == 1 and r.stderr.startswith("error: ")


def test_rollback_needs_target(tmp_path):
    r = rx("--state-dir", str(tmp_path), "rollback")
    assert r.returncode == 1 and "--all" in r.stderr


def test_run_refuses_bad_audit_and_target_settings():
    for args, word in ((("--audit-sample", "nan"), "--audit-sample"), (("--target-grace", "-5"), "--target-grace"),
                       (("--audit-max-mb", "0"), "--audit-max-mb"), (("--audit-max-mb", "inf"), "--audit-max-mb")):
        r = rx("run", "--no-probes", "--duration", "1", *args)
        assert r.returncode == 2, (args, r.stderr)
        [line] = r.stderr.splitlines()
        assert line.startswith("error: ") and word in line and "Traceback" not in r.stderr


ALERTING = """\
policies:
  - name: pager
    mode: enforce
    rules:
      - name: slow
        when: {signal: step_time_ms, agg: max, window: 30s, op: ">", threshold: 400}
        actions:
          - {actuator: alert, params: {summary: slow steps}}
"""


def test_run_says_at_start_that_alerts_have_no_receiver(tmp_path):
    policy = tmp_path / "pager.yaml"
    policy.write_text(ALERTING)
    base = ["--state-dir", str(tmp_path / "state"), "--hook-dir", str(tmp_path / "hooks")]
    common = ["run", "--no-probes", "--duration", "0.2", "--interval", "0.1", "--policy", str(policy),
              "--kill-switch", str(tmp_path / "disable")]
    r = rx(*base, *common, "--mode", "policy")
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if "warning:" in line]
    assert warnings == [f"{policy}:2:5: warning: policy pager (enforce) sends alerts, but no alert receiver "
                        "is configured: give --alertmanager-url or --webhook-url"], r.stderr
    quiet = rx(*base, "--webhook-url", "http://127.0.0.1:9/hook", *common, "--mode", "policy")
    assert quiet.returncode == 0 and "warning:" not in quiet.stderr, quiet.stderr
    dry = rx(*base, *common)                 # dry-run sends nothing
    assert dry.returncode == 0 and "warning:" not in dry.stderr, dry.stderr


def test_act_help_lists_every_actuator_and_its_parameters():
    from reflexarc.actuators.specs import SPECS
    r = rx("act", "--help")
    assert r.returncode == 0, r.stderr
    listing = r.stdout.split("actuators:", 1)[1]
    for spec in SPECS.values():
        assert f"\n  {spec.name}" in listing, spec.name
        for p in spec.params:
            assert f"{p.name}={p.type} (" in listing, (spec.name, p.name)
    assert "dscp=dscp (required)" in listing


@pytest.mark.parametrize("args,word", [
    (("run", "--no-probes", "--metrics-port", "99999"), "--metrics-port"),
    (("run", "--no-probes", "--interval", "0"), "--interval"),
    (("run", "--no-probes", "--duration", "nan"), "--duration"),
    (("run", "--no-probes", "--max-active", "-1"), "--max-active"),
    (("run", "--no-probes", "--actions-per-hour", "1.5"), "--actions-per-hour"),
    (("top", "--interval", "nan"), "--interval"),
    (("top", "--interval", "-1"), "--interval"),
    (("top", "--count", "x"), "--count"),
    (("validate", ""), "empty path"),
])
def test_bad_numbers_and_paths_get_one_error_line(args, word):
    r = rx(*args)
    assert r.returncode in (1, 2), (args, r.returncode, r.stderr)
    [line] = r.stderr.splitlines()
    assert line.startswith("error: ") and word in line, line


def test_act_actuator_help_lists_that_actuators_parameters_from_its_spec():
    from reflexarc.actuators.specs import SPECS
    r = subprocess.run(RX + ["act", "dscp", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    params = [line.split("=", 1)[0].strip() for line in r.stdout.splitlines() if line.startswith("      ")]
    assert params == [p.name for p in SPECS["dscp"].params]
    assert "affinity" not in r.stdout
    every = subprocess.run(RX + ["act", "--help"], capture_output=True, text=True, timeout=60)
    assert all(f"  {name}" in every.stdout for name in SPECS), every.stdout
