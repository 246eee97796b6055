"""The generated JSON Schema: committed copy never drifts, it is a valid draft 2020-12
schema, it accepts every valid fixture and rejects every invalid one."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from yaml.nodes import MappingNode, SequenceNode

from reflexarc.actuators.specs import SPECS
from reflexarc.controller.policy import schema as policy_schema
from reflexarc.controller.policy.loader import validate_paths
from reflexarc.controller.signals.catalogue import CATALOGUE

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "policies" / "schema.json"
FIXTURES = ROOT / "tests" / "fixtures" / "policies"
VALID = sorted((FIXTURES / "valid").glob("*.y*ml"))
INVALID = sorted((FIXTURES / "invalid").glob("*.y*ml"))


def _as_json(path: Path):
    """The file's data as yaml-language-server sees it: keys as written (``on`` stays
    a string), scalars typed."""
    constructor = yaml.SafeLoader("")

    def convert(node):
        if isinstance(node, MappingNode):
            constructor.flatten_mapping(node)
            return {key.value: convert(value) for key, value in node.value}
        if isinstance(node, SequenceNode):
            return [convert(item) for item in node.value]
        return constructor.construct_object(node)

    return convert(yaml.compose(path.read_text(), Loader=yaml.SafeLoader))


@pytest.fixture(scope="module")
def validator():
    schema = json.loads(COMMITTED.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_committed_schema_is_what_the_generator_makes_now():
    assert COMMITTED.read_text() == policy_schema.render(), \
        "regenerate: python -m reflexarc.controller.policy.schema > policies/schema.json"


def test_fixtures_exist():
    assert len(VALID) >= 3 and len(INVALID) >= 10


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_valid_fixtures_pass_the_schema_and_the_loader(validator, path):
    errors = [e.message for e in validator.iter_errors(_as_json(path))]
    assert errors == []
    policies, diagnostics = validate_paths([str(path)])
    assert policies and not [d for d in diagnostics if d.severity == "error"]


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_fixtures_fail_the_schema_and_the_loader(validator, path):
    assert list(validator.iter_errors(_as_json(path)))
    policies, diagnostics = validate_paths([str(path)])
    assert policies == [] and [d for d in diagnostics if d.severity == "error"]


def test_schema_names_every_signal_actuator_and_per_signal_labels():
    schema = policy_schema.build_schema()
    condition = schema["$defs"]["condition"]
    assert condition["properties"]["signal"]["enum"] == list(CATALOGUE)
    labels = {branch["if"]["properties"]["signal"]["const"]:
              branch["then"]["properties"]["match"]["propertyNames"]["enum"] for branch in condition["allOf"]}
    assert labels == {name: list(spec.labels) for name, spec in CATALOGUE.items()}
    action = schema["$defs"]["action"]
    assert action["properties"]["actuator"]["enum"] == list(SPECS)
    params = {branch["if"]["properties"]["actuator"]["const"]: branch["then"]["properties"]["params"]
              for branch in action["allOf"]}
    assert {name: sorted(p["properties"]) for name, p in params.items()} == \
        {name: sorted(p.name for p in spec.params) for name, spec in SPECS.items()}
    assert params["dscp"]["required"] == ["dscp"]
    assert params["sysctl"]["properties"]["key"]["enum"] == list(SPECS["sysctl"].param("key").choices)


def _dscp_document(selector: dict, params: dict) -> dict:
    return {"policies": [{"name": "demote", "selector": {"interfaces": ["eth0"], **selector}, "rules": [{
        "name": "bulk", "rollback": {"on": ["clear"]},
        "actions": [{"actuator": "dscp", "params": {"dscp": "CS1", **params}}],
        "when": {"signal": "step_time_ms", "agg": "max", "window": "10s", "op": ">", "threshold": 1}}]}]}


@pytest.mark.parametrize("selector, params, accepted", [
    ({"netns": "r0"}, {"class": "1:30"}, True),
    ({"netns": "/proc/4242/ns/net"}, {"netns": "r1", "addresses": ["10.0.0.0/8"]}, True),
    ({"netns": "a/b"}, {}, False),
    ({"netns": ".."}, {}, False),
    ({"netns": "/proc/self/ns/net"}, {}, False),
    ({}, {"priority": 65584}, False),
])
def test_schema_and_loader_agree_on_selector_netns_and_dscp_class(validator, tmp_path, selector, params, accepted):
    document = _dscp_document(selector, params)
    assert validator.is_valid(document) is accepted
    path = tmp_path / "dscp.yaml"
    path.write_text(yaml.safe_dump(document))
    policies, _ = validate_paths([str(path)])
    assert bool(policies) is accepted


def _subschemas(node, path="#"):
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _subschemas(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _subschemas(value, f"{path}/{i}")


def test_every_property_is_described_and_every_declared_object_closed():
    schema = policy_schema.build_schema()
    described = closed = 0
    for path, sub in _subschemas(schema):
        if sub.get("type") == "object" and "properties" in sub and "/if/" not in path:
            assert sub.get("additionalProperties") is False, path
            closed += 1
            for name, prop in sub["properties"].items():
                assert prop.get("description"), f"{path}/properties/{name}"
                described += 1
    assert closed >= 10 and described >= 60


# Keywords with the same meaning in draft-07 (what yaml-language-server validates with) and 2020-12.
PORTABLE_KEYWORDS = {
    "$schema", "$ref", "$defs", "title", "description", "default", "type", "enum", "const", "properties",
    "additionalProperties", "required", "propertyNames", "minProperties", "maxProperties", "items", "minItems",
    "uniqueItems", "contains", "pattern", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
    "anyOf", "allOf", "not", "if", "then", "else",
}


def _keywords(schema: dict, out: set) -> set:
    for key, value in schema.items():
        out.add(key)
        if key in ("properties", "$defs"):
            for sub in value.values():
                _keywords(sub, out)
        elif key in ("items", "not", "if", "then", "else", "contains", "propertyNames") or (
                key == "additionalProperties" and isinstance(value, dict)):
            _keywords(value, out)
        elif key in ("anyOf", "allOf"):
            for sub in value:
                _keywords(sub, out)
    return out


def test_schema_keeps_to_keywords_draft07_editors_understand():
    schema = policy_schema.build_schema()
    assert _keywords(schema, set()) <= PORTABLE_KEYWORDS
    for path, sub in _subschemas(schema):
        if "$ref" in sub:
            assert set(sub) <= {"$ref", "description"}, path
    draft7 = jsonschema.Draft7Validator(schema)
    for path in VALID:
        assert draft7.is_valid(_as_json(path)), path
    for path in INVALID:
        assert not draft7.is_valid(_as_json(path)), path


@pytest.mark.parametrize("document, accepted", [
    ({"policies": []}, True),
    ({"policies": [{"name": "x", "rules": []}]}, False),
    ({"policies": [{"name": "Bad_Name", "rules": [{}]}]}, False),
    ({"policies": [], "extra": 1}, False),
])
def test_schema_checks_shape(validator, document, accepted):
    assert validator.is_valid(document) is accepted


@pytest.mark.parametrize("duration, accepted", [
    ("30s", True), ("1h30m", True), ("250ms", True), (90, True), ("0s", False), (0, False),
    ("5 min", False), ("-5s", False), ("30s5m", False),
])
def test_schema_and_loader_agree_on_windows(validator, tmp_path, duration, accepted):
    document = {"policies": [{"name": "d", "rules": [{
        "name": "r", "actions": [{"actuator": "log"}],
        "when": {"signal": "step_time_ms", "agg": "max", "window": duration, "op": ">", "threshold": 1}}]}]}
    assert validator.is_valid(document) is accepted
    path = tmp_path / "window.yaml"
    path.write_text(yaml.safe_dump(document))
    policies, _ = validate_paths([str(path)])
    assert bool(policies) is accepted
