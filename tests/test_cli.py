"""The command line: clear errors, exit codes, no tracebacks."""
from __future__ import annotations

import argparse
import json
import re

import pytest
from conftest import parse_cli

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


def test_validate_reports_three_located_errors(tmp_path, cli):
    f = tmp_path / "bad.yaml"
    f.write_text(BAD)
    r = cli("validate", str(f))
    assert r.returncode == 1
    errors = [line for line in r.stdout.splitlines() if ": error: " in line]
    assert len(errors) == 3, r.stdout
    locs = {line.split(": error: ")[0].replace(str(f) + ":", "") for line in errors}
    assert locs == {"7:14", "9:23", "12:9"}, errors
    text = r.stdout
    assert "did you mean 'affinity'" in text
    assert "did you mean 'cooldown'" in text
    assert "Traceback" not in r.stdout + r.stderr


def test_validate_builtin_policies_clean(repo_root, cli):
    r = cli("validate", str(repo_root / "policies"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1].startswith("ok: ") and "warning" not in r.stdout + r.stderr


def test_validate_missing_file_is_one_clean_error(tmp_path, cli):
    r = cli("validate", str(tmp_path / "nope.yaml"))
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert "nope.yaml" in r.stdout


def test_unknown_subcommand_and_option_one_error_line():
    for args in (("bogus",), ("simulate", "--frobnicate")):
        r = parse_cli(*args)
        assert r.returncode == 2
        assert r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1


def test_simulate_unknown_scenario(cli):
    r = cli("simulate", "no-such-scenario")
    assert r.returncode == 1
    assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr


def test_act_unknown_actuator_suggests(tmp_path, cli):
    r = cli("--state-dir", str(tmp_path), "act", "afinity", "node=0")
    assert r.returncode == 1
    assert "did you mean 'affinity'" in r.stderr


def test_act_bad_params(tmp_path, cli):
    r = cli("--state-dir", str(tmp_path), "act", "sysctl", "key=kernel.numa_balancing")
    assert r.returncode == 1 and "needs parameter 'value'" in r.stderr
    r = cli("--state-dir", str(tmp_path), "act", "sysctl", "kee=x", "value=1")
    assert r.returncode == 1 and "no parameter 'kee'" in r.stderr
    r = cli("--state-dir", str(tmp_path), "act", "affinity", "node=zero")
    assert r.returncode == 1 and "not a valid int" in r.stderr


def knob(tmp_path, value: str = "60"):
    """A sysctl tree under ``tmp_path/proc`` with vm.swappiness at ``value``."""
    path = tmp_path / "proc" / "sys" / "vm" / "swappiness"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n")
    return path


def test_act_dry_run_is_default_and_changes_nothing(tmp_path, cli):
    swappiness = knob(tmp_path)
    r = cli("--state-dir", str(tmp_path / "state"), "--proc-root", str(tmp_path / "proc"),
            "act", "sysctl", "key=vm.swappiness", "value=10")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["planned: sysctl vm.swappiness: 60 -> 10",
                                     "  nothing was changed (dry-run); --mode enforce applies it"], r.stdout
    assert swappiness.read_text() == "60\n"
    assert not (tmp_path / "state" / "journal.jsonl").exists()
    r = cli("--state-dir", str(tmp_path / "state"), "--proc-root", str(tmp_path / "proc"),
            "act", "sysctl", "key=vm.swappiness", "value=10", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"outcome": "planned", "before": "60", "after": "10", "journal_id": None,
                                    "error": None, "summary": "sysctl vm.swappiness: 60 -> 10"}
    assert swappiness.read_text() == "60\n"


def test_act_enforce_says_what_changed_and_the_journal_id_that_reverts_it(tmp_path, cli):
    swappiness = knob(tmp_path)
    base = ["--state-dir", str(tmp_path / "state"), "--proc-root", str(tmp_path / "proc")]
    r = cli(*base, "act", "sysctl", "key=vm.swappiness", "value=10", "--mode", "enforce")
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.splitlines()
    assert first == "applied: sysctl vm.swappiness: 60 -> 10" and swappiness.read_text().strip() == "10"
    jid = second.split("journal id ", 1)[1].split(":", 1)[0]
    assert second == f"  journal id {jid}: 'reflexarc rollback {jid}' reverts it"
    back = cli(*base, "rollback", jid)
    assert back.returncode == 0, back.stderr
    assert swappiness.read_text().strip() == "60"


def test_act_failed_plan_prints_only_the_error_line_unless_json(tmp_path, cli):
    base = ["--state-dir", str(tmp_path / "state"), "act", "affinity", "cpus=0", "--pid", "999999"]
    r = cli(*base)
    assert r.returncode == 1 and r.stdout == "", r.stdout
    assert r.stderr.splitlines() == ["error: affinity: plan: no such process 999999"], r.stderr
    r = cli(*base, "--json")
    assert r.returncode == 1 and r.stderr.splitlines() == ["error: affinity: plan: no such process 999999"]
    view = json.loads(r.stdout)
    assert view["outcome"] == "failed" and view["error"] == "plan: no such process 999999", view


def test_global_options_after_the_verb_mean_the_same_and_override_those_before(tmp_path, cli):
    swappiness = knob(tmp_path)
    before, after = tmp_path / "before", tmp_path / "after"
    r = cli("--state-dir", str(before), "act", "sysctl", "key=vm.swappiness", "value=10", "--mode", "enforce",
            "--proc-root", str(tmp_path / "proc"), "--state-dir", str(after))
    assert r.returncode == 0, r.stderr
    assert swappiness.read_text().strip() == "10"
    assert (after / "journal.jsonl").is_file() and not (before / "journal.jsonl").exists()
    listed = cli("journal", "--state-dir", str(after))
    assert listed.returncode == 0 and "sysctl" in listed.stdout, listed.stdout + listed.stderr
    from reflexarc.controller.cli.main import build_parser
    parser = build_parser()
    for argv in (["-v", "validate", "p"], ["validate", "-v", "p"], ["--webhook-url", "u", "validate", "p"],
                 ["validate", "p", "--webhook-url", "u"]):
        args = parser.parse_args(argv)
        assert (args.verbose, args.webhook_url) == ((1, None) if "-v" in argv else (0, "u")), argv
    assert parser.parse_args(["--sys-root", "/x", "validate", "p"]).sys_root == "/x"   # kept when not repeated


def test_alert_receiver_after_the_verb_counts_for_run(tmp_path, cli):
    policy = tmp_path / "pager.yaml"
    policy.write_text(ALERTING)
    r = cli("run", "--no-probes", "--duration", "0.2", "--interval", "0.1", "--policy", str(policy),
            "--kill-switch", str(tmp_path / "disable"), "--mode", "policy", "--state-dir", str(tmp_path / "state"),
            "--hook-dir", str(tmp_path / "hooks"), "--webhook-url", "http://127.0.0.1:9/hook")
    assert r.returncode == 0, r.stderr
    assert "warning:" not in r.stderr and "no alert receiver" not in r.stderr, r.stderr


def test_version_is_the_installed_package_s(cli):
    from importlib.metadata import version
    r = cli("--version")
    assert r.returncode == 0 and r.stdout == f"reflexarc {version('reflexarc')}\n", r.stdout + r.stderr
    assert re.fullmatch(r"reflexarc \d+\.\d+\.\d+\n", r.stdout)


def _actions(parser: argparse.ArgumentParser, path: str):
    """(where, action) of every action of ``parser`` and of its commands' parsers."""
    for action in parser._actions:
        yield path, action
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _actions(sub, f"{path} {name}")


def test_every_command_and_option_has_help():
    from reflexarc.controller.cli.main import build_parser
    parser = build_parser()
    missing = [f"{where}: {'/'.join(a.option_strings) or a.dest}" for where, a in _actions(parser, "reflexarc")
               if not (a.help and a.help.strip()) or a.help == argparse.SUPPRESS]
    assert missing == [], missing
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helped = {c.dest for c in verbs._choices_actions if c.help and c.help.strip()}
    assert helped == set(verbs.choices), set(verbs.choices) - helped
    assert len(list(_actions(parser, ""))) > 100        # the walk reached every command


@pytest.mark.parametrize("verb,words", [
    ("journal", "Lists every change the journal"),
    ("rollback", "Reverts changes the journal"),
    ("test-policies", "Runs each case of each test file"),
])
def test_help_of_a_command_says_what_it_does(verb, words):
    r = parse_cli(verb, "--help")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert words in text and "global options (before or after the command)" in text, text


def test_report_missing_audit(tmp_path, cli):
    r = cli("report", str(tmp_path / "audit.jsonl"), "--out", str(tmp_path))
    assert r.returncode == 1 and r.stderr.startswith("error: ")


def test_rollback_needs_target(tmp_path, cli):
    r = cli("--state-dir", str(tmp_path), "rollback")
    assert r.returncode == 1 and "--all" in r.stderr


def test_run_refuses_bad_audit_and_target_settings():
    for args, word in ((("--audit-sample", "nan"), "--audit-sample"), (("--target-grace", "-5"), "--target-grace"),
                       (("--audit-max-mb", "0"), "--audit-max-mb"), (("--audit-max-mb", "inf"), "--audit-max-mb")):
        r = parse_cli("run", "--no-probes", "--duration", "1", *args)
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


def test_run_says_at_start_that_alerts_have_no_receiver(tmp_path, cli):
    policy = tmp_path / "pager.yaml"
    policy.write_text(ALERTING)
    base = ["--state-dir", str(tmp_path / "state"), "--hook-dir", str(tmp_path / "hooks")]
    common = ["run", "--no-probes", "--duration", "0.2", "--interval", "0.1", "--policy", str(policy),
              "--kill-switch", str(tmp_path / "disable")]
    r = cli(*base, *common, "--mode", "policy")
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if "warning:" in line]
    assert warnings == [f"{policy}:2:5: warning: policy pager (enforce) sends alerts, but no alert receiver "
                        "is configured: give --alertmanager-url or --webhook-url"], r.stderr
    quiet = cli(*base, "--webhook-url", "http://127.0.0.1:9/hook", *common, "--mode", "policy")
    assert quiet.returncode == 0 and "warning:" not in quiet.stderr, quiet.stderr
    dry = cli(*base, *common)                 # dry-run sends nothing
    assert dry.returncode == 0 and "warning:" not in dry.stderr, dry.stderr


