"""The one YAML reader (``reflexarc.core.yaml_reader``): a duplicate key, deep
nesting, bad indentation, a tab, a byte that is not UTF-8 and a NUL are each one
located error, the same in the four files that read YAML (policies, the PromQL
configuration, policy tests, scenarios); an alias bomb is built once.

No root, no kernel: files in a temporary directory, a second or two.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from reflexarc.controller.policy.loader import validate_paths
from reflexarc.controller.runtime.policy_tests import PolicyTestError, load_test_file
from reflexarc.controller.sources.promql_config import PromqlConfigError, load_config
from reflexarc.core.diagnostics import LocatedError
from reflexarc.core.yaml_reader import LocList, LocMap, YamlReader
from reflexarc.simulations import ScenarioError, load_scenario


def policy_errors(path: Path) -> list[str]:
    return [f"{d.line}:{d.col}: {d.message}" for d in validate_paths([str(path)])[1] if d.is_error]


def promql_errors(path: Path) -> list[str]:
    with pytest.raises(PromqlConfigError) as raised:
        load_config(path)
    return [f"{d.line}:{d.col}: {d.message}" for d in raised.value.diagnostics if d.is_error]


def policy_test_errors(path: Path) -> list[str]:
    with pytest.raises(PolicyTestError) as raised:
        load_test_file(path)
    return [f"{raised.value.line}:{raised.value.col}: {raised.value.message}"]


def scenario_errors(path: Path) -> list[str]:
    with pytest.raises(ScenarioError) as raised:
        load_scenario(path)
    return [f"{raised.value.line}:{raised.value.col}: {raised.value.message}"]


READERS = {"policy": policy_errors, "promql": promql_errors, "policy-test": policy_test_errors,
           "scenario": scenario_errors}

BROKEN = {   # the file, and its one error
    "deep nesting": (b"a: " + b"[" * 100 + b"]" * 100 + b"\n",
                     "1:67: YAML syntax error: nested more than 64 levels deep"),
    "bad indentation": (b"a:\n  b: 1\n c: 2\n",
                        "3:2: YAML syntax error: expected <block end>, but found '<block mapping start>' "
                        "(while parsing a block mapping at 1:1)"),
    "tab": (b"a:\n\t- b\n",
            "2:1: YAML syntax error: found character '\\t' that cannot start any token "
            "(while scanning for the next token)"),
    "non-UTF-8 byte": (b"a: caf\xe9\n", "1:7: not UTF-8 text: byte 0xe9 cannot be decoded"),
    "NUL": (b"a: \x00\n", "1:4: unreadable character #x0000: special characters are not allowed"),
    "two documents": (b"a: 1\n---\nb: 2\n",
                      "2:1: YAML syntax error: but found another document "
                      "(expected a single document in the stream at 1:1)"),
}

DUPLICATE = {   # a file that is right but for a key repeated on line 3
    "policy": ("policies", "policies: []\n# the same again\npolicies: []\n"),
    "promql": ("prometheus", "prometheus: http://p:9090\nqueries: [{signal: gpu_utilization_pct, query: x}]\n"
                             "prometheus: http://q:9090\n"),
    "policy-test": ("policy", "policy: x.yaml\nscenario: numa-remote-worker\npolicy: y.yaml\ncases: [{mode: enforce}]\n"),
    "scenario": ("name", "name: s\nduration: 2m\nname: t\n"),
}


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_file_is_one_located_error_in_every_reader(tmp_path, reader, case):
    body, error = BROKEN[case]
    path = tmp_path / "broken.yaml"
    path.write_bytes(body)
    assert READERS[reader](path) == [error]


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_repeated_key_is_an_error_at_the_repeat_naming_the_first(tmp_path, reader):
    key, body = DUPLICATE[reader]
    path = tmp_path / "twice.yaml"
    path.write_text(body)
    assert READERS[reader](path) == [f"3:1: duplicate key '{key}' (first at line 1)"]


def test_every_repeat_of_a_key_is_reported_and_the_first_one_kept(tmp_path):
    reader = YamlReader("f.yaml")
    root = reader.compose("a: 1\nb: 2\na: 3\nc: {d: 1, d: 2}\na: 4\n", empty="empty")
    doc = reader.data(root)
    assert [str(d) for d in sorted(reader.diagnostics)] == [
        "f.yaml:3:1: error: duplicate key 'a' (first at line 1)",
        "f.yaml:4:11: error: duplicate key 'd' (first at line 4)",
        "f.yaml:5:1: error: duplicate key 'a' (first at line 1)"]
    assert doc == {"a": 1, "b": 2, "c": {"d": 1}}


def test_merge_keys_are_overridden_by_the_mapping_s_own_not_reported_as_repeats():
    reader = YamlReader("f.yaml")
    root = reader.compose("base: &b {x: 1, y: 2}\none: &o {<<: *b, y: 3}\ntwo: *o\n", empty="empty")
    doc = reader.data(root)
    assert reader.diagnostics == []
    assert doc["one"] == {"x": 1, "y": 3} and doc["two"] is doc["one"]
    assert reader.entries(root.value[1][1], "one") == reader.entries(root.value[1][1], "one")   # walked twice
    assert reader.diagnostics == []


def test_an_alias_bomb_is_built_once():
    levels = "abcdefghi"
    text = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{b}: &{b} [{', '.join([f'*{a}'] * 10)}]\n" for a, b in zip(levels, levels[1:]))
    reader = YamlReader("bomb.yaml", raises=LocatedError)
    doc = reader.data(reader.compose(text, empty="empty"))      # 10**9 leaves, were it expanded
    assert isinstance(doc["i"], LocList) and len(doc["i"]) == 10
    assert all(item is doc["h"] for item in doc["i"])
    assert doc["i"][0][0][0][0][0][0][0][0] == ["x"] * 10


def test_an_alias_bomb_in_a_scenario_is_one_error_at_its_key(tmp_path):
    levels = "abcdefghi"
    path = tmp_path / "bomb.yaml"
    path.write_text("bomb:\n  a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"  {b}: &{b} [{', '.join([f'*{a}'] * 10)}]\n" for a, b in zip(levels, levels[1:])))
    assert scenario_errors(path) == ["1:1: unknown key 'bomb' in a scenario file (allowed: name, description, "
                                     "duration, tick, seed, node, policies, plant, signals, faults, expect)"]


def test_an_alias_inside_its_own_anchor_is_one_located_error():
    with pytest.raises(LocatedError) as raised:
        reader = YamlReader("loop.yaml", raises=LocatedError)
        reader.data(reader.compose("a: &a [1, *a]\n", empty="empty"))
    assert str(raised.value) == "loop.yaml:1:4: error: an item of 'a' is an alias to a collection that holds it"


def test_positions_are_one_based_for_keys_values_and_items():
    reader = YamlReader("p.yaml", raises=LocatedError)
    doc = reader.data(reader.compose("top:\n  key: [1, {k: v}]\n", empty="empty"))
    inner = doc["top"]
    assert isinstance(inner, LocMap) and inner.pos == (2, 3)
    assert inner.key_pos("key") == (2, 3) and inner.value_pos("key") == (2, 8)
    assert inner["key"].item_pos(1) == (2, 12)


@pytest.mark.parametrize("text,read,error", [
    ("x: on", lambda r, n: r.boolean(n, "'x'"), None),
    ("x: on", lambda r, n: r.string(n, "'x'"), "1:4: 'x' must be a string, got a boolean (on)"),
    ("x: 0x1F", lambda r, n: r.integer(n, "'x'"), None),
    ("x: " + "9" * 300, lambda r, n: r.integer(n, "'x'"),
     f"1:4: 'x' is out of range (-9223372036854775808..9223372036854775807), got {'9' * 24}... (300 characters)"),
    ("x: 1.0e+999", lambda r, n: r.number(n, "'x'"), "1:4: 'x' must be a finite number, got 1.0e+999"),
    ("x: .nan", lambda r, n: r.number(n, "'x'"), "1:4: 'x' must be a finite number, got .nan"),
    ("x: '12'", lambda r, n: r.number(n, "'x'"), "1:4: 'x' must be a number, got a string '12'"),
    ("x: 5 min", lambda r, n: r.duration(n, "'x'", positive=True), "1:4: 'x': bad duration '5 min'"),
    ("x: 0s", lambda r, n: r.duration(n, "'x'", positive=True), "1:4: 'x' must be greater than 0, got 0s"),
    ("x: !tag v", lambda r, n: r.text(n, "'x'"), "1:4: 'x' must be a string or number, got a value tagged '!tag'"),
])
def test_scalars_are_read_as_the_type_asked_for(text, read, error):
    reader = YamlReader("s.yaml")
    (key, value), = reader.compose(text + "\n", empty="empty").value
    result = read(reader, value)
    found = [f"{d.line}:{d.col}: {d.message}" for d in reader.diagnostics]
    if error is None:
        assert found == [] and result is not None
    else:
        assert result is None and len(found) == 1 and found[0].startswith(error), found


def test_keys_are_read_as_written_not_as_yaml_1_1_booleans():
    reader = YamlReader("k.yaml", raises=LocatedError)
    doc = reader.data(reader.compose("on: [clear]\nyes: 1\n1: one\n", empty="empty"))
    assert list(doc) == ["on", "yes", "1"]


def test_an_empty_file_says_what_was_expected(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing\n")
    reader = YamlReader(str(path))
    assert reader.read(path, 1 << 10, empty="empty file: expected 'a:'") is None
    assert [str(d) for d in reader.diagnostics] == [f"{path}:1:1: error: empty file: expected 'a:'"]
