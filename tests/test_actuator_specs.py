"""One spec per actuator, read by everything: checked here from the specs alone, so
a new actuator needs no fixture, phrase table, stand-in or factory of its own.

For every actuator in ``SPECS``, an example of every parameter (its
``example``, else its default, first choice or a value of its type) goes into
one generated policy file: the loader must read each in its canonical form and
the committed JSON Schema must accept the file; ``explain`` must print the
spec's phrase; the groups of which exactly one is given and the parameters the
selector fills are refused alike by the loader and the schema; the registry
builds the spec's implementation and the simulation the spec's stand-in.

No root, no kernel: the loader, the schema, the simulated plant.
"""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from reflexarc.actuators.base import Target
from reflexarc.actuators.registry import ActuatorConfig, build_registry
from reflexarc.actuators.specs import SPECS
from reflexarc.controller.policy.explain import explain
from reflexarc.controller.policy.loader import validate_paths
from reflexarc.controller.signals.producers import NodeFacts
from reflexarc.core.params import ParamSpec, convert
from reflexarc.simulations import Plant, load_scenario
from reflexarc.simulations.sim_actuators import SIM_ACTUATORS, SimKnob

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = {"str": "x", "int": 1, "float": 1.5, "bool": True, "duration": "30s", "dscp": "CS1", "int_list": [0],
           "str_list": ["x"], "port_range": ["29500-29510"], "mapping": {"k": "v"}}
SELECTOR = {"interfaces": ["eth0"], "processes": ["pt_data_worker"], "pids": [4100]}


def example(param: ParamSpec):
    if param.example is not None:
        return param.example
    if param.default not in (None, ""):
        return param.default
    if param.choices:
        return param.choices[0]
    if param.range is not None:
        return param.range[0]
    return SAMPLES[param.type]


def example_actions() -> list[tuple[str, dict]]:
    """Every parameter of every actuator at least once: one action per member of
    each ``one_of`` group (the other groups at their first member)."""
    out = []
    for spec in SPECS.values():
        grouped = {name for group in spec.one_of for name in group}
        base = {p.name: example(p) for p in spec.params if p.name not in grouped}
        firsts = {group[0] for group in spec.one_of}
        picks = [firsts - set(group) | {name} for group in spec.one_of for name in group] or [set()]
        out += [(spec.name, {**base, **{n: example(spec.param(n)) for n in sorted(pick)}}) for pick in picks]
    return out


def document(actions: list[tuple[str, dict]], selector: dict | None = None) -> dict:
    """A policy with one rule per action."""
    return {"policies": [{"name": "every-actuator", "selector": SELECTOR if selector is None else selector,
                          "rules": [{"name": f"r{i}", "rollback": "never", "actions": [{"actuator": a, "params": p}],
                                     "when": {"signal": "step_time_ms", "agg": "max", "window": "10s", "op": ">",
                                              "threshold": 1}}
                                    for i, (a, p) in enumerate(actions)]}]}


def read(policies) -> list[tuple[str, dict]]:
    return [(a.actuator, a.params) for rule in policies[0].rules for a in rule.actions]


def loaded(tmp_path, doc: dict):
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return validate_paths([str(path)])


@pytest.fixture(scope="module")
def validator():
    return jsonschema.Draft202012Validator(json.loads((ROOT / "policies" / "schema.json").read_text()))


def test_every_parameter_loads_in_canonical_form_and_passes_the_schema(tmp_path, validator):
    actions = example_actions()
    doc = document(actions)
    assert [e.message for e in validator.iter_errors(doc)] == []
    policies, diagnostics = loaded(tmp_path, doc)
    assert [str(d) for d in diagnostics if d.is_error] == []
    assert read(policies) == [(name, {k: convert(SPECS[name].param(k), v) for k, v in params.items()})
                              for name, params in actions]
    assert {(name, key) for name, params in read(policies) for key in params} == \
        {(spec.name, p.name) for spec in SPECS.values() for p in spec.params}


