"""The PromQL source's configuration file, read with every mistake located.

``reflexarc run|validate --promql-config FILE`` names a YAML file::

    prometheus: http://prometheus.monitoring:9090   # the cluster's Prometheus (http or https)
    interval: 15s                 # between two rounds of queries (default 15s)
    timeout: 5s                   # each request's deadline, connecting to its last byte (default 5s;
                                  # below the interval)
    node: gpu-node-07             # this node's name for $NODE (default: the host name)
    queries:
      - signal: gpu_utilization_pct                            # a catalogued signal
        query: avg by (gpu) (DCGM_FI_DEV_GPU_UTIL{Hostname="$NODE"})
        labels: {gpu: gpu}        # signal label: result label; other result labels are dropped

Each query's signal must be catalogued with a PromQL producer (``signals.py``)
and each mapped label must be one of the signal's; ``node`` is this node's name
unless mapped. ``$NODE`` is the only substitution. A query whose text says its
result is no instant vector (a range selector or subquery ``x[5m]``, a number,
a string, ``scalar(...)``, ``time()``) is an error here; the rest of that check
needs Prometheus (``promql.check_queries``). Every problem is a ``Diagnostic``
(``file:line:col: error: ...``), all of a file's at once (``PromqlConfigError``).

Example::

    config = load_config("promql.yaml")
    config.signals                 # frozenset({"gpu_utilization_pct"})
    config.queries[0].expr         # 'avg by (gpu) (DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-node-07"})'

Overhead: one YAML parse at start; nothing at run time.
"""
from __future__ import annotations

import os
import re
import urllib.parse
from dataclasses import dataclass

from yaml.nodes import MappingNode, Node, ScalarNode

from reflexarc.core.diagnostics import Diagnostic
from reflexarc.core.yaml_reader import YamlReader, kind, position, tag

from ..policy.model import Loc
from ..signals.catalogue import CATALOGUE, PRODUCERS, suggest
from ..signals.producers import PROMQL

MAX_FILE_BYTES = 1 << 20
DEFAULT_INTERVAL = 15.0
DEFAULT_TIMEOUT = 5.0
KEYS = ("prometheus", "interval", "timeout", "node", "queries")
QUERY_KEYS = ("signal", "query", "labels")
LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")     # a host name: nothing to escape in a PromQL string
_SUBSTITUTION = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
_NUMBER = re.compile(r"^[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|0x[0-9a-fA-F]+|inf|nan)$",
                     re.IGNORECASE)
_MODIFIERS = re.compile(r"(?:\s*(?:offset\s+-?[0-9a-z]+|@\s*(?:[0-9.]+|start\(\)|end\(\))))*\s*$", re.IGNORECASE)
_SCALAR_CALLS = ("scalar", "time", "pi", "minute", "hour", "day_of_month", "day_of_week", "day_of_year",
                 "days_in_month", "month", "year")


class PromqlConfigError(ValueError):
    """A configuration that cannot be used; ``diagnostics`` holds every finding."""

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        self.diagnostics = diagnostics
        super().__init__("\n".join(map(str, diagnostics)))


@dataclass(frozen=True)
class Query:
    signal: str
    text: str                    # as written
    expr: str                    # with $NODE substituted
    labels: dict[str, str]       # signal label -> result label
    loc: Loc                     # of the query's text


@dataclass(frozen=True)
class PromqlConfig:
    url: str                     # without a trailing '/'
    interval: float              # seconds
    timeout: float               # seconds
    node: str
    queries: tuple[Query, ...]
    file: str

    @property
    def signals(self) -> frozenset[str]:
        """The signals this configuration has a query for."""
        return frozenset(q.signal for q in self.queries)


