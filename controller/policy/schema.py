"""The policy language's vocabulary, and the JSON Schema (draft 2020-12) built from it.

``SECTIONS`` names every key of every mapping in a policy file, with its meaning;
the loader rejects keys that are not there and the schema describes exactly these.
The schema also draws on the model constants (modes, aggregations, operators,
rollback triggers), the signal catalogue (signal names and the labels each one
carries) and the actuator specs (per-actuator parameters), so editors running
yaml-language-server complete and check policies as the loader does. The
committed ``policies/schema.json`` is this module's output; a test keeps it equal.
The schema declares draft 2020-12 but keeps to keywords that mean the same in
draft-07 (``$defs`` only as a container for ``$ref`` pointers, nothing beside a
``$ref`` but its description), since yaml-language-server validates with draft-07
semantics.

Example::

    python -m reflexarc.controller.policy.schema > policies/schema.json

    # first line of a policy file:
    # yaml-language-server: $schema=schema.json

Overhead: builds a dictionary of a few hundred entries on demand; nothing at import.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from reflexarc.actuators.specs import NETNS_PATTERN, SPECS
from reflexarc.core.devices import KINDS as DEVICE_KINDS
from reflexarc.core.dscp import DSCP_NAMES, MAX_DSCP
from reflexarc.core.durations import DURATION_PATTERN
from reflexarc.core.durations import EXAMPLES as DURATION_EXAMPLES
from reflexarc.core.params import MAX_CPUS, ActuatorSpec, ParamSpec
from reflexarc.core.ports import MAX_PORT, PORT_RANGE_PATTERN
from reflexarc.core.rates import PATTERN as RATE_PATTERN
from reflexarc.core.budget import OF, PER, PERCENT_PATTERN

from ..signals.catalogue import CATALOGUE
from ..signals.producers import REQUIREMENTS
from .model import AGGREGATIONS, ALERTS_AT_STOP, MODES, ON_RESTART, OPERATORS, ROLLBACK_TRIGGERS

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]*$"
RELATIVE_THRESHOLD_PATTERN = r"^\s*([0-9]+(?:\.[0-9]+)?)\s*x\s*baseline\s*$"
SHIFT_FACTOR_PATTERN = r"^\s*([0-9]+(?:\.[0-9]+)?)\s*x\s*$"                # change: {up: 1.3x}
PERIODS_S = {"s": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600,
             "d": 86400, "day": 86400, "w": 604800, "week": 604800}
FALSE_ALARMS_PATTERN = r"^\s*([0-9]+(?:\.[0-9]+)?)\s*/\s*(" + "|".join(PERIODS_S) + r")\s*$"   # "1/day"
TIME_THRESHOLD_PATTERN = r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(us|ms|s|m|h)\s*$"   # of a time signal, in its unit
CPU_LIST_PATTERN = r"^\s*(?:[0-9]+\s*(?:-\s*[0-9]+\s*)?(?:,\s*[0-9]+\s*(?:-\s*[0-9]+\s*)?)*)?$"   # "0-3,8"
POSITIVE_DURATION_PATTERN = "^(?=.*[1-9])" + DURATION_PATTERN[1:]
PERCENTILES = ("p50", "p90", "p99")
IFNAMSIZ = 16           # interface names are at most IFNAMSIZ - 1 bytes
SYSTEM_CHANGING = tuple(name for name, spec in SPECS.items() if spec.changes_system)


@dataclass(frozen=True)
class Section:
    """The keys one mapping of a policy file accepts, with their meaning."""

    keys: dict[str, str]
    required: tuple[str, ...] = ()


SECTIONS: dict[str, Section] = {
    "file": Section({
        "policies": "The policies this file defines.",
    }, required=("policies",)),
    "policy": Section({
        "name": "Policy name: lower-case letters, digits and '-', unique across all loaded files.",
        "description": "What the policy is for, in a sentence or two.",
        "mode": "dry-run (default): plan and record only; alert-only: raise an alert instead of acting; "
                "enforce: apply the actions.",
        "selector": "What the policy may touch, and label matchers applied to every signal it reads.",
        "requires": "Devices the policy needs (" + ", ".join(DEVICE_KINDS) + "), or promql for a PromQL source "
                    "(--promql-config): on a node without them it is idle, and validate says so in a note "
                    "instead of warning about its signals.",
        "rules": "The rules of this policy, each a condition with its remediation.",
        "rollout": "Enforce it across a fleet stage by stage, behind a fleet circuit breaker (needs run "
                   "--fleet-etcd; docs/fleet.md).",
        "budget": "Its own fleet budget: at most N nodes, or P % of the live nodes, making its enforce changes "
                  "at once, across the fleet or per job (needs run --fleet-etcd; replaces the node's "
                  "--fleet-max-nodes/--fleet-max-percent for this policy; docs/fleet.md).",
    }, required=("name", "rules")),
    "budget": Section({
        "max_nodes": "At most this many nodes at once (>= 1).",
        "max_percent": "At most this share of the live nodes at once, rounded up, at least 1, e.g. '10%': of "
                       "the fleet's, or with of: job of the nodes that run the job.",
        "per": "policy (default): one pool for the whole fleet; job: one pool per job, the target's job "
               "label or the one job the selector names.",
        "of": "fleet (default): max_percent is a share of the fleet's live nodes; job (with per: job): of the "
              "nodes that run the job, as they register it in the fleet store.",
    }),
    "rollout": Section({
        "stages": "How many nodes may enforce the policy, stage by stage: a count (1), a share of the live "
                  "nodes ('10%', rounded up) or 'all' (last). Default [all]: the breaker alone.",
        "promote_after": "Verified remediations in a stage before it widens to the next (default 3).",
        "success_rate": "The fleet's verify-success rate over the last 'window' outcomes that a stage needs "
                        "to widen, and below which the breaker opens, e.g. '90%' (default).",
        "window": "How many of the fleet's latest verify outcomes the rate counts (default 10).",
    }),
    "selector": Section({
        "match": "Label matchers applied to every signal the policy reads: \"v\" equals, \"~regex\" matches, "
                 "\"!v\" differs.",
        "processes": "Process (comm) names the actions may touch, e.g. pt_data_worker.",
        "pids": "Process ids the actions may touch.",
        "cgroup": "Path of the job's cgroup, e.g. /sys/fs/cgroup/job.slice.",
        "interfaces": "Network interfaces the actions may touch.",
        "netns": "Network namespace of those interfaces: a name in /run/netns (as 'ip netns list' shows it) "
                 "or /proc/PID/ns/net. Default: the controller's own.",
        "link_speeds": "Speed of those interfaces whose reported speed says nothing about their real rate "
                       "(virtual or shaped links), interface -> rate, e.g. {veth0: 200mbit}; others are read "
                       "from the link itself.",
        "ports": "L4 ports or 'lo-hi' port ranges of the job's flows, e.g. [\"29500-29510\", 12345].",
        "jobs": "The jobs the policy reads and acts on, by the name discovery gives them (the launcher's id: "
                "torchrun's run id, slurm-<job id>, ...; 'reflexarc jobs' lists them), as globs, e.g. "
                "[\"llama-*\"]. Series of other jobs are not read; the node's own series are.",
        "pods": "The Kubernetes pods the policy reads and acts on, by pod UID, as globs.",
    }),
    "rule": Section({
        "name": "Rule name: lower-case letters, digits and '-', unique within the policy.",
        "by": "Labels whose values make a target: the rule fires, acts and rolls back per distinct value "
              "set. Empty: one target for the whole policy.",
        "when": "The firing condition: a condition, or {all: [...]} / {any: [...]} of them, nestable.",
        "for": f"How long the condition must hold before the rule fires (default 0), {DURATION_EXAMPLES}.",
        "clear_for": f"How long the condition must be false before the rule clears (default 0), "
                     f"{DURATION_EXAMPLES}.",
        "actions": "Remediation steps, in order. With escalation, the next step runs when verification "
                   "of the previous one fails.",
        "escalate": "On a failed verification, go on to the next action (default true).",
        "verify": "What must hold within a timeout after acting for the remediation to count as working.",
        "rollback": "When to undo the actions' changes: a mapping, or 'never' to keep them. Required when "
                    "an action changes the system. 'alerts' says what becomes of the rule's alerts at stop.",
        "cooldown": f"Quiet time after a remediation ends before the rule may act again (default 0), "
                    f"{DURATION_EXAMPLES}.",
        "max_actions": "At most this many remediations per target within a sliding window.",
    }, required=("name", "when", "actions")),
    "condition": Section({
        "signal": "Name of a catalogued signal.",
        "match": "Label matchers on the signal's own labels: \"v\" equals, \"~regex\" matches, \"!v\" differs.",
        "agg": "Aggregation over the window: " + ", ".join(AGGREGATIONS) + ".",
        "window": f"Look-back window of the aggregation (> 0), {DURATION_EXAMPLES}.",
        "op": "Comparison: " + " ".join(OPERATORS) + ".",
        "threshold": "A number in the signal's unit; for a signal that is a time, a duration with its unit "
                     "(us, ms, s, m, h; e.g. '5ms'), converted to the signal's; or '<factor>x baseline' (e.g. "
                     "'3x baseline') relative to the median of the signal's healthy history.",
        "baseline": f"Healthy history the baseline is the median of (default 10m), {DURATION_EXAMPLES}.",
    }, required=("signal", "agg", "window", "op", "threshold")),
    "change": Section({
        "signal": "Name of a catalogued gauge signal.",
        "match": "Label matchers on the signal's own labels, as in a condition.",
        "up": "The rise to detect: '<factor>x' of the learned reference (e.g. '1.3x'), or an amount in the "
              "signal's unit (for a time signal a duration such as '50ms'). Exactly one of up, down.",
        "down": "The fall to detect: '<factor>x' below 1 (e.g. '0.7x'), or an amount in the signal's unit.",
        "false_alarms": "How often it may fire on a signal that has not shifted, per target: '<n>/<period>' "
                        "with period s, min, h, day or week (default '1/day'). Sets the CUSUM's threshold.",
        "baseline": f"Healthy history the reference is learned from (default 10m), {DURATION_EXAMPLES}.",
    }, required=("signal",)),
    "change_item": Section({
        "change": "A change point: the signal shifted from its learned reference (CUSUM; docs/policies.md).",
    }, required=("change",)),
    "combo": Section({
        "all": "Holds when every item holds.",
        "any": "Holds when at least one item holds.",
    }),
    "action": Section({
        "actuator": "Name of the actuator: " + ", ".join(SPECS) + ".",
        "params": "Parameters of the actuator.",
    }, required=("actuator",)),
    "verify": Section({
        "when": "The condition that must hold after acting: a condition, or {all: [...]} / {any: [...]}.",
        "timeout": f"How long to wait for it (> 0), {DURATION_EXAMPLES}.",
    }, required=("when", "timeout")),
    "rollback": Section({
        "on": "Events that undo the change: " + ", ".join(ROLLBACK_TRIGGERS) + ".",
        "ttl": f"Undo the change this long after applying it (with 'ttl' in 'on'), {DURATION_EXAMPLES}.",
        "on_restart": "What a restarted controller does with a change it finds applied: "
                      "revert (default) or adopt.",
        "never": "true: keep the changes (same as writing 'rollback: never'); no other key but 'alerts' "
                 "may be set.",
        "alerts": "What a stopping controller does with the rule's alerts still firing: resolve (default) or "
                  "keep them firing (Alertmanager then ends them after its resolve_timeout). Alone, for a rule "
                  "whose actions change nothing: rollback: {alerts: keep}.",
    }),
    "max_actions": Section({
        "count": "Most remediations allowed within the window (>= 1).",
        "window": f"Sliding window the count applies to (> 0), {DURATION_EXAMPLES}.",
    }, required=("count", "window")),
}


def _closed(section: str, properties: dict, title: str) -> dict:
    spec = SECTIONS[section]
    assert set(properties) == set(spec.keys), (section, set(properties) ^ set(spec.keys))
    out = {"type": "object", "description": title,
           "properties": {key: {**schema, "description": spec.keys[key]} for key, schema in properties.items()},
           "additionalProperties": False}
    if spec.required:
        out["required"] = list(spec.required)
    return out


def _duration(positive: bool) -> dict:
    number = {"type": "number", "exclusiveMinimum": 0} if positive else {"type": "number", "minimum": 0}
    pattern = POSITIVE_DURATION_PATTERN if positive else DURATION_PATTERN
    return {"anyOf": [number, {"type": "string", "pattern": pattern}]}


def _ports() -> dict:
    return {"type": "array", "items": {"anyOf": [
        {"type": "integer", "minimum": 1, "maximum": MAX_PORT},
        {"type": "string", "pattern": PORT_RANGE_PATTERN},
    ]}}


def _matchers(labels: list[str] | None) -> dict:
    out = {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}}
    if labels is not None:
        out["propertyNames"] = {"enum": labels}
    return out


def _param(param: ParamSpec) -> dict:
    scalar = {"type": ["string", "number"]}
    by_type = {
        "str": scalar,
        "int": {"type": "integer"},
        "float": {"type": "number"},
        "bool": {"type": "boolean"},
        "duration": _duration(positive=True),
        "dscp": {"anyOf": [{"enum": list(DSCP_NAMES)}, {"type": "integer", "minimum": 0, "maximum": MAX_DSCP}]},
        "int_list": {"anyOf": [{"type": "array", "items": {"type": "integer", "minimum": 0,
                                                           "maximum": MAX_CPUS - 1}},
                               {"type": "string", "pattern": CPU_LIST_PATTERN}]},
        "str_list": {"type": "array", "items": scalar},
        "port_range": _ports(),
        "mapping": {"type": "object"},
    }
    if param.choices:
        out = {"enum": list(param.choices)}
    else:
        out = dict(by_type[param.type])
    if param.range is not None:
        out["minimum"], out["maximum"] = param.range
    out["description"] = param_description(param)
    if param.default is not None:
        out["default"] = param.default
    return out


def param_description(param: ParamSpec) -> str:
    """One line about a parameter: its help, type, choices or range, and default."""
    parts = [param.help] if param.help else []
    parts.append(f"type {param.type}")
    if param.choices:
        parts.append("one of " + ", ".join(map(str, param.choices)))
    if param.range is not None:
        parts.append(f"{param.range[0]}..{param.range[1]}")
    if param.example is not None:
        parts.append(f"e.g. {json.dumps(param.example)}")
    if param.from_selector:
        parts.append(f"{'required, here or in' if param.required else 'default:'} the selector's "
                     f"{param.from_selector}")
    else:
        parts.append("required" if param.required else f"default {param.default!r}" if param.default is not None
                     else "optional")
    return "; ".join(parts)


def _params(spec: ActuatorSpec) -> dict:
    out = {"type": "object", "description": f"Parameters of '{spec.name}': {spec.help}",
           "properties": {p.name: _param(p) for p in spec.params}, "additionalProperties": False}
    required = [p.name for p in spec.params if p.required and not p.from_selector]
    if required:
        out["required"] = required
    if spec.one_of:                 # exactly one of each group
        out["allOf"] = [{"anyOf": [{"required": [name]} for name in group],
                         "not": {"anyOf": [{"required": [a, b]} for i, a in enumerate(group) for b in group[i + 1:]]}}
                        for group in spec.one_of]
    return out


def _action() -> dict:
    action = _closed("action", {
        "actuator": {"enum": list(SPECS)},
        "params": {"type": "object"},
    }, "One remediation step.")
    branches = []
    for name, spec in SPECS.items():
        branch = {"if": {"properties": {"actuator": {"const": name}}, "required": ["actuator"]},
                  "then": {"properties": {"params": _params(spec)}}}
        if spec.one_of or any(p.required and not p.from_selector for p in spec.params):
            branch["then"]["required"] = ["params"]
        branches.append(branch)
    action["allOf"] = branches
    return action


def _condition() -> dict:
    condition = _closed("condition", {
        "signal": {"enum": list(CATALOGUE)},
        "match": _matchers(None),
        "agg": {"enum": list(AGGREGATIONS)},
        "window": _duration(positive=True),
        "op": {"enum": list(OPERATORS)},
        "threshold": {"anyOf": [{"type": "number"}, {"type": "string", "pattern": RELATIVE_THRESHOLD_PATTERN},
                                {"type": "string", "pattern": TIME_THRESHOLD_PATTERN}]},
        "baseline": _duration(positive=True),
    }, "agg(signal{match}[window]) op threshold.")
    condition["allOf"] = [
        {"if": {"properties": {"signal": {"const": name}}, "required": ["signal"]},
         "then": {"properties": {"match": {"propertyNames": {"enum": list(spec.labels)}}}}}
        for name, spec in CATALOGUE.items()
    ]
    return condition


def _change() -> dict:
    shift = {"anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "string", "pattern": SHIFT_FACTOR_PATTERN},
                       {"type": "string", "pattern": TIME_THRESHOLD_PATTERN}]}
    change = _closed("change", {
        "signal": {"enum": [name for name, spec in CATALOGUE.items() if spec.kind == "gauge"]},
        "match": _matchers(None),
        "up": shift,
        "down": shift,
        "false_alarms": {"type": "string", "pattern": FALSE_ALARMS_PATTERN},
        "baseline": _duration(positive=True),
    }, "change(signal{match}) up|down shift, false_alarms.")
    change["anyOf"] = [{"required": ["up"]}, {"required": ["down"]}]
    change["not"] = {"required": ["up", "down"]}
    return _closed("change_item", {"change": change}, "A change-point condition.")


def _when() -> dict:
    items = {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/when"}}
    combo = _closed("combo", {"all": items, "any": items}, "A combination of conditions: exactly one of all, any.")
    combo["minProperties"] = 1
    combo["maxProperties"] = 1
    return {"description": "A condition, a change-point condition, or {all: [...]} / {any: [...]} of them.",
            "anyOf": [{"$ref": "#/$defs/condition"}, {"$ref": "#/$defs/change"}, combo]}


ALERTS_ONLY = {"type": "object", "required": ["alerts"], "maxProperties": 1}   # rollback: {alerts: ...}


def _rollback() -> dict:
    triggers = {"type": "array", "minItems": 1, "uniqueItems": True, "items": {"enum": list(ROLLBACK_TRIGGERS)}}
    mapping = _closed("rollback", {
        "on": triggers,
        "ttl": _duration(positive=True),
        "on_restart": {"enum": list(ON_RESTART), "default": "revert"},
        "never": {"type": "boolean"},
        "alerts": {"enum": list(ALERTS_AT_STOP), "default": "resolve"},
    }, "When to undo the actions' changes, and what becomes of the rule's alerts at stop.")
    has_ttl_trigger = {"properties": {"on": {"contains": {"const": "ttl"}}}, "required": ["on"]}
    mapping["allOf"] = [
        {"if": {"properties": {"never": {"const": True}}, "required": ["never"]},
         "then": {"propertyNames": {"enum": ["never", "alerts"]}},
         "else": {"anyOf": [{"required": ["on"]}, ALERTS_ONLY]}},
        {"if": has_ttl_trigger, "then": {"required": ["ttl"]}},
        {"if": {"required": ["ttl"]}, "then": has_ttl_trigger},
    ]
    return {"description": SECTIONS["rule"].keys["rollback"],
            "anyOf": [{"const": "never", "description": "Keep the changes."}, mapping]}


def _rule() -> dict:
    rule = _closed("rule", {
        "name": {"type": "string", "pattern": NAME_PATTERN},
        "by": {"type": "array", "uniqueItems": True,
               "items": {"enum": sorted({label for spec in CATALOGUE.values() for label in spec.labels})}},
        "when": {"$ref": "#/$defs/when"},
        "for": _duration(positive=False),
        "clear_for": _duration(positive=False),
        "actions": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/action"}},
        "escalate": {"type": "boolean", "default": True},
        "verify": _closed("verify", {"when": {"$ref": "#/$defs/when"}, "timeout": _duration(positive=True)},
                          "Verification after acting."),
        "rollback": {"$ref": "#/$defs/rollback"},
        "cooldown": _duration(positive=False),
        "max_actions": _closed("max_actions", {"count": {"type": "integer", "minimum": 1},
                                               "window": _duration(positive=True)}, "A rate limit."),
    }, "A condition and its remediation.")
    rule["allOf"] = [
        {"if": {"properties": {"actions": {"contains": {
            "properties": {"actuator": {"enum": list(SYSTEM_CHANGING)}}, "required": ["actuator"]}}},
            "required": ["actions"]},
         "then": {"required": ["rollback"], "properties": {"rollback": {"not": ALERTS_ONLY}}}},
        {"if": {"properties": {"actions": {"minItems": 2}, "escalate": {"const": True}}, "required": ["actions"]},
         "then": {"required": ["verify"]}},
        {"if": {"properties": {"rollback": {"type": "object", "properties": {
            "on": {"contains": {"const": "verify-failed"}}}, "required": ["on"]}}, "required": ["rollback"]},
         "then": {"required": ["verify"]}},
    ]
    return rule


def build_schema() -> dict:
    """The JSON Schema of a policy file, as a dictionary."""
    all_labels = sorted({label for spec in CATALOGUE.values() for label in spec.labels})
    policy = _closed("policy", {
        "name": {"type": "string", "pattern": NAME_PATTERN},
        "description": {"type": "string"},
        "mode": {"enum": list(MODES), "default": "dry-run"},
        "selector": {"$ref": "#/$defs/selector"},
        "requires": {"type": "array", "items": {"enum": list(REQUIREMENTS)}, "uniqueItems": True},
        "rules": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/rule"}},
        "rollout": _closed("rollout", {
            "stages": {"type": "array", "minItems": 1, "items": {"anyOf": [
                {"type": "integer", "minimum": 1}, {"type": "string", "pattern": PERCENT_PATTERN},
                {"const": "all"}]}},
            "promote_after": {"type": "integer", "minimum": 1, "default": 3},
            "success_rate": {"anyOf": [{"type": "string", "pattern": PERCENT_PATTERN},
                                       {"type": "number", "exclusiveMinimum": 0, "maximum": 100}],
                             "default": "90%"},
            "window": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 10},
        }, SECTIONS["policy"].keys["rollout"]),
        "budget": _closed("budget", {
            "max_nodes": {"type": "integer", "minimum": 1},
            "max_percent": {"anyOf": [{"type": "string", "pattern": PERCENT_PATTERN},
                                      {"type": "number", "exclusiveMinimum": 0, "maximum": 100}]},
            "per": {"enum": list(PER), "default": "policy"},
            "of": {"enum": list(OF), "default": "fleet"},
        }, SECTIONS["policy"].keys["budget"]),
    }, "One policy.")
    selector = _closed("selector", {
        "match": _matchers(all_labels),
        "processes": {"type": "array", "items": {"type": "string"}},
        "pids": {"type": "array", "items": {"type": "integer", "minimum": 1}},
        "cgroup": {"type": "string", "pattern": "^/"},
        "interfaces": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": IFNAMSIZ - 1}},
        "netns": {"type": "string", "pattern": NETNS_PATTERN},
        "link_speeds": {"type": "object", "propertyNames": {"minLength": 1, "maxLength": IFNAMSIZ - 1},
                        "additionalProperties": {"anyOf": [{"type": "number", "exclusiveMinimum": 0},
                                                           {"type": "string", "pattern": RATE_PATTERN}]}},
        "ports": _ports(),
        "jobs": {"type": "array", "items": {"type": "string", "minLength": 1}},
        "pods": {"type": "array", "items": {"type": "string", "minLength": 1}},
    }, SECTIONS["policy"].keys["selector"])
    root = _closed("file", {"policies": {"type": "array", "items": {"$ref": "#/$defs/policy"}}},
                   "A reflexarc policy file.")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "reflexarc policy file",
        **root,
        "$defs": {
            "policy": policy,
            "selector": selector,
            "rule": _rule(),
            "when": _when(),
            "condition": _condition(),
            "change": _change(),
            "action": _action(),
            "rollback": _rollback(),
        },
    }


def render() -> str:
    """The schema as the text committed in ``policies/schema.json``."""
    return json.dumps(build_schema(), indent=2) + "\n"


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
