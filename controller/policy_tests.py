"""Policy unit tests, in the spirit of ``promtool test rules``: a scenario, a
policy, and the actions expected (actuator, outcome, and optionally when).

File format (``policies/tests/*.yaml``)::

    policy: ../dataloader-numa.yaml          # relative to this file; or a list
    scenario: numa-remote-worker
    cases:
      - mode: enforce
        actions:
          - {actuator: affinity, outcome: applied, at: 3m20s, within: 30s,
             target: {trainer: "4100"}}       # optional: labels the action's target must have
          - {actuator: affinity, outcome: reverted}
        exact: true                          # no other actions (default)
      - mode: dry-run
        actions:
          - {actuator: affinity, outcome: planned}

``run_policy_tests(paths)`` prints PASS/FAIL per case with a readable diff and
returns how many failed. Only regular files are read (a FIFO or a device,
named or in a named directory, is refused before anything runs); a file that
does not load is one failure, located (``file:line:col: error: ...``).
Overhead: one simulated run per case.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from reflexarc.core.durations import DurationError, parse_duration

from .input_files import InputFileError, files_in, read_text
from .policy.model import MODES

CASE_KEYS = {"mode", "actions", "exact", "name"}
EXPECT_KEYS = {"actuator", "outcome", "at", "within", "target"}
TEST_SUFFIXES = (".yaml", ".yml")
MAX_FILE_BYTES = 1 << 20


class PolicyTestError(ValueError):
    pass


@dataclass
class Expected:
    actuator: str
    outcome: str
    at: float | None
    within: float
    target: dict | None = None

    def text(self) -> str:
        when = f" @{self.at:g}s±{self.within:g}s" if self.at is not None else ""
        on = f" on {','.join(f'{k}={v}' for k, v in sorted(self.target.items()))}" if self.target else ""
        return f"{self.actuator} {self.outcome}{on}{when}"

    def matches(self, rec: dict) -> bool:
        if rec["actuator"] != self.actuator or rec["outcome"] != self.outcome:
            return False
        if self.target and any(str(rec["target_labels"].get(k)) != v for k, v in self.target.items()):
            return False
        return self.at is None or abs(rec["ts"] - self.at) <= self.within


def _err(path: Path, node, msg: str) -> PolicyTestError:
    m = node.start_mark
    return PolicyTestError(f"{path}:{m.line + 1}:{m.column + 1}: error: {msg}")


def _mapping(path: Path, node, what: str) -> dict:
    if not isinstance(node, yaml.MappingNode):
        raise _err(path, node, f"{what} must be a mapping")
    return {k.value: v for k, v in node.value}


def _scalar(path, node, what):
    if not isinstance(node, yaml.ScalarNode):
        raise _err(path, node, f"{what} must be a scalar")
    try:
        return yaml.safe_load(yaml.serialize(node))
    except (yaml.YAMLError, ValueError) as exc:       # e.g. an integer of more than 4300 digits
        raise _err(path, node, f"cannot read this {what}: {exc}") from None


def _scalar_map(path: Path, node, what: str) -> dict[str, str]:
    """A mapping of labels to scalar values, as strings."""
    return {k: str(_scalar(path, v, f"{what} label '{k}'")) for k, v in _mapping(path, node, what).items()}


def _duration(path: Path, node, what: str) -> float:
    value = _scalar(path, node, what)
    try:
        return parse_duration(value)
    except (DurationError, OverflowError) as exc:   # OverflowError: an integer beyond any float
        shown = node.value if len(node.value) <= 40 else node.value[:24] + f"... ({len(node.value)} characters)"
        reason = str(exc) if isinstance(exc, DurationError) else f"duration {shown} is out of range"
        raise _err(path, node, f"{what}: {reason}") from None


def _compose(path: Path):
    try:
        text = read_text(path, MAX_FILE_BYTES)
    except InputFileError as exc:
        where = f"{exc.line}:{exc.col}" if exc.line is not None else "1:1"
        raise PolicyTestError(f"{path}:{where}: error: {exc.reason}") from None
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.reader.ReaderError as exc:
        before = text[:exc.position]
        loc, reason = f"{before.count(chr(10)) + 1}:{exc.position - before.rfind(chr(10))}", exc.reason
        raise PolicyTestError(f"{path}:{loc}: error: unreadable character #x{exc.character:04x}: {reason}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        loc = f"{mark.line + 1}:{mark.column + 1}" if mark else "1:1"
        raise PolicyTestError(f"{path}:{loc}: error: {getattr(exc, 'problem', exc)}") from None
    except RecursionError:
        raise PolicyTestError(f"{path}:1:1: error: nested too deep to read") from None


def _required(path: Path, node, fields: dict, keys: tuple[str, ...], what: str) -> None:
    for key in keys:
        if key not in fields:
            raise _err(path, node, f"{what} is missing '{key}'")


def load_test_file(path: Path) -> tuple[list[str], object, list[dict]]:
    """The policy files, the scenario (loaded) and the cases of one test file;
    PolicyTestError (located) on anything wrong with it."""
    root = _compose(path)
    if root is None:
        raise PolicyTestError(f"{path}:1:1: error: empty test file")
    top = _mapping(path, root, "a policy test file")
    _required(path, root, top, ("policy", "scenario", "cases"), "a policy test file")
    for k, node in root.value:
        if k.value not in ("policy", "scenario", "cases"):
            raise _err(path, k, f"unknown key '{k.value}'")
    pol = top["policy"]
    policies = [_scalar(path, n, "policy") for n in pol.value] if isinstance(pol, yaml.SequenceNode) \
        else [_scalar(path, pol, "policy")]
    policies = [str((path.parent / str(p)).resolve()) for p in policies]
    scenario = str(_scalar(path, top["scenario"], "scenario"))
    if not isinstance(top["cases"], yaml.SequenceNode):
        raise _err(path, top["cases"], "cases must be a list")
    if not top["cases"].value:
        raise _err(path, top["cases"], "cases is empty: give at least one case")
    cases = []
    for cnode in top["cases"].value:
        c = _mapping(path, cnode, "a case")
        for k, _ in cnode.value:
            if k.value not in CASE_KEYS:
                raise _err(path, k, f"unknown key '{k.value}' (expected one of {', '.join(sorted(CASE_KEYS))})")
        mode = _scalar(path, c["mode"], "mode") if "mode" in c else None
        if mode is not None and mode not in MODES:
            raise _err(path, c["mode"], f"mode must be one of {', '.join(MODES)}")
        actions = c.get("actions")
        if actions is not None and not isinstance(actions, yaml.SequenceNode):
            raise _err(path, actions, "actions must be a list")
        expected = []
        for anode in actions.value if actions is not None else ():
            a = _mapping(path, anode, "an expected action")
            for k, _ in anode.value:
                if k.value not in EXPECT_KEYS:
                    raise _err(path, k, f"unknown key '{k.value}'")
            _required(path, anode, a, ("actuator", "outcome"), "an expected action")
            at = _duration(path, a["at"], "at") if "at" in a else None
            within = _duration(path, a["within"], "within") if "within" in a else 15.0
            target = _scalar_map(path, a["target"], "target") if "target" in a else None
            expected.append(Expected(str(_scalar(path, a["actuator"], "actuator")),
                                     str(_scalar(path, a["outcome"], "outcome")), at, within, target))
        exact = _scalar(path, c["exact"], "exact") if "exact" in c else True
        if not isinstance(exact, bool):
            raise _err(path, c["exact"], "exact must be true or false")
        cases.append({"name": _scalar(path, c["name"], "name") if "name" in c else mode or "default",
                      "mode": mode, "expected": expected, "exact": exact})
    return policies, _scenario(path, top["scenario"], scenario), cases


def _scenario(path: Path, node, scenario: str):
    """The scenario a test file names; a name that is no scenario is located in the test file."""
    from reflexarc.simulations import ScenarioError

    from .simulate import SCENARIO_SUFFIXES, load_scenario_checked
    try:
        return load_scenario_checked(scenario)
    except ScenarioError as exc:
        if Path(scenario).suffix in SCENARIO_SUFFIXES:
            raise PolicyTestError(str(exc)) from None
        raise _err(path, node, exc.message) from None


def check_case(expected: list[Expected], actions: list[dict], exact: bool) -> list[str]:
    """Lines of a readable diff; empty when the run matches."""
    problems, pos, matched = [], 0, set()
    for exp in expected:
        hit = next((i for i in range(pos, len(actions)) if exp.matches(actions[i])), None)
        if hit is None:
            near = [a for a in actions if a["actuator"] == exp.actuator and a["outcome"] == exp.outcome]
            seen = ", ".join(f"{a['ts']:g}s" for a in near)
            why = f" (seen at {seen})" if near else ""
            problems.append(f"  - missing: {exp.text()}{why}")
            continue
        matched.add(hit)
        pos = hit + 1
    if exact:
        for i, a in enumerate(actions):
            if i not in matched:
                problems.append(f"  + unexpected: {a['actuator']} {a['outcome']} @{a['ts']:g}s")
    return problems


def run_policy_tests(paths: list[str], verbose: bool = False) -> int:
    """Run every case of the test files ``paths`` name (directories: their
    ``*.yaml``/``*.yml``); a file that does not load counts as one failure.
    InputFileError when a path is not a regular file or a directory of them.
    Returns how many failed."""
    from .policy.diagnostics import PolicyError
    from .policy.loader import load_policies
    from .simulate import run_scenario
    files = files_in(paths, TEST_SUFFIXES)
    if not files:
        raise InputFileError(", ".join(paths), "no policy test files (*.yaml, *.yml)")
    failed = total = 0
    for f in files:
        try:
            policies, scenario, cases = load_test_file(f)
        except PolicyTestError as exc:
            print(exc)
            failed += 1
            total += 1
            continue
        try:
            loaded = load_policies(policies)
        except PolicyError as exc:
            print("\n".join(str(d) for d in exc.diagnostics))
            print(f"FAIL {f}: its policies do not load")
            failed += 1
            total += 1
            continue
        for case in cases:
            total += 1
            result = run_scenario(scenario, loaded, case["mode"])
            actions = result.actions()
            problems = check_case(case["expected"], actions, case["exact"])
            label = f"{f} [{case['name']}]"
            if problems:
                failed += 1
                print(f"FAIL {label}")
                print("\n".join(problems))
                print("  actual: " + "; ".join(f"{a['actuator']} {a['outcome']} @{a['ts']:g}s" for a in actions))
            else:
                print(f"PASS {label}")
    print(f"{total - failed} passed, {failed} failed")
    return failed
