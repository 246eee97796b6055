"""YAML with source positions, for error messages that point into scenario files.

Mappings load as ``LocMap`` and sequences as ``LocList``: plain dicts and lists
that also remember the line and column of themselves, of each key and of each
value, so a checker can say ``file:line:col: error: ...`` about any node.

Example::

    doc = parse_yaml("duration: 10x\\n", "s.yaml")
    doc.value_pos("duration")          # (1, 11)
    raise ScenarioError("s.yaml", *doc.value_pos("duration"), "bad duration '10x'")

Overhead: libyaml's parser (PyYAML's pure-Python one without it) plus two small
dicts per mapping; a scenario file of a hundred lines loads in about 10 ms.
"""
from __future__ import annotations

import yaml

Pos = tuple[int, int]   # 1-based line and column


class ScenarioError(ValueError):
    """A scenario file that cannot be used; ``str()`` is ``file:line:col: error: message``."""

    def __init__(self, file: str, line: int, col: int, message: str) -> None:
        self.file, self.line, self.col, self.message = str(file), line, col, message
        super().__init__(f"{self.file}:{line}:{col}: error: {message}")


def _pos(mark) -> Pos:
    return (mark.line + 1, mark.column + 1)


class LocMap(dict):
    """A mapping that remembers where it, its keys and its values start."""

    pos: Pos = (1, 1)

    def __init__(self) -> None:
        super().__init__()
        self.key_positions: dict = {}
        self.value_positions: dict = {}

    def key_pos(self, key) -> Pos:
        return self.key_positions.get(key, self.pos)

    def value_pos(self, key) -> Pos:
        return self.value_positions.get(key, self.key_pos(key))


class LocList(list):
    """A sequence that remembers where it and each item start."""

    pos: Pos = (1, 1)

    def __init__(self) -> None:
        super().__init__()
        self.item_positions: list[Pos] = []

    def item_pos(self, index: int) -> Pos:
        return self.item_positions[index] if index < len(self.item_positions) else self.pos


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """SafeLoader (libyaml's parser when present) building LocMap/LocList and refusing duplicate keys."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LocMap:
    loader.flatten_mapping(node)
    out = LocMap()
    out.pos = _pos(node.start_mark)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.MarkedYAMLError(problem="a mapping key must be a scalar",
                                       problem_mark=key_node.start_mark) from None
        if key in out:
            line, _ = out.key_pos(key)
            raise yaml.MarkedYAMLError(problem=f"duplicate key '{key}' (first at line {line})",
                                       problem_mark=key_node.start_mark)
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_positions[key] = _pos(key_node.start_mark)
        out.value_positions[key] = _pos(value_node.start_mark)
    return out


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> LocList:
    out = LocList()
    out.pos = _pos(node.start_mark)
    for item in node.value:
        out.append(loader.construct_object(item, deep=True))
        out.item_positions.append(_pos(item.start_mark))
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def parse_yaml(text: str, file: str):
    """Load one YAML document; syntax errors become ``ScenarioError`` with their position."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = _pos(mark) if mark else (1, 1)
        raise ScenarioError(file, line, col, exc.problem or exc.context or "invalid YAML") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(file, 1, 1, f"invalid YAML: {exc}") from None