def test_act_help_lists_every_actuator_and_its_parameters(cli):
    from reflexarc.actuators.specs import SPECS
    r = cli("act", "--help")
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
    r = parse_cli(*args)
    assert r.returncode in (1, 2), (args, r.returncode, r.stderr)
    [line] = r.stderr.splitlines()
    assert line.startswith("error: ") and word in line, line


def test_act_actuator_help_lists_that_actuators_parameters_from_its_spec(cli):
    from reflexarc.actuators.specs import SPECS
    r = cli("act", "dscp", "--help", timeout=60)
    assert r.returncode == 0, r.stderr
    params = [line.split("=", 1)[0].strip() for line in r.stdout.splitlines() if line.startswith("      ")]
    assert params == [p.name for p in SPECS["dscp"].params]
    assert "affinity" not in r.stdout
    every = cli("act", "--help", timeout=60)
    assert all(f"  {name}" in every.stdout for name in SPECS), every.stdout


def test_reports_read_lists_and_comparisons_as_people_write_them(tmp_path, cli):
    r = cli("simulate", "flapping", "--mode", "enforce", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    md, html = (tmp_path / "report.md").read_text(), (tmp_path / "report.html").read_text()
    assert "&lt;" not in md and "&amp;" not in md
    assert re.search(r"`max\(dataloader_read_latency_us\S*\) < 1\.5x baseline`: \*\*[0-9.,]+\*\* < [0-9]", md), md
    assert "rollback <code>on shutdown, ttl, verify-failed; ttl 3600s</code>" in html
    assert "[&#x27;" not in html and "['" not in md


def test_messages_name_what_the_yaml_says_not_internal_classes(repo_root):
    """No text a user may read (any string but a docstring) names an internal
    class's field, e.g. ``Selection.link_speeds`` for a policy's ``selector.link_speeds``."""
    import ast
    found = []
    for folder in ("actuators", "bpf", "controller", "core"):
        for path in sorted((repo_root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            docs = {id(node.body[0].value) for node in ast.walk(tree)
                    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                    and node.body and isinstance(node.body[0], ast.Expr)}
            found += [f"{path.relative_to(repo_root)}:{node.lineno}: {node.value}" for node in ast.walk(tree)
                      if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                      and re.search(r"\b(Selection|Selector|Policy|Rule|Condition|Rollback)\.[a-z_]+", node.value)]
    assert found == [], found
