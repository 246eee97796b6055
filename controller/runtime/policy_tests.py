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
does not load is one failure, located (``file:line:col: error: ...``, read by
``reflexarc.core.yaml_reader``).
Overhead: one simulated run per case.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from yaml.nodes import Node, SequenceNode

from reflexarc.core.diagnostics import LocatedError
from reflexarc.core.input_files import InputFileError, files_in
from reflexarc.core.yaml_reader import YamlReader, position

from ..policy.model import MODES

FILE_KEYS = ("policy", "scenario", "cases")
CASE_KEYS = ("mode", "actions", "exact", "name")
EXPECT_KEYS = ("actuator", "outcome", "at", "within", "target")
TEST_SUFFIXES = (".yaml", ".yml")
MAX_FILE_BYTES = 1 << 20


class PolicyTestError(LocatedError):
    """A test file that cannot be used; ``str()`` is ``file:line:col: error: message``."""


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


def _fields(reader: YamlReader, node: Node, what: str, keys: tuple[str, ...],
            required: tuple[str, ...] = ()) -> dict[str, Node]:
    """Key -> value node of a mapping that may hold only ``keys`` and must hold ``required``."""
    out = {}
    for key, key_node, value_node in reader.entries(node, what):
        if key not in keys:
            reader.error(key_node, f"unknown key '{key}' (expected one of {', '.join(keys)})")
        out[key] = value_node
    for key in required:
        if key not in out:
            reader.error(node, f"{what} is missing '{key}'")
    return out


def _choice(reader: YamlReader, node: Node, what: str, choices: tuple[str, ...]) -> str:
    value = reader.string(node, what)
    if value not in choices:
        reader.error(node, f"{what} must be one of {', '.join(choices)}")
    return value


def load_test_file(path: Path) -> tuple[list[str], object, list[dict]]:
    """The policy files, the scenario (loaded) and the cases of one test file;
    PolicyTestError (located) on anything wrong with it."""
    reader = YamlReader(str(path), raises=PolicyTestError)
    root = reader.read(path, MAX_FILE_BYTES, empty="empty test file")
    top = _fields(reader, root, "a policy test file", FILE_KEYS, required=FILE_KEYS)
    named = top["policy"]
    named = reader.sequence(named, "policy") if isinstance(named, SequenceNode) else [named]
    policies = [str((path.parent / reader.text(node, "policy")).resolve()) for node in named]
    scenario = reader.text(top["scenario"], "scenario")
    case_nodes = reader.sequence(top["cases"], "cases")
    if not case_nodes:
        reader.error(top["cases"], "cases is empty: give at least one case")
    cases = []
    for case_node in case_nodes:
        case = _fields(reader, case_node, "a case", CASE_KEYS)
        mode = _choice(reader, case["mode"], "mode", MODES) if "mode" in case else None
        expected = []
        for action_node in reader.sequence(case["actions"], "actions") if "actions" in case else ():
            a = _fields(reader, action_node, "an expected action", EXPECT_KEYS, required=("actuator", "outcome"))
            at = reader.duration(a["at"], "at", positive=False) if "at" in a else None
            within = reader.duration(a["within"], "within", positive=False) if "within" in a else 15.0
            target = None
            if "target" in a:
                target = {label: reader.text(value, f"target label '{label}'")
                          for label, _, value in reader.entries(a["target"], "target")}
            expected.append(Expected(reader.string(a["actuator"], "actuator"),
                                     reader.string(a["outcome"], "outcome"), at, within, target))
        exact = reader.boolean(case["exact"], "exact") if "exact" in case else True
        name = reader.text(case["name"], "name") if "name" in case else mode or "default"
        cases.append({"name": name, "mode": mode, "expected": expected, "exact": exact})
    return policies, _scenario(reader, top["scenario"], scenario), cases


def _scenario(reader: YamlReader, node: Node, scenario: str):
    """The scenario a test file names; a name that is no scenario is located in the test file."""
    from reflexarc.simulations import ScenarioError, load_scenario

    from .simulate import SCENARIO_SUFFIXES
    try:
        return load_scenario(scenario)
    except ScenarioError as exc:
        if Path(scenario).suffix in SCENARIO_SUFFIXES:
            raise PolicyTestError(exc.file, exc.line, exc.col, exc.message) from None
        raise PolicyTestError(reader.file, *position(node), exc.message) from None


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
    from ..policy.diagnostics import PolicyError
    from ..policy.loader import load_policies
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
