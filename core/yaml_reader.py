"""One reader for the YAML files people write (policies, the PromQL source's
configuration, policy tests, scenarios), every problem located at its node.

A file is read by ``input_files.read_text`` (regular files only, a size limit,
UTF-8) and composed by PyYAML's SafeLoader no more than ``MAX_DEPTH``
collections deep (deeper input is refused before the scanner's cost, quadratic
in flow depth, and the composer's recursion add up) into nodes that keep their
line and column. ``YamlReader`` walks them: a mapping's entries (merge keys
resolved; a repeated key is an error at the repeat, naming the first's line;
keys are read as written, so YAML 1.1's ``on`` is no boolean there), lists, and
scalars of the type asked for (an integer of more than ``MAX_INT_TEXT`` digits
is out of range before Python reads it; ``.inf`` and ``.nan`` are no finite
numbers). ``data()`` gives plain values whose mappings and lists (``LocMap``,
``LocList``) remember where each key, value and item was written; an alias is
built once, so an alias bomb costs what its text does. Each problem is a
``Diagnostic``: collected, so all of a file's come out in one pass, or raised
at the first (``raises=``, a ``LocatedError`` class).
Shape is checked in code, not by jsonschema against ``policies/schema.json``: its errors name the enclosing object ("... is not valid under any of the given schemas") and give no did-you-mean.

Example::

    reader = YamlReader("promql.yaml")          # collects every problem
    root = reader.read("promql.yaml", 1 << 20, empty="empty file: expected 'prometheus:' and 'queries:'")
    for key, key_node, value_node in reader.entries(root, "the configuration") or ():
        if key == "interval":
            reader.duration(value_node, "'interval'", positive=True)
    reader.diagnostics   # [Diagnostic('promql.yaml', 2, 11, 'error', "'interval': bad duration '5 min': ...")]

    scenario = YamlReader("s.yaml", raises=LocatedError)     # stops at the first error
    doc = scenario.data(scenario.read("s.yaml", 1 << 20, empty="empty file"))   # a LocMap of plain values
    doc.value_pos("tick")                       # (3, 7): where the value of 'tick' starts

Overhead: PyYAML's pure-Python parser (the depth limit needs it) dominates: about
5-30 ms for a file of 10-100 lines on a 2-core node; files are read at start-up
or on a command, never per event.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .diagnostics import Diagnostic, LocatedError
from .durations import DurationError, parse_duration
from .input_files import InputFileError, read_text

Pos = tuple[int, int]    # 1-based line and column
MAX_DEPTH = 64           # collections inside collections
MAX_INT = (1 << 63) - 1  # integers fit in 64 bits
MAX_INT_TEXT = 200       # characters: longer integers are out of range before Python reads them
TAG = "tag:yaml.org,2002:"
_KINDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "a boolean", "null": "null",
          "timestamp": "a date", "binary": "binary data", "set": "a set", "omap": "an ordered map",
          "pairs": "a list of pairs"}
_BUILDING = object()     # data() of a collection under way: an alias to it refers to itself


def position(node: Node) -> Pos:
    return node.start_mark.line + 1, node.start_mark.column + 1


def tag(node: Node) -> str:
    """Short scalar tag (str, int, float, bool, null, ...), or '' for collections and custom tags."""
    if isinstance(node, ScalarNode) and node.tag.startswith(TAG):
        return node.tag[len(TAG):]
    return ""


def kind(node: Node) -> str:
    """What a node is, for a message: 'a list', "a string 'x'", 'an integer (5)', 'null'."""
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if not node.tag.startswith(TAG):
        return f"a value tagged '{node.tag}' (YAML reads a leading '!' as a tag: quote the text)"
    described = _KINDS.get(node.tag[len(TAG):], node.tag)
    text = node.value if len(node.value) <= 40 else node.value[:37] + "..."
    if described == "null":
        return described
    return f"{described} '{text}'" if described == "a string" else f"{described} ({text})"


def shown(node: ScalarNode) -> str:
    """A scalar as written, shortened for a message."""
    return node.value if len(node.value) <= 40 else f"{node.value[:24]}... ({len(node.value)} characters)"


class Entry(NamedTuple):
    key: str
    key_node: Node
    value_node: Node


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


class _DepthLimitedLoader(yaml.SafeLoader):
    """SafeLoader that refuses deeper nesting than ``MAX_DEPTH``."""

    _depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class YamlReader:
    """Reads one YAML file's nodes; ``diagnostics`` holds every problem, or the
    first error is raised as ``raises`` (a ``LocatedError`` class) when given."""

    def __init__(self, file: str, raises: type[LocatedError] | None = None) -> None:
        self.file = str(file)
        self.diagnostics: list[Diagnostic] = []
        self._raises = raises
        self._constructor = yaml.SafeLoader("")
        self._own_keys: dict[int, set[int]] = {}     # a mapping's own key nodes, before merge keys add more
        self._built: dict[int, object] = {}          # data() of each collection node

    # ---- reporting -------------------------------------------------------------------------

    def at(self, line: int, col: int, severity: str, message: str) -> None:
        if self._raises is not None and severity == "error":
            raise self._raises(self.file, line, col, message)
        self.diagnostics.append(Diagnostic(self.file, line, col, severity, message))

    def error(self, node: Node, message: str) -> None:
        self.at(*position(node), "error", message)

    def warn(self, node: Node, message: str) -> None:
        self.at(*position(node), "warning", message)

    def error_count(self) -> int:
        return sum(d.is_error for d in self.diagnostics)

    # ---- file ------------------------------------------------------------------------------

    def read(self, path: str | Path, max_bytes: int, empty: str) -> Node | None:
        """The file's root node; None (reported) when it cannot be read, is not
        YAML, or is empty (the error ``empty``)."""
        try:
            text = read_text(path, max_bytes)
        except InputFileError as exc:
            self.at(exc.line or 1, exc.col or 1, "error", exc.reason)
            return None
        return self.compose(text, empty)

    def compose(self, text: str, empty: str) -> Node | None:
        """``text``'s one document as nodes; None (reported) when it is not YAML or is empty."""
        try:
            root = yaml.compose(text, Loader=_DepthLimitedLoader)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            context = ""
            if exc.problem and exc.context:
                where = "" if exc.context_mark is None else \
                    f" at {exc.context_mark.line + 1}:{exc.context_mark.column + 1}"
                context = f" ({exc.context}{where})"
            line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
            self.at(line, col, "error", f"YAML syntax error: {exc.problem or exc.context}{context}")
            return None
        except yaml.reader.ReaderError as exc:
            before = text[:exc.position]
            self.at(before.count("\n") + 1, exc.position - before.rfind("\n"), "error",
                    f"unreadable character #x{exc.character:04x}: {exc.reason}")
            return None
        except yaml.YAMLError as exc:
            self.at(1, 1, "error", f"YAML error: {exc}")
            return None
        except RecursionError:
            self.at(1, 1, "error", "nested too deep to read")
            return None
        if root is None:
            self.at(1, 1, "error", empty)
        return root

    # ---- collections -----------------------------------------------------------------------

    def entries(self, node: Node, what: str) -> list[Entry] | None:
        """The entries of a plain mapping, merge keys resolved (the mapping's own
        keys override merged ones); None (reported) for another node. Keys that
        are no names and repeated keys are reported and left out."""
        if not self._plain(node, MappingNode, what, "a mapping"):
            return None
        own = self._own_keys.setdefault(id(node), {id(key_node) for key_node, _ in node.value})
        if not self.flatten(node):
            return None
        found: dict[str, Entry] = {}
        for key_node, value_node in node.value:
            key = self._key(key_node)
            if key is None:
                continue
            previous = found.get(key)
            if previous is not None and id(previous.key_node) in own:
                self.error(key_node, f"duplicate key '{key}' (first at line {position(previous.key_node)[0]})")
                continue
            found[key] = Entry(key, key_node, value_node)
        return list(found.values())

    def sequence(self, node: Node, what: str) -> list[Node] | None:
        """The items of a plain list; None (reported) for another node."""
        if not self._plain(node, SequenceNode, what, "a list"):
            return None
        return list(node.value)

    def data(self, node: Node, what: str = "the document"):
        """``node`` as plain values: mappings as ``LocMap`` (keys as written),
        lists as ``LocList``, scalars as YAML reads them."""
        if isinstance(node, ScalarNode):
            return self.value(node)
        built = self._built.get(id(node))
        if built is _BUILDING:
            self.error(node, f"{what} is an alias to a collection that holds it")
            return None
        if built is not None:
            return built
        self._built[id(node)] = _BUILDING
        if isinstance(node, MappingNode):
            out = LocMap()
            for key, key_node, value_node in self.entries(node, what) or ():
                out[key] = self.data(value_node, f"'{key}'")
                out.key_positions[key] = position(key_node)
                out.value_positions[key] = position(value_node)
        else:
            out = LocList()
            for item in self.sequence(node, what) or ():
                out.append(self.data(item, f"an item of {what}"))
                out.item_positions.append(position(item))
        out.pos = position(node)
        self._built[id(node)] = out
        return out

    def _plain(self, node: Node, cls: type, what: str, expected: str) -> bool:
        """Is ``node`` a collection of type ``cls`` without a YAML tag of its own?"""
        if not isinstance(node, cls):
            self.error(node, f"{what} must be {expected}, got {kind(node)}")
            return False
        if node.tag not in (TAG + "map", TAG + "seq"):
            self.error(node, f"{what} must be a plain {expected[2:]}; YAML tag '{node.tag}' is not allowed here")
            return False
        return True

    def flatten(self, node: MappingNode) -> bool:
        """Resolve YAML merge keys (``<<: *anchor``) in place."""
        try:
            self._constructor.flatten_mapping(node)
            return True
        except yaml.MarkedYAMLError as exc:
            self.error(node, f"bad merge key: {exc.problem}")
            return False
        except RecursionError:
            self.error(node, "merge key refers to the mapping it is in")
            return False

    def _key(self, node: Node) -> str | None:
        if not isinstance(node, ScalarNode) or tag(node) == "null" or not node.value:
            self.error(node, f"keys must be names, got {kind(node)}")
            return None
        return node.value

    # ---- scalars ---------------------------------------------------------------------------

    def value(self, node: Node):
        """``node`` as YAML's SafeLoader reads it; None (reported) where it cannot."""
        try:
            return self._constructor.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError) as exc:
            self._constructor.recursive_objects.clear()
            reason = exc.problem if isinstance(exc, yaml.MarkedYAMLError) else str(exc)
            self.error(node, f"cannot read this value: {reason}")
            return None

    def string(self, node: Node, what: str) -> str | None:
        if tag(node) != "str":
            self.error(node, f"{what} must be a string, got {kind(node)}")
            return None
        return node.value

    def text(self, node: Node, what: str) -> str | None:
        """A string, or a number taken as written (labels, string parameters)."""
        if tag(node) not in ("str", "int", "float"):
            self.error(node, f"{what} must be a string or number, got {kind(node)}")
            return None
        return node.value

    def integer(self, node: Node, what: str, minimum: int | None = None, maximum: int = MAX_INT) -> int | None:
        if tag(node) != "int":
            self.error(node, f"{what} must be an integer, got {kind(node)}")
            return None
        lowest = -MAX_INT - 1 if minimum is None else minimum
        if len(node.value) > MAX_INT_TEXT:
            self.error(node, f"{what} is out of range ({lowest}..{maximum}), got {shown(node)}")
            return None
        value = self.value(node)
        if value is None:
            return None
        if minimum is not None and value < minimum:
            self.error(node, f"{what} must be >= {minimum}, got {shown(node)}")
            return None
        if not lowest <= value <= maximum:
            self.error(node, f"{what} is out of range ({lowest}..{maximum}), got {shown(node)}")
            return None
        return value

    def number(self, node: Node, what: str) -> float | None:
        if tag(node) not in ("int", "float"):
            self.error(node, f"{what} must be a number, got {kind(node)}")
            return None
        out_of_range = f"{what} is out of range: {shown(node)} (numbers stay below 1.8e308)"
        if tag(node) == "int" and len(node.value) > MAX_INT_TEXT:
            self.error(node, out_of_range)
            return None
        value = self.value(node)
        if value is None:
            return None
        try:
            value = float(value)
        except OverflowError:                 # an integer beyond any float
            self.error(node, out_of_range)
            return None
        if not math.isfinite(value):
            self.error(node, f"{what} must be a finite number, got {shown(node)}")
            return None
        return value

    def boolean(self, node: Node, what: str) -> bool | None:
        if tag(node) != "bool":
            self.error(node, f"{what} must be true or false, got {kind(node)}")
            return None
        return self.value(node)

    def duration(self, node: Node, what: str, positive: bool) -> float | None:
        """Seconds of a duration written as text (``'1h30m'``) or a number of seconds."""
        scalar = tag(node)
        if scalar not in ("str", "int", "float"):
            self.error(node, f"{what} must be a duration such as '30s', got {kind(node)}")
            return None
        if scalar == "int" and len(node.value) > MAX_INT_TEXT:
            self.error(node, f"{what}: duration {shown(node)} is out of range")
            return None
        value = node.value if scalar == "str" else self.value(node)
        if value is None:
            return None
        try:
            seconds = parse_duration(value)
        except DurationError as exc:
            self.error(node, f"{what}: {exc}")
            return None
        except OverflowError:                 # an integer beyond any float
            self.error(node, f"{what}: duration {shown(node)} is out of range")
            return None
        if positive and seconds == 0:
            self.error(node, f"{what} must be greater than 0, got {node.value}")
            return None
        return seconds
