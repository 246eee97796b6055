"""Loads YAML policy files into the policy model, reporting every mistake with its place.

The loader walks the nodes of the one YAML reader (``reflexarc.core.yaml_reader``:
depth-limited SafeLoader, duplicate keys, typed scalars) rather than plain
data, so every node keeps its line and column: each diagnostic points at the key
or value at fault, and all of a file's problems come out in one pass. Keys come
from ``schema.SECTIONS``, signals from the signal catalogue, actuator parameters
from the actuator specs; misspellings get a did-you-mean. A number out of range
(an integer past 64 bits or its parameter's range, such as a NUMA node or a
pid, a number past 1.8e308) is an error at the number. A policy with any error
is left out of the result. Keys are read as written, so YAML 1.1's ``on`` = true
does not apply to ``rollback: {on: [...]}``.

Example::

    policies = load_policies(["policies/"])            # raises PolicyError on any error
    policies, diagnostics = validate_paths(["bad.yaml"])  # never raises
    for d in diagnostics:
        print(d)   # bad.yaml:12:9: error: unknown key 'clearfor'; did you mean 'clear_for'?

Overhead: PyYAML's pure-Python parser dominates: about 5-30 ms for a policy file of
10-40 lines on a 2-core node (the checks add about a tenth); it runs once at
start-up or on ``reflexarc check``, never per event.
"""
from __future__ import annotations

import logging
import math
import os
import re
from fractions import Fraction
from pathlib import Path

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from reflexarc.actuators.specs import SPECS, netns_ref
from reflexarc.core.devices import KINDS as DEVICE_KINDS
from reflexarc.core.diagnostics import Diagnostic
from reflexarc.core.dscp import DSCP_NAMES, MAX_DSCP
from reflexarc.core.params import MAX_CPUS, ActuatorSpec, ParamError, ParamSpec, convert
from reflexarc.core.ports import EXAMPLE as PORT_EXAMPLE
from reflexarc.core.ports import port_range
from reflexarc.core.procfs import TASK_COMM_LEN
from reflexarc.core.rates import RateError, parse_rate
from reflexarc.core.budget import OF, PER, BudgetSpec, parse_percent
from reflexarc.core.rollout import RolloutSpec, parse_stage, parse_success_rate
from reflexarc.core.signals import LABEL_VALUES
from reflexarc.core.yaml_reader import MAX_INT, MAX_INT_TEXT, YamlReader, position
from reflexarc.core.yaml_reader import kind as _kind
from reflexarc.core.yaml_reader import shown as _shown
from reflexarc.core.yaml_reader import tag as _tag

from ..signals.catalogue import CATALOGUE, SignalSpec, suggest
from ..signals.producers import PROMQL, REQUIREMENTS
from .diagnostics import PolicyError, errors
from .model import (AGGREGATIONS, ALERTS_AT_STOP, CHANGE_DIRECTIONS, CHANGE_FRESH_S, MODES, ON_RESTART, OPERATORS,
                    ROLLBACK_TRIGGERS, Action, ChangeSpec, Combo, Condition, Loc, Policy, RateLimit, Rollback, Rule,
                    Selector, Verify)
from .schema import (FALSE_ALARMS_PATTERN, IFNAMSIZ, NAME_PATTERN, PERCENTILES, PERIODS_S, RELATIVE_THRESHOLD_PATTERN,
                     SECTIONS, SHIFT_FACTOR_PATTERN, TIME_THRESHOLD_PATTERN)

__all__ = ["Diagnostic", "PolicyError", "load_policies", "validate_paths"]

log = logging.getLogger("reflexarc.controller.policy")

POLICY_SUFFIXES = (".yaml", ".yml")
MAX_FILE_BYTES = 1 << 20
MAX_NESTING = 8          # all/any levels in one condition
# Numeric ranges: a number out of range is an error at the number.
MAX_PID = 1 << 22        # the kernel's PID_MAX_LIMIT (64-bit)
_NAME_RE = re.compile(NAME_PATTERN)
_RELATIVE_RE = re.compile(RELATIVE_THRESHOLD_PATTERN)
_TIME_RE = re.compile(TIME_THRESHOLD_PATTERN)
_FACTOR_RE = re.compile(SHIFT_FACTOR_PATTERN)
_FALSE_ALARMS_RE = re.compile(FALSE_ALARMS_PATTERN)
DEFAULT_FALSE_ALARMS = "1/day"
TIME_UNITS_US = {"us": 1, "ms": 1000, "s": 10**6, "m": 60 * 10**6, "h": 3600 * 10**6}   # microseconds in each


def load_policies(paths: list[str]) -> list[Policy]:
    """Policies from files and directories; raises ``PolicyError`` if any has an error.
    Warnings are logged."""
    policies, diagnostics = validate_paths(paths)
    if errors(diagnostics):
        raise PolicyError(diagnostics)
    for diagnostic in diagnostics:
        log.warning("%s", diagnostic)
    return policies


