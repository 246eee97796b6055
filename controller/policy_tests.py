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
returns 1 on any mismatch. Overhead: one simulated run per case.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from reflexarc.core.durations import DurationError, parse_duration

from .policy.model import MODES

CASE_KEYS = {"mode", "actions", "exact", "name"}
EXPECT_KEYS = {"actuator", "outcome", "at", "within", "target"}


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
    return yaml.safe_load(yaml.serialize(node))


def _scalar_map(path: Path, node, what: str) -> dict[str, str]:
    """A mapping of labels to scalar values, as strings."""
    return {k: str(_scalar(path, v, f"{what} label '{k}'")) for k, v in _mapping(path, node, what).items()}


def load_test_file(path: Path) -> tuple[list[str], str, list[dict]]:
    try:
        root = yaml.compose(path.read_text(), Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        loc = f"{mark.line + 1}:{mark.column + 1}" if mark else "1:1"
        raise PolicyTestError(f"{path}:{loc}: error: {getattr(exc, 'problem', exc)}") from None
    except OSError as exc:
        raise PolicyTestError(f"{path}: error: {exc.strerror or exc}") from None
    if root is None:
        raise PolicyTestError(f"{path}:1:1: error: empty test file")
    top = _mapping(path, root, "a policy test file")
    for key in ("policy", "scenario", "cases"):
        if key not in top:
            raise _err(path, root, f"missing '{key}'")
    for k, node in root.value:
        if k.value not in ("policy", "scenario", "cases"):
            raise _err(path, k, f"unknown key '{k.value}'")
    pol = top["policy"]
    policies = [_scalar(path, n, "policy") for n in pol.value] if isinstance(pol, yaml.SequenceNode) \
        else [_scalar(path, pol, "policy")]
    policies = [str((path.parent / p).resolve()) for p in policies]
    scenario = str(_scalar(path, top["scenario"], "scenario"))
    if not isinstance(top["cases"], yaml.SequenceNode):
        raise _err(path, top["cases"], "cases must be a list")
    cases = []
    for cnode in top["cases"].value:
        c = _mapping(path, cnode, "a case")
        for k, _ in cnode.value:
            if k.value not in CASE_KEYS:
                raise _err(path, k, f"unknown key '{k.value}' (expected one of {', '.join(sorted(CASE_KEYS))})")
        mode = _scalar(path, c["mode"], "mode") if "mode" in c else None
        if mode is not None and mode not in MODES:
            raise _err(path, c["mode"], f"mode must be one of {', '.join(MODES)}")
        expected = []
        for anode in (c["actions"].value if "actions" in c else []):
            a = _mapping(path, anode, "an expected action")
            for k, _ in anode.value:
                if k.value not in EXPECT_KEYS:
                    raise _err(path, k, f"unknown key '{k.value}'")
            try:
                at = parse_duration(_scalar(path, a["at"], "at")) if "at" in a else None
                within = parse_duration(_scalar(path, a["within"], "within")) if "within" in a else 15.0
            except DurationError as exc:
                raise _err(path, anode, str(exc)) from None
            target = _scalar_map(path, a["target"], "target") if "target" in a else None
            expected.append(Expected(str(_scalar(path, a["actuator"], "actuator")),
                                     str(_scalar(path, a["outcome"], "outcome")), at, within, target))
        exact = _scalar(path, c["exact"], "exact") if "exact" in c else True
        cases.append({"name": _scalar(path, c["name"], "name") if "name" in c else mode or "default",
                      "mode": mode, "expected": expected, "exact": bool(exact)})
    return policies, scenario, cases


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
    from .simulate import run_scenario
    files = []
    for p in map(Path, paths):
        files.extend(sorted(p.glob("*.yaml")) if p.is_dir() else [p])
    if not files:
        print("error: no policy test files found")
        return 1
    failed = total = 0
    for f in files:
        try:
            policies, scenario, cases = load_test_file(f)
        except PolicyTestError as exc:
            print(exc)
            failed += 1
            continue
        for case in cases:
            total += 1
            result = run_scenario(scenario, policies, case["mode"])
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
    return 1 if failed else 0