@pytest.mark.parametrize("name", [s.name for s in SPECS.values() if s.one_of])
def test_exactly_one_of_each_group_for_loader_and_schema(tmp_path, validator, name):
    spec = SPECS[name]
    group = spec.one_of[0]
    base = next(params for actuator, params in example_actions() if actuator == name)
    none = {k: v for k, v in base.items() if k not in group}
    both = {**base, group[0]: example(spec.param(group[0])), group[1]: example(spec.param(group[1]))}
    for params, words in ((none, f"actuator '{name}' needs one of {', '.join(group)}"),
                          (both, f"'{group[1]}' and '{group[0]}' are alternatives for '{name}'")):
        doc = document([(name, params)])
        assert not validator.is_valid(doc), params
        policies, diagnostics = loaded(tmp_path, doc)
        assert policies == [] and any(words in d.message for d in diagnostics), [str(d) for d in diagnostics]


@pytest.mark.parametrize("name, param", [(s.name, p.name) for s in SPECS.values() for p in s.params
                                         if p.required and p.from_selector])
def test_a_parameter_the_selector_fills_is_needed_from_one_of_them(tmp_path, validator, name, param):
    spec = SPECS[name]
    field = spec.param(param).from_selector
    params = next(p for a, p in example_actions() if a == name)
    without = {k: v for k, v in params.items() if k != param}
    policies, _ = loaded(tmp_path, document([(name, without)], {**SELECTOR, field: SELECTOR.get(field, ["x"])}))
    assert policies
    selector = {k: v for k, v in SELECTOR.items() if k != field}
    policies, diagnostics = loaded(tmp_path, document([(name, without)], selector))
    assert policies == [] and [d.message for d in diagnostics if d.is_error] == [
        f"'{name}' needs {param}: set params.{param} or the policy's selector.{field}"]
    assert validator.is_valid(document([(name, without)], selector))    # the schema cannot see selectors


@pytest.mark.parametrize("name, param", [(s.name, p.name) for s in SPECS.values() for p in s.params if p.range])
def test_ranges_are_kept_by_loader_and_schema(tmp_path, validator, name, param):
    spec = SPECS[name]
    params = next(p for a, p in example_actions() if a == name and param in p)
    doc = document([(name, {**params, param: spec.param(param).range[1] + 1})])
    assert not validator.is_valid(doc)
    policies, diagnostics = loaded(tmp_path, doc)
    assert policies == [] and any("is out of range" in d.message for d in diagnostics)


def test_explain_says_every_action_in_its_specs_words(tmp_path):
    assert all(spec.explain is not None for spec in SPECS.values())
    policies, _ = loaded(tmp_path, document(example_actions()))
    text = " ".join(explain(policies, NodeFacts(), receiver=False).split())
    for name, params in read(policies):
        phrase = SPECS[name].explain(SPECS[name].resolve(params, policies[0].selector.to_dict()))
        assert phrase in text, (name, phrase)


def test_the_registry_builds_every_actuator_from_its_spec():
    registry = build_registry(ActuatorConfig())
    assert registry.names() == sorted(SPECS)
    for name, spec in SPECS.items():
        act = registry.get(name)
        assert act.spec is spec and type(act).__name__ == spec.implementation.partition(":")[2]
    registry.close()


def test_the_simulation_stands_in_for_every_actuator_as_its_spec_says():
    plant = Plant(load_scenario("numa-remote-worker"))
    registry = plant.registry()
    for name, spec in SPECS.items():
        act = registry.get(name)
        kind = {"knob": SimKnob, "plant": SIM_ACTUATORS.get(name)}.get(spec.simulated)
        assert type(act) is (kind or type(build_registry(ActuatorConfig()).get(name))), name
    for name, params in example_actions():
        if SPECS[name].simulated != "knob":
            continue
        act = registry.get(name)
        target = Target({"trainer": "4100"}, SELECTOR)
        change = act.plan(target, {k: v for k, v in params.items() if not SPECS[name].param(k).from_selector})
        assert change.before is None and not change.noop
        assert change.summary.endswith(SPECS[name].explain(change.after))
        act.apply(change)
        assert act.read_current(target) == change.after and change in plant.applied
        act.revert(change)
        assert act.read_current(target) is None and change not in plant.applied