def validate_paths(paths: list[str]) -> tuple[list[Policy], list[Diagnostic]]:
    """Policies that loaded cleanly, and every diagnostic; never raises on bad input.

    A directory contributes its ``*.yaml``/``*.yml`` files (not its subfolders).
    Policy names must be unique across all the files."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    diagnostics: list[Diagnostic] = []
    policies: list[Policy] = []
    names: dict[str, Loc] = {}
    for name, path in _policy_files(paths, diagnostics):
        reader = _FileReader(name, names)
        try:
            policies.extend(reader.read_policies(path))
        except RecursionError:
            reader.at(1, 1, "error", "nesting too deep to check")
        except Exception as exc:  # a checker bug must still come out as a located finding
            reader.at(1, 1, "error", f"internal error while checking this file: {type(exc).__name__}: {exc}")
        diagnostics.extend(sorted(reader.diagnostics, key=lambda d: (d.line, d.col)))
    return policies, diagnostics


def _policy_files(paths, diagnostics: list[Diagnostic]) -> list[tuple[str, Path]]:
    out: list[tuple[str, Path]] = []
    seen: set[Path] = set()

    def add(name: str, path: Path) -> None:
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            out.append((name, path))

    for raw in paths:
        try:
            name = os.fspath(raw)
            path = Path(name)
            if path.is_dir():
                entries = sorted(p for p in path.iterdir()
                                 if p.suffix in POLICY_SUFFIXES and not p.name.startswith(".") and p.is_file())
                if not entries:
                    diagnostics.append(Diagnostic(name, 1, 1, "warning", "no policy files (*.yaml, *.yml) here"))
                for entry in entries:
                    add(str(entry), entry)
            elif path.exists():
                add(name, path)
            else:
                diagnostics.append(Diagnostic(name, 1, 1, "error", "no such file or directory"))
        except (OSError, ValueError, RuntimeError) as exc:   # RuntimeError: a symlink loop
            diagnostics.append(Diagnostic(name, 1, 1, "error", f"cannot read: {_os_reason(exc)}"))
        except TypeError:
            diagnostics.append(Diagnostic(repr(raw), 1, 1, "error", "not a path"))
    return out


def _os_reason(exc: Exception) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def _hint(word: str, choices) -> str:
    choices = list(choices)
    match = suggest(word, choices)
    return f"; did you mean '{match}'?" if match else f"; expected one of: {', '.join(choices)}"


class _FileReader(YamlReader):
    """Checks one file; collects diagnostics and the policies that had no error."""

    def __init__(self, file: str, policy_names: dict[str, Loc]) -> None:
        super().__init__(file)
        self._policy_names = policy_names          # shared across files, for uniqueness

    def loc(self, node: Node) -> Loc:
        return Loc(self.file, *position(node))

    # ---- file ------------------------------------------------------------------------------

    def read_policies(self, path: Path) -> list[Policy]:
        root = self.read(path, MAX_FILE_BYTES, empty="empty file: expected 'policies:' with a list of policies")
        if root is None:
            return []
        if not isinstance(root, MappingNode):
            self.error(root, f"a policy file is a mapping with a 'policies' list, got {_kind(root)}")
            return []
        fields = self._mapping(root, "file", "policy file")
        if fields is None or "policies" not in fields:
            return []
        key, items = fields["policies"]
        nodes = self.sequence(items, "'policies'")
        if nodes is not None and not nodes:
            self.warn(key, "no policies in this file")
        policies = []
        for node in nodes or ():
            before = self.error_count()
            policy = self._policy(node)
            if policy is not None and self.error_count() == before:
                policies.append(policy)
        return policies

    # ---- generic node readers --------------------------------------------------------------

    def _mapping(self, node: Node, section: str, what: str) -> dict[str, tuple[Node, Node]] | None:
        """Known keys of a mapping node -> (key node, value node); reports unknown,
        duplicate and missing keys."""
        entries = self.entries(node, what)
        if entries is None:
            return None
        spec = SECTIONS[section]
        out: dict[str, tuple[Node, Node]] = {}
        for key, key_node, value_node in entries:
            if key in spec.keys:
                out[key] = (key_node, value_node)
            else:
                self.error(key_node, f"unknown key '{key}'{_hint(key, spec.keys)}")
        present = {key for key, _, _ in entries}
        for key in spec.required:
            if key not in present:
                self.error(node, f"{what} is missing required key '{key}'")
        return out

    def _choice(self, node: Node, what: str, choices, hint: str = "") -> str | None:
        if _tag(node) != "str":
            self.error(node, f"{what} must be one of {', '.join(choices)}, got {_kind(node)}{hint}")
            return None
        if node.value not in choices:
            self.error(node, f"{what} '{node.value}' is not valid{_hint(node.value, choices)}{hint}")
            return None
        return node.value

    def _name(self, node: Node, what: str) -> str | None:
        name = self.string(node, f"{what} name")
        if name is not None and not _NAME_RE.match(name):
            self.error(node, f"{what} name '{name}' must match {NAME_PATTERN} (lower-case letters, digits, '-')")
            return None
        return name

    def _str_list(self, node: Node, what: str) -> list[tuple[str, Node]]:
        out = []
        for item in self.sequence(node, what) or ():
            text = self.text(item, f"item of {what}")
            if text is not None:
                out.append((text, item))
        return out

    def _ports(self, node: Node, what: str) -> list[tuple[int, int]]:
        out = []
        for item in self.sequence(node, what) or ():
            rng = self._port_range(item, what)
            if rng is not None:
                out.append(rng)
        return out

    def _port_range(self, node: Node, what: str) -> tuple[int, int] | None:
        tag = _tag(node)
        if tag not in ("int", "str"):
            self.error(node, f"{what}: bad port, got {_kind(node)}; {PORT_EXAMPLE}")
            return None
        value = self.integer(node, what) if tag == "int" else node.value
        if value is None:
            return None
        try:
            return port_range(value)
        except ValueError as exc:
            self.error(node, f"{what}: {exc}")
            return None

    def _matchers(self, node: Node, what: str, labels: tuple[str, ...] | None,
                  owner: str = "") -> dict[str, tuple[str, Node]]:
        """Label matchers: label -> (matcher text, key node). ``labels`` limits the
        label names (None: any)."""
        out = {}
        for label, key_node, value_node in self.entries(node, what) or ():
            if labels is not None and label not in labels:
                self.error(key_node, f"{owner} has no label '{label}'{_hint(label, labels)}")
                continue
            if _tag(value_node) not in ("str", "int", "float", "bool"):
                self.error(value_node, f"matcher for label '{label}' must be a string, got {_kind(value_node)}")
                continue
            text = value_node.value
            if text.startswith("~"):
                try:
                    re.compile(text[1:])
                except re.error as exc:
                    self.error(value_node, f"bad regular expression '{text[1:]}' for label '{label}': {exc}")
                    continue
            elif not text.startswith("!") and label in LABEL_VALUES and text not in LABEL_VALUES[label]:
                known = LABEL_VALUES[label]
                hint = {"p50": "0.5", "p99": "0.99"}.get(text) or suggest(text, known)
                self.warn(value_node, f"no source on this node gives {label} '{text}' (they give "
                                      f"{', '.join(known)}), so this matches nothing"
                                      + (f"; did you mean '{hint}'?" if hint else ""))
            out[label] = (text, key_node)
        return out

    # ---- policy ----------------------------------------------------------------------------

    def _policy(self, node: Node) -> Policy | None:
        fields = self._mapping(node, "policy", "policy")
        if fields is None:
            return None
        name = self._name(fields["name"][1], "policy") if "name" in fields else None
        what = f"policy '{name}'" if name else "policy"
        if name is not None:
            first = self._policy_names.get(name)
            if first is not None:
                self.error(fields["name"][1], f"duplicate policy name '{name}' (first defined at {first})")
            else:
                self._policy_names[name] = self.loc(fields["name"][1])
        policy = Policy(name=name, rules=[], loc=self.loc(node))
        if "description" in fields:
            policy.description = self.string(fields["description"][1], "'description'")
        if "mode" in fields:
            policy.mode = self._choice(fields["mode"][1], "'mode'", MODES)
        selector_match: dict[str, tuple[str, Node]] = {}
        if "selector" in fields:
            policy.selector, selector_match = self._selector(fields["selector"][1])
        if "requires" in fields:
            kinds = self._str_list(fields["requires"][1], "'requires'")
            for kind, item in kinds:
                if kind not in REQUIREMENTS:
                    self.error(item, f"unknown device '{kind}' in 'requires' (known: {', '.join(DEVICE_KINDS)}); "
                                     f"a policy that reads PromQL-fed signals requires {PROMQL}")
            policy.requires = tuple(dict.fromkeys(kind for kind, _ in kinds if kind in REQUIREMENTS))
        if "rules" in fields:
            value = fields["rules"][1]
            rule_nodes = self.sequence(value, "'rules'")
            if rule_nodes is not None and not rule_nodes:
                self.error(value, f"{what} has no rules; 'rules' needs at least one")
            rule_names: dict[str, Node] = {}
            for rule_node in rule_nodes or ():
                rule = self._rule(rule_node, policy.selector, set(selector_match), rule_names)
                if rule is not None:
                    policy.rules.append(rule)
        self._check_selector_labels(policy, selector_match)
        if "rollout" in fields:
            policy.rollout = self._rollout(fields["rollout"][1], policy)
        if "budget" in fields:
            policy.budget = self._budget(fields["budget"][1], policy)
        return policy

    def _parsed(self, node: Node, parse):
        """``parse`` of the scalar at ``node``; its ``ValueError`` an error
        there, and None (as for a missing or non-scalar value)."""
        value = self.value(node)
        if value is None:
            return None
        try:
            return parse(value)
        except ValueError as exc:
            self.error(node, str(exc))
            return None

    def _budget(self, node: Node, policy: Policy) -> BudgetSpec | None:
        fields = self._mapping(node, "budget", "'budget'")
        if fields is None:
            return None
        values: dict = {}
        if "max_nodes" in fields:
            values["max_nodes"] = self.integer(fields["max_nodes"][1], "'max_nodes'", minimum=1)
        if "max_percent" in fields:
            values["max_percent"] = self._parsed(fields["max_percent"][1],
                                                 lambda value: parse_percent(value, "'max_percent'"))
        if "per" in fields:
            values["per"] = self._choice(fields["per"][1], "'per'", PER)
        if "of" in fields:
            values["of"] = self._choice(fields["of"][1], "'of'", OF)
        if not {"max_nodes", "max_percent"} & set(fields):
            self.error(node, "a budget needs max_nodes, max_percent or both, e.g. budget: {max_nodes: 2}")
            return None
        if values.get("of") == "job" and (values.get("per") != "job" or "max_percent" not in fields):
            self.error(fields["of"][1], "'of: job' is a share of each job's own nodes: it needs per: job and "
                                        "max_percent, e.g. budget: {max_percent: '25%', per: job, of: job}")
        if values.get("per") == "job":
            jobless = [r.name for r in _changing_rules(policy) if "job" not in r.by]
            if jobless and policy.selector.one_job() is None:
                self.error(fields["per"][1], f"a per-job budget needs each change's job, and rule(s) "
                                             f"{', '.join(jobless)} make targets without one; add job to their "
                                             f"'by', or name the job in the selector (match: {{job: NAME}})")
        if any(v is None for v in values.values()):
            return None
        return BudgetSpec(**values)

    def _rollout(self, node: Node, policy: Policy) -> RolloutSpec | None:
        fields = self._mapping(node, "rollout", "'rollout'")
        if fields is None:
            return None
        values: dict = {}
        if "stages" in fields:
            items = self.sequence(fields["stages"][1], "'stages'")
            if items is not None and not items:
                self.error(fields["stages"][1], "'stages' is empty; list them, e.g. [1, \"10%\", all]")
            stages = []
            for i, item in enumerate(items or ()):
                stage = self._parsed(item, parse_stage)
                if stage is None:
                    continue
                stages.append(stage)
                if stage.size(0) is None and i < len(items) - 1:
                    self.error(item, "'all' admits every node, so it can only be the last stage")
            values["stages"] = tuple(stages)
        if "promote_after" in fields:
            values["promote_after"] = self.integer(fields["promote_after"][1], "'promote_after'", minimum=1)
        if "success_rate" in fields:
            values["success_rate"] = self._parsed(fields["success_rate"][1], parse_success_rate)
        if "window" in fields:
            values["window"] = self.integer(fields["window"][1], "'window'", minimum=1, maximum=1000)
        unverified = [r.name for r in _changing_rules(policy) if r.verify is None]
        if unverified:
            self.error(node, f"a rollout widens on verified remediations, and rule(s) {', '.join(unverified)} "
                             f"change the system without a 'verify'; add verify: {{when: ..., timeout: ...}} to them")
        if any(v is None for v in values.values()):
            return None
        return RolloutSpec(**values)

    def _selector(self, node: Node) -> tuple[Selector, dict[str, tuple[str, Node]]]:
        selector = Selector(loc=self.loc(node))
        fields = self._mapping(node, "selector", "'selector'")
        if fields is None:
            return selector, {}
        match: dict[str, tuple[str, Node]] = {}
        if "match" in fields:
            match = self._matchers(fields["match"][1], "selector 'match'", None)
            selector.match = {label: text for label, (text, _) in match.items()}
        if "processes" in fields:
            processes = self._str_list(fields["processes"][1], "'processes'")
            for comm, item in processes:
                if len(comm.encode()) >= TASK_COMM_LEN:
                    self.warn(item, f"process name '{comm}' is longer than {TASK_COMM_LEN - 1} bytes; the kernel "
                                    f"truncates comm names, so it never matches; use '{comm[:TASK_COMM_LEN - 1]}'")
            selector.processes = tuple(comm for comm, _ in processes)
        if "pids" in fields:
            pids = [self.integer(item, "item of 'pids'", minimum=1, maximum=MAX_PID)
                    for item in self.sequence(fields["pids"][1], "'pids'") or ()]
            selector.pids = tuple(pid for pid in pids if pid is not None)
        if "cgroup" in fields:
            cgroup = self.string(fields["cgroup"][1], "'cgroup'")
            if cgroup is not None and not cgroup.startswith("/"):
                self.error(fields["cgroup"][1], f"'cgroup' must be an absolute path, got '{cgroup}'")
            selector.cgroup = cgroup
        if "interfaces" in fields:
            interfaces = self._str_list(fields["interfaces"][1], "'interfaces'")
            for iface, item in interfaces:
                self._check_interface(iface, item)
            selector.interfaces = tuple(iface for iface, _ in interfaces)
        if "netns" in fields:
            node = fields["netns"][1]
            netns = self.text(node, "'netns'")
            try:
                selector.netns = netns_ref(netns) if netns is not None else ""
            except ValueError as exc:
                self.error(node, f"'netns': {exc}")
        if "link_speeds" in fields:
            for iface, key_node, value_node in self.entries(fields["link_speeds"][1], "'link_speeds'") or ():
                self._check_interface(iface, key_node)
                if _tag(value_node) == "int" and len(value_node.value) > MAX_INT_TEXT:
                    self.error(value_node, f"speed of '{iface}' is out of range: {_shown(value_node)}")
                    continue
                value = self.value(value_node) if _tag(value_node) in ("str", "int", "float") else None
                try:
                    selector.link_speeds[iface] = parse_rate(value)
                except RateError as exc:
                    self.error(value_node, f"speed of '{iface}': {exc}")
                except OverflowError:         # an integer beyond any float
                    self.error(value_node, f"speed of '{iface}' is out of range: {_shown(value_node)}")
        for key in ("jobs", "pods"):
            if key in fields:
                setattr(selector, key, tuple(glob for glob, _ in self._str_list(fields[key][1], f"'{key}'")))
        if "ports" in fields:
            selector.ports = tuple(self._ports(fields["ports"][1], "'ports'"))
        return selector, match

    def _check_interface(self, iface: str, node: Node) -> None:
        if not iface or len(iface.encode()) >= IFNAMSIZ or "/" in iface or any(c.isspace() for c in iface):
            self.error(node, f"'{iface}' is not a valid interface name (1-{IFNAMSIZ - 1} bytes, no '/' or spaces)")

    def _check_selector_labels(self, policy: Policy, match: dict[str, tuple[str, Node]]) -> None:
        labels = _labels([c for rule in policy.rules for c in _rule_conditions(rule)])
        if not labels:
            return
        for label, (_, key_node) in match.items():
            if label not in labels:
                self.error(key_node, f"no signal read by policy '{policy.name}' carries label '{label}'"
                                     f"{_hint(label, sorted(labels))}")

    # ---- rule ------------------------------------------------------------------------------

    def _rule(self, node: Node, selector: Selector, selector_labels: set[str],
              rule_names: dict[str, Node]) -> Rule | None:
        fields = self._mapping(node, "rule", "rule")
        if fields is None:
            return None
        name = self._name(fields["name"][1], "rule") if "name" in fields else None
        what = f"rule '{name}'" if name else "rule"
        if name is not None:
            if name in rule_names:
                self.error(fields["name"][1], f"duplicate rule name '{name}' in this policy "
                                              f"(first at line {rule_names[name].start_mark.line + 1})")
            else:
                rule_names[name] = fields["name"][1]
        rule = Rule(name=name, when=None, actions=[], rollback=Rollback(), loc=self.loc(node))
        if "when" in fields:
            rule.when = self._when(fields["when"][1], selector_labels, 0)
        for key, attr in (("for", "for_"), ("clear_for", "clear_for"), ("cooldown", "cooldown")):
            if key in fields:
                setattr(rule, attr, self.duration(fields[key][1], f"'{key}'", positive=False))
        if "escalate" in fields:
            rule.escalate = self.boolean(fields["escalate"][1], "'escalate'")
        if "verify" in fields:
            rule.verify = self._verify(fields["verify"][1], selector_labels)
        if "max_actions" in fields:
            rule.max_actions = self._rate_limit(fields["max_actions"][1])
        if "actions" in fields:
            rule.actions = self._actions(fields["actions"][1], what, selector)
        triggers: dict[str, Node] = {}
        if "rollback" in fields:
            rule.rollback, triggers = self._rollback(fields["rollback"][1])
        if "by" in fields:
            rule.by = self._by(fields["by"][1], rule, what)
        self._check_rule(node, fields, rule, what, triggers)
        return rule

    def _by(self, node: Node, rule: Rule, what: str) -> tuple[str, ...]:
        labels = _labels(_rule_conditions(rule))
        out = []
        for label, item in self._str_list(node, "'by'"):
            if label in out:
                self.error(item, f"label '{label}' is listed twice in 'by'")
            elif labels and label not in labels:
                self.error(item, f"no signal of {what} carries label '{label}'{_hint(label, sorted(labels))}")
            else:
                out.append(label)
        return tuple(out)

    def _check_rule(self, node: Node, fields: dict, rule: Rule, what: str, triggers: dict[str, Node]) -> None:
        changing = sorted({a.actuator for a in rule.actions if a.actuator in SPECS
                           and SPECS[a.actuator].changes_system})
        if changing and "rollback" not in fields:
            self.error(node, f"{what} has actions that change the system ({', '.join(changing)}) but no "
                             f"'rollback'; say when to undo them, e.g. rollback: {{on: [verify-failed, clear]}}, "
                             f"or write 'rollback: never' to keep the changes")
        elif changing and _keys(fields["rollback"][1]) == {"alerts"}:
            self.error(fields["rollback"][1], f"{what} has actions that change the system ({', '.join(changing)}) "
                                              f"but its 'rollback' only says what becomes of its alerts; say when "
                                              f"to undo the changes with 'on', e.g. on: [verify-failed, clear], "
                                              f"or set never: true to keep them")
        if rule.escalate and len(rule.actions) > 1 and "verify" not in fields:
            at = fields["escalate"][0] if "escalate" in fields else fields["actions"][0]
            self.error(at, f"{what} escalates through {len(rule.actions)} actions but has no 'verify' to tell "
                           f"when an action did not work; add verify: {{when: ..., timeout: ...}} "
                           f"or set escalate: false")
        if "verify-failed" in triggers and "verify" not in fields:
            self.error(triggers["verify-failed"], f"rollback on 'verify-failed' needs a 'verify' in {what}")

    def _rate_limit(self, node: Node) -> RateLimit | None:
        fields = self._mapping(node, "max_actions", "'max_actions'")
        if fields is None:
            return None
        limit = RateLimit(count=None, window=None, loc=self.loc(node))
        if "count" in fields:
            limit.count = self.integer(fields["count"][1], "'count'", minimum=1)
        if "window" in fields:
            limit.window = self.duration(fields["window"][1], "'window'", positive=True)
        return limit

    # ---- conditions ------------------------------------------------------------------------

    def _when(self, node: Node, selector_labels: set[str], depth: int) -> Condition | Combo | None:
        if depth > MAX_NESTING:
            self.error(node, f"conditions are nested more than {MAX_NESTING} levels deep")
            return None
        if isinstance(node, SequenceNode):
            self.error(node, "a list of conditions must say how they combine: all: [...] or any: [...]")
            return None
        if isinstance(node, MappingNode) and self.flatten(node):
            keys = {k.value for k, _ in node.value if isinstance(k, ScalarNode)}
            if keys & {"all", "any"}:
                return self._combo(node, selector_labels, depth)
            if "change" in keys:
                return self._change(node, selector_labels)
        return self._condition(node, selector_labels)

    def _combo(self, node: MappingNode, selector_labels: set[str], depth: int) -> Combo | None:
        fields = self._mapping(node, "combo", "combination")
        if not fields:
            return None
        if len(fields) > 1:
            self.error(fields["any"][0], "a combination holds either 'all' or 'any', not both; nest them instead")
            return None
        kind, (_, value) = next(iter(fields.items()))
        combo = Combo(kind=kind, items=[], loc=self.loc(node))
        items = self.sequence(value, f"'{kind}'")
        if items is not None and not items:
            self.error(value, f"'{kind}' needs at least one condition")
        for item in items or ():
            combo.items.append(self._when(item, selector_labels, depth + 1))
        return combo

    def _condition(self, node: Node, selector_labels: set[str]) -> Condition | None:
        fields = self._mapping(node, "condition", "condition")
        if fields is None:
            return None
        cond = Condition(signal=None, agg=None, window=None, op=None, threshold=None, loc=self.loc(node))
        spec: SignalSpec | None = None
        if "signal" in fields:
            cond.signal = self.string(fields["signal"][1], "'signal'")
            if cond.signal is not None and cond.signal not in CATALOGUE:
                self.error(fields["signal"][1], f"unknown signal '{cond.signal}'{_hint(cond.signal, CATALOGUE)}")
            spec = CATALOGUE.get(cond.signal)
        if "match" in fields:
            labels = spec.labels if spec else None
            match = self._matchers(fields["match"][1], "'match'", labels, f"signal '{cond.signal}'")
            cond.match = {label: text for label, (text, _) in match.items()}
        if "agg" in fields:
            cond.agg = self._choice(fields["agg"][1], "'agg'", AGGREGATIONS)
        if "window" in fields:
            cond.window = self.duration(fields["window"][1], "'window'", positive=True)
        if "op" in fields:
            cond.op = self._choice(fields["op"][1], "'op'", OPERATORS, hint=" (quote operators: op: \">\")")
        if "threshold" in fields:
            self._threshold(fields["threshold"][1], cond, spec)
        if "baseline" in fields:
            key, value = fields["baseline"]
            cond.baseline_window = self.duration(value, "'baseline'", positive=True)
            if not cond.relative and cond.threshold is not None:
                self.warn(key, "'baseline' only matters for a relative threshold such as '3x baseline'")
        if spec is not None:
            self._check_aggregation(fields, cond, spec, selector_labels)
        return cond

    def _change(self, node: Node, selector_labels: set[str]) -> Condition | None:
        """``{change: {signal, up|down, false_alarms, baseline, match}}``."""
        outer = self._mapping(node, "change_item", "a change condition")
        if not outer or "change" not in outer:
            return None
        inner = outer["change"][1]
        fields = self._mapping(inner, "change", "'change'")
        if fields is None:
            return None
        cond = Condition(signal=None, agg="change", window=CHANGE_FRESH_S, op=">", threshold=None,
                         loc=self.loc(inner))
        spec: SignalSpec | None = None
        if "signal" in fields:
            at = fields["signal"][1]
            cond.signal = self.string(at, "'signal'")
            if cond.signal is not None and cond.signal not in CATALOGUE:
                self.error(at, f"unknown signal '{cond.signal}'{_hint(cond.signal, CATALOGUE)}")
            spec = CATALOGUE.get(cond.signal)
            if spec is not None and spec.kind != "gauge":
                self.error(at, f"'change' needs a gauge; '{spec.name}' is a {spec.kind}, which only grows: "
                               f"use a condition on its rate instead")
        if "match" in fields:
            labels = spec.labels if spec else None
            match = self._matchers(fields["match"][1], "'match'", labels, f"signal '{cond.signal}'")
            cond.match = {label: text for label, (text, _) in match.items()}
        if "baseline" in fields:
            cond.baseline_window = self.duration(fields["baseline"][1], "'baseline'", positive=True)
        directions = [d for d in CHANGE_DIRECTIONS if d in fields]
        if len(directions) != 1:
            self.error(inner, "'change' needs exactly one of 'up' or 'down': the shift to detect "
                              "(e.g. up: 1.3x)")
            return cond
        direction = directions[0]
        shift = self._shift(fields[direction][1], direction, spec)
        alarms_node = fields["false_alarms"][1] if "false_alarms" in fields else None
        alarms, alarms_text = self._false_alarms(alarms_node)
        if shift is None or alarms is None:
            return cond
        factor, amount, shown = shift
        cond.change = ChangeSpec(direction, factor, amount, alarms, f"{direction} {shown}, {alarms_text}")
        return cond

    def _shift(self, node: Node, direction: str, spec: SignalSpec | None):
        """(factor, amount, as written) of ``up``/``down``; None after an error."""
        example = f"'{direction}' takes a factor of the reference (e.g. {'1.3x' if direction == 'up' else '0.7x'}) " \
                  f"or an amount in the signal's unit (a number, or a duration for a time signal)"
        tag = _tag(node)
        if tag in ("int", "float"):
            amount = self.number(node, f"'{direction}'")
            if amount is not None and not amount > 0:
                self.error(node, f"bad '{direction}' {_shown(node)}: an amount must be greater than 0")
                return None
            return None if amount is None else (None, amount, f"{amount:g}")
        text = node.value if tag == "str" else ""
        factor = _FACTOR_RE.match(text)
        if factor is not None:
            f = float(factor.group(1))
            if direction == "up" and not f > 1:
                self.error(node, f"bad 'up' '{text}': a rise is a factor above 1 (e.g. 1.3x)")
                return None
            if direction == "down" and not 0 < f < 1:
                self.error(node, f"bad 'down' '{text}': a fall is a factor between 0 and 1 (e.g. 0.7x)")
                return None
            return f, None, f"{f:g}x"
        timed = _TIME_RE.match(text)
        if timed is not None and spec is not None:
            probe = Condition(signal=spec.name, agg="change", window=0.0, op=">", threshold=None)
            self._time_threshold(node, probe, spec, timed)
            if probe.threshold is None:
                return None
            if not probe.threshold > 0:
                self.error(node, f"bad '{direction}' '{text}': an amount must be greater than 0")
                return None
            return None, probe.threshold, text.strip()
        if timed is not None:
            return None                   # no signal, or an unknown one: said where it is named
        shown = f"'{text}'" if tag == "str" else _kind(node)
        self.error(node, f"bad '{direction}' {shown}: {example}")
        return None

    def _false_alarms(self, node: Node | None) -> tuple[float | None, str]:
        """Per second, and as written: ``1/day`` -> 1/86400."""
        if node is None:
            text = DEFAULT_FALSE_ALARMS
        else:
            text = node.value if _tag(node) == "str" else ""
        m = _FALSE_ALARMS_RE.match(text)
        if m is None or not float(m.group(1)) > 0:
            shown = f"'{text}'" if text else _kind(node)
            self.error(node, f"bad 'false_alarms' {shown}: write '<n>/<period>' with n > 0 and period one of "
                             f"{', '.join(PERIODS_S)} (e.g. '1/day')")
            return None, text
        return float(m.group(1)) / PERIODS_S[m.group(2)], f"{m.group(1)}/{m.group(2)}"

    def _threshold(self, node: Node, cond: Condition, spec: SignalSpec | None) -> None:
        example = "use a number (e.g. 200), a duration for a time signal (e.g. '5ms') or '<factor>x baseline' " \
                  "(e.g. '3x baseline')"
        tag = _tag(node)
        if tag in ("int", "float"):
            cond.threshold = self.number(node, "'threshold'")
            return
        timed = _TIME_RE.match(node.value) if tag == "str" else None
        if timed is not None:
            self._time_threshold(node, cond, spec, timed)
            return
        match = _RELATIVE_RE.match(node.value) if tag == "str" else None
        if match is None:
            shown = f"'{node.value}'" if tag == "str" else _kind(node)
            self.error(node, f"bad threshold {shown}: {example}")
            return
        factor = float(match.group(1))
        if factor <= 0 or factor == math.inf:
            need = "greater than 0" if factor <= 0 else "a finite number"
            self.error(node, f"bad threshold '{_shown(node)}': the factor must be {need}")
            return
        cond.threshold, cond.relative = factor, True

    def _time_threshold(self, node: Node, cond: Condition, spec: SignalSpec | None, timed: re.Match) -> None:
        """A duration (``5ms``) as a threshold, in the unit of the signal, which
        must be a time (``step_time_ms``: 5.0; ``tcp_srtt_us``: 5000.0)."""
        if spec is None:
            return                        # no signal, or an unknown one: said where it is named
        if spec.unit not in TIME_UNITS_US:
            self.error(node, f"threshold '{node.value}' is a duration, but signal '{spec.name}' is not a time "
                             f"(its unit is '{spec.unit}'): write a number in its unit")
            return
        if cond.agg in ("rate", "count", "slope"):
            self.error(node, f"threshold '{node.value}' is a duration, but the {cond.agg} of '{spec.name}' is "
                             f"not a time: write a number")
            return
        amount, unit = Fraction(timed.group(1)), timed.group(2)
        cond.threshold = float(amount * TIME_UNITS_US[unit] / TIME_UNITS_US[spec.unit])

    def _check_aggregation(self, fields: dict, cond: Condition, spec: SignalSpec, selector_labels: set[str]) -> None:
        at = fields["agg"][1] if "agg" in fields else fields["signal"][1]
        if cond.agg == "slope" and spec.kind == "counter":
            self.warn(at, f"'slope' of counter '{spec.name}' is how fast its rate changes; "
                          f"for how fast it grows use rate")
        if cond.agg in ("rate", "delta") and spec.kind == "gauge":
            self.warn(at, f"'{cond.agg}' of gauge '{spec.name}' measures how fast a level changes; "
                          f"for the level itself use max, mean or a percentile")
        if cond.agg in PERCENTILES + ("mean",) and spec.kind == "counter":
            self.warn(at, f"'{cond.agg}' of counter '{spec.name}' aggregates a running total; "
                          f"use rate or delta for how much it grew")
        if "quantile" in spec.labels and "quantile" not in cond.match and "quantile" not in selector_labels:
            self.warn(fields["signal"][1], f"'{spec.name}' has one series per quantile; without "
                                           f"match: {{quantile: \"0.99\"}} the condition mixes them")

    def _verify(self, node: Node, selector_labels: set[str]) -> Verify | None:
        fields = self._mapping(node, "verify", "'verify'")
        if fields is None:
            return None
        verify = Verify(when=None, timeout=None, loc=self.loc(node))
        if "when" in fields:
            verify.when = self._when(fields["when"][1], selector_labels, 0)
        if "timeout" in fields:
            verify.timeout = self.duration(fields["timeout"][1], "'timeout'", positive=True)
        return verify

    # ---- actions ---------------------------------------------------------------------------

    def _actions(self, node: Node, what: str, selector: Selector) -> list[Action]:
        items = self.sequence(node, "'actions'")
        if items is not None and not items:
            self.error(node, f"{what} has no actions; 'actions' needs at least one")
        actions = []
        for item in items or ():
            action = self._action(item, selector)
            if action is not None:
                actions.append(action)
        return actions

    def _action(self, node: Node, selector: Selector) -> Action | None:
        fields = self._mapping(node, "action", "action")
        if fields is None:
            return None
        action = Action(actuator=None, loc=self.loc(node))
        if "actuator" not in fields:
            return action
        name_node = fields["actuator"][1]
        action.actuator = self.string(name_node, "'actuator'")
        spec = SPECS.get(action.actuator)
        if action.actuator is not None and spec is None:
            self.error(name_node, f"unknown actuator '{action.actuator}'{_hint(action.actuator, SPECS)}")
        if spec is None:
            return action
        params_node = fields["params"][1] if "params" in fields else None
        action.params = self._params(spec, params_node, node)
        for param in spec.params:       # required, but the selector may give it
            field = param.from_selector
            if param.required and field and param.name not in action.params and not getattr(selector, field):
                self.error(name_node, f"'{spec.name}' needs {param.name}: set params.{param.name} or the policy's "
                                      f"selector.{field}")
        return action

    def _params(self, spec: ActuatorSpec, node: Node | None, action_node: Node) -> dict:
        out: dict = {}
        present: dict[str, Node] = {}
        for name, key_node, value_node in (self.entries(node, "'params'") or ()) if node is not None else ():
            param = spec.param(name)
            if param is None:
                replaced = spec.replacement(name)
                names = [p.name for p in spec.params]
                self.error(key_node, f"actuator '{spec.name}' has no parameter '{name}'"
                                     + (f" any more; {replaced}" if replaced else _hint(name, names)))
                continue
            present[name] = key_node
            value = self._param(spec, param, value_node)
            if value is not None:
                out[name] = value
        for param in spec.params:
            if param.required and not param.from_selector and param.name not in present:
                self.error(node if node is not None else action_node,
                           f"actuator '{spec.name}' needs parameter '{param.name}' ({param.help or param.type})")
        for group in spec.one_of:
            given = [name for name in group if name in present]
            for name in given[1:]:
                self.error(present[name], f"'{name}' and '{given[0]}' are alternatives for '{spec.name}'; "
                                          f"give only one of {', '.join(group)}")
            if not given:
                self.error(node if node is not None else action_node,
                           f"actuator '{spec.name}' needs one of {', '.join(group)}")
        return out

    def _param(self, spec: ActuatorSpec, param: ParamSpec, node: Node):
        """The parameter's value in canonical form (``reflexarc.core.params``);
        the node must be of the YAML kind the schema allows for the type."""
        what = f"parameter '{param.name}' of '{spec.name}'"
        value = self._param_value(param, node, what)
        if value is None:
            return None
        try:
            value = convert(param, value)
        except ParamError as exc:
            match = suggest(str(value), map(str, param.choices)) if param.choices else None
            self.error(node, f"{what}: {exc}" + (f"; did you mean '{match}'?" if match else ""))
            return None
        return value

    def _param_value(self, param: ParamSpec, node: Node, what: str):
        kind = param.type
        if kind == "str":
            return self.text(node, what)
        if kind == "int":
            return self.integer(node, what, *(param.range or (None, MAX_INT)))
        if kind == "float":
            return self.number(node, what)
        if kind == "bool":
            return self.boolean(node, what)
        if kind == "duration":
            return self.duration(node, what, positive=True)
        if kind == "dscp":
            return self._dscp(node, what)
        if kind == "int_list":     # a list of CPUs, or text in the kernel's notation ("0-3,8") for convert
            if _tag(node) == "str":
                return node.value
            if not isinstance(node, SequenceNode):
                self.error(node, f"{what} must be a list of CPUs or a CPU list such as '0-3,8', got {_kind(node)}")
                return None
            items = [self.integer(item, f"item of {what}", 0, MAX_CPUS - 1) for item in self.sequence(node, what) or ()]
            return None if None in items else items
        if kind == "str_list":
            return [text for text, _ in self._str_list(node, what)]
        if kind == "port_range":
            return self._ports(node, what)
        if kind == "mapping":
            return self._free_mapping(node, what)
        self.error(node, f"{what} has type '{kind}', which this loader does not know")
        return None

    def _dscp(self, node: Node, what: str) -> str | int | None:
        """A DSCP as the schema allows it: a name exactly as written in
        ``DSCP_NAMES``, or an integer 0-``MAX_DSCP``."""
        tag = _tag(node)
        if tag == "int":
            return self.integer(node, what, 0, MAX_DSCP)
        if tag == "str" and node.value in DSCP_NAMES:
            return node.value
        shown = f"'{node.value}'" if tag == "str" else _kind(node)
        hint = f"; did you mean '{node.value.upper()}'?" if tag == "str" and node.value.upper() in DSCP_NAMES else ""
        self.error(node, f"{what} must be a DSCP name ({', '.join(DSCP_NAMES)}) or a number 0-{MAX_DSCP}, "
                         f"got {shown}{hint}")
        return None

    def _free_mapping(self, node: Node, what: str) -> dict | None:
        """A mapping of free-form values (handler arguments, alert labels), keys as written."""
        before = self.error_count()
        entries = self.entries(node, what)
        if entries is None:
            return None
        value = {key: self.value(value_node) for key, _, value_node in entries}
        return value if self.error_count() == before else None

    # ---- rollback --------------------------------------------------------------------------

    def _rollback(self, node: Node) -> tuple[Rollback | None, dict[str, Node]]:
        if isinstance(node, ScalarNode):
            if _tag(node) == "str" and node.value == "never":
                return Rollback(never=True, loc=self.loc(node)), {}
            self.error(node, f"'rollback' must be a mapping or 'never', got {_kind(node)}")
            return None, {}
        fields = self._mapping(node, "rollback", "'rollback'")
        if fields is None:
            return None, {}
        rollback = Rollback(loc=self.loc(node))
        if "alerts" in fields:
            rollback.alerts = self._choice(fields["alerts"][1], "'alerts'", ALERTS_AT_STOP) or rollback.alerts
        if "never" in fields:
            rollback.never = self.boolean(fields["never"][1], "'never'")
            if rollback.never:
                for key, (key_node, _) in fields.items():
                    if key not in ("never", "alerts"):
                        self.error(key_node, f"'never' keeps the changes, so '{key}' cannot be set with it; "
                                             f"remove one of them")
                return rollback, {}
        triggers: dict[str, Node] = {}
        if set(fields) == {"alerts"}:        # only what becomes of the alerts: no change to undo (_check_rule)
            return rollback, triggers
        if "on" in fields:
            items = self.sequence(fields["on"][1], "'on'")
            if items is not None and not items:
                self.error(fields["on"][1], "'on' is empty, so nothing would undo the change; list triggers "
                                            f"({', '.join(ROLLBACK_TRIGGERS)}) or write 'rollback: never'")
            for item in items or ():
                trigger = self._choice(item, "rollback trigger", ROLLBACK_TRIGGERS)
                if trigger in triggers:
                    self.error(item, f"rollback trigger '{trigger}' is listed twice")
                elif trigger is not None:
                    triggers[trigger] = item
            rollback.on = frozenset(triggers)
        else:
            self.error(node, "'rollback' needs 'on' (the events that undo the change), "
                             "or write 'rollback: never' to keep the changes")
        if "ttl" in fields:
            key, value = fields["ttl"]
            rollback.ttl = self.duration(value, "'ttl'", positive=True)
            if "on" in fields and "ttl" not in triggers:
                self.error(key, "'ttl' is set but 'ttl' is not in 'on'; add it to 'on' or remove 'ttl'")
        elif "ttl" in triggers:
            self.error(triggers["ttl"], "rollback trigger 'ttl' needs a 'ttl' value, e.g. ttl: 1h")
        if "on_restart" in fields:
            rollback.on_restart = self._choice(fields["on_restart"][1], "'on_restart'", ON_RESTART)
        return rollback, triggers


def _keys(node: Node) -> set[str] | None:
    """The keys a mapping node writes; None for another node."""
    if not isinstance(node, MappingNode):
        return None
    return {key.value for key, _ in node.value if isinstance(key, ScalarNode)}


def _changing_rules(policy: Policy) -> list[Rule]:
    """The rules of ``policy`` with an action that changes the system."""
    return [r for r in policy.rules
            if any(a.actuator in SPECS and SPECS[a.actuator].changes_system for a in r.actions)]


def _rule_conditions(rule: Rule) -> list[Condition]:
    """The rule's conditions (firing and verification) that were read successfully."""
    out = []
    for when in (rule.when, rule.verify.when if rule.verify is not None else None):
        stack = [when]
        while stack:
            item = stack.pop()
            if isinstance(item, Combo):
                stack.extend(item.items)
            elif isinstance(item, Condition):
                out.append(item)
    return out


def _labels(conditions: list[Condition]) -> set[str]:
    return {label for c in conditions if c.signal in CATALOGUE for label in CATALOGUE[c.signal].labels}