def static_type(expr: str) -> str | None:
    """What an expression evaluates to, where its text alone says it is no
    instant vector: ``matrix``, ``scalar`` or ``string``; None otherwise."""
    text = expr.strip()
    while _one_group(text):
        text = text[1:-1].strip()
    if _NUMBER.match(text):
        return "scalar"
    if _string_literal(text):
        return "string"
    if _MODIFIERS.sub("", text, count=1).endswith("]"):
        return "matrix"
    call = re.match(r"^([a-z_]+)\s*\(", text)
    if call and call.group(1) in _SCALAR_CALLS and _one_group(text[call.end() - 1:]):
        return "scalar"
    return None


def _string_literal(text: str) -> bool:
    if len(text) < 2 or text[0] not in "\"'`" or text[-1] != text[0]:
        return False
    body = text[1:-1]
    if text[0] == "`":                         # raw string: no escapes
        return "`" not in body
    return re.search(r"(?<!\\)(?:\\\\)*" + text[0], body) is None     # no unescaped quote inside


def _one_group(text: str) -> bool:
    """``text`` is one parenthesised group, from its first character to its last."""
    if len(text) < 2 or text[0] != "(" or text[-1] != ")":
        return False
    depth, quote, escaped = 0, "", False
    for i, ch in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\" and quote != "`":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0 and i != len(text) - 1:
                return False
    return depth == 0


def load_config(path: str | os.PathLike) -> PromqlConfig:
    """The configuration in ``path``; raises ``PromqlConfigError`` with every problem."""
    reader = _Reader(os.fspath(path))
    config = reader.read_config()
    if config is None or any(d.is_error for d in reader.diagnostics):
        raise PromqlConfigError(sorted(reader.diagnostics))
    return config


class _Reader(YamlReader):
    def read_config(self) -> PromqlConfig | None:
        root = self.read(self.file, MAX_FILE_BYTES, empty="empty file: expected 'prometheus:' and 'queries:'")
        if root is None:
            return None
        fields = self._mapping(root, KEYS, "the PromQL configuration")
        if fields is None:
            return None
        for key in ("prometheus", "queries"):
            if key not in fields:
                self.error(root, f"the PromQL configuration is missing required key '{key}'")
        url = self._url(fields["prometheus"][1]) if "prometheus" in fields else None
        interval = self._duration(fields, "interval", DEFAULT_INTERVAL)
        timeout = self._duration(fields, "timeout", DEFAULT_TIMEOUT)
        if interval is not None and timeout is not None and timeout >= interval:
            self.error(fields["timeout"][1] if "timeout" in fields else root,
                       f"'timeout' ({timeout:g}s) must be shorter than 'interval' ({interval:g}s)")
        node = os.uname().nodename
        if "node" in fields:
            node = self._str(fields["node"][1], "'node'") or node
        if not NODE_NAME.match(node):
            self.error(fields["node"][1] if "node" in fields else root,
                       f"node name '{node}' must be a host name (letters, digits, '.', '_', '-') for $NODE")
        queries = self._queries(fields["queries"][1], node) if "queries" in fields else []
        if url is None or interval is None or timeout is None:
            return None
        return PromqlConfig(url, interval, timeout, node, tuple(queries), self.file)

    # --- node readers -------------------------------------------------------------------
    def _mapping(self, node: Node, keys: tuple[str, ...], what: str) -> dict[str, tuple[Node, Node]] | None:
        entries = self.entries(node, what)
        if entries is None:
            return None
        out: dict[str, tuple[Node, Node]] = {}
        for key, key_node, value_node in entries:
            if key in keys:
                out[key] = (key_node, value_node)
                continue
            hint = suggest(key, keys)
            self.error(key_node, f"unknown key '{key}' in {what}"
                                 + (f"; did you mean '{hint}'?" if hint else f" (known: {', '.join(keys)})"))
        return out

    def _str(self, node: Node, what: str) -> str | None:
        if tag(node) != "str" or not node.value.strip():
            self.error(node, f"{what} must be a non-empty string, got {kind(node)}")
            return None
        return node.value

    def _url(self, node: Node) -> str | None:
        text = self._str(node, "'prometheus'")
        if text is None:
            return None
        parts = urllib.parse.urlsplit(text.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
            self.error(node, f"'prometheus' must be the http(s) URL of a Prometheus server, e.g. "
                             f"http://prometheus:9090, got '{text}'")
            return None
        return text.strip().rstrip("/")

    def _duration(self, fields: dict, key: str, default: float) -> float | None:
        if key not in fields:
            return default
        return self.duration(fields[key][1], f"'{key}'", positive=True)

    def _queries(self, node: Node, host: str) -> list[Query]:
        items = self.sequence(node, "'queries'")
        if items is not None and not items:
            self.error(node, "'queries' is empty: give at least one {signal, query}")
        out = []
        for item in items or ():
            query = self._query(item, host)
            if query is not None:
                out.append(query)
        return out

    def _query(self, node: Node, host: str) -> Query | None:
        fields = self._mapping(node, QUERY_KEYS, "a query")
        if fields is None:
            return None
        for key in ("signal", "query"):
            if key not in fields:
                self.error(node, f"a query is missing required key '{key}'")
        signal = self._signal(fields["signal"][1]) if "signal" in fields else None
        text = self._str(fields["query"][1], "'query'") if "query" in fields else None
        if text is not None:
            self._check_text(fields["query"][1], text)
        labels = self._labels(fields["labels"][1], signal) if "labels" in fields else {}
        if signal is None or text is None or labels is None:
            return None
        return Query(signal, text, text.replace("$NODE", host), labels, Loc(self.file, *position(fields["query"][1])))

    def _signal(self, node: Node) -> str | None:
        name = self._str(node, "'signal'")
        if name is None:
            return None
        if name not in CATALOGUE:
            hint = suggest(name, CATALOGUE)
            self.error(node, f"unknown signal '{name}'" + (f"; did you mean '{hint}'?" if hint else ""))
            return None
        if not any(p.kind == PROMQL for p in PRODUCERS[name]):
            fed = sorted(n for n, producers in PRODUCERS.items() if any(p.kind == PROMQL for p in producers))
            self.error(node, f"signal '{name}' is not fed by PromQL (its producers: "
                             f"{', '.join(map(str, PRODUCERS[name]))}); PromQL feeds {', '.join(fed)}")
            return None
        return name

    def _check_text(self, node: Node, text: str) -> None:
        for match in _SUBSTITUTION.finditer(text):
            if match.group(1) != "NODE":
                self.error(node, f"unknown substitution '${match.group(1)}' in the query: only $NODE "
                                 "(this node's name) is replaced")
        kind = static_type(text)
        if kind is not None:
            self.error(node, f"the query's result is a {kind}, not an instant vector: each sample of a vector "
                             "becomes a signal sample" + ("; drop the range [..] or wrap it in a function such "
                                                          "as avg_over_time(...)" if kind == "matrix" else ""))

    def _labels(self, node: Node, signal: str | None) -> dict[str, str] | None:
        if not isinstance(node, MappingNode):
            self.error(node, f"'labels' must be a mapping of signal label to result label, got {kind(node)}")
            return None
        entries = self.entries(node, "'labels'")
        known = CATALOGUE[signal].labels if signal else None
        out: dict[str, str] = {}
        ok = entries is not None
        for label, key_node, value_node in entries or ():
            if known is not None and label not in known:
                hint = suggest(label, known)
                self.error(key_node, f"signal '{signal}' has no label '{label}'"
                                     + (f"; did you mean '{hint}'?" if hint else f" (its labels: {', '.join(known)})"))
                ok = False
                continue
            source = value_node.value if isinstance(value_node, ScalarNode) else None
            if source is None or not LABEL_NAME.match(source):
                self.error(value_node, f"the result label for '{label}' must be a Prometheus label name "
                                       f"({LABEL_NAME.pattern}), got {kind(value_node)}")
                ok = False
                continue
            out[label] = source
        return out if ok else None

