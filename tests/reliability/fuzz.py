"""Fuzzed policy files against the loader: it must answer every one with
policies or its located error type (``PolicyError``, each diagnostic
``file:line:col``), never with another exception.

Two sources of files, both driven by hypothesis (``generated`` and ``mutated``
halves of the cases):

- ``policy_files()``: documents built from the policy language's own vocabulary
  (``schema.SECTIONS`` keys, the signal catalogue and its labels, aggregations,
  operators, modes, rollback triggers, every actuator's parameters by type, DSCP
  names, device kinds), each value sometimes replaced by a wild one (huge,
  negative, NaN or infinite numbers, unicode, wrong types, tags), a key
  sometimes misplaced, rendered as block or flow YAML, then sometimes cut or
  spliced as text;
- ``mutations()``: the shipped ``policies/*.yaml`` changed as data (a key
  deleted or renamed, a value retyped, a number flipped to huge, negative, NaN,
  inf, a string given unicode, a list repeated hundreds of times) or as text
  (a line deleted or duplicated, so keys repeat; truncated; a number token
  replaced; unicode, NUL, BOM, a tab, invalid UTF-8 inserted; an alias bomb, a
  merge key, a tag, deep nesting spliced in).

A traceback is an exception other than ``PolicyError`` out of
``load_policies``, or a diagnostic saying the loader caught one (``internal
error while checking``), or a diagnostic that is not located in the file, or
the loader's process dying or not answering within ``HANG`` seconds. The
loader runs in a process of its own; for each file: the time
``load_policies`` took and the peak RSS while it ran (``VmHWM`` after
resetting it through ``/proc/self/clear_refs``), and by how much that peak
exceeds the RSS before the file.

Example::

    figures = run_fuzz(300, seed=1, tmp=Path("/tmp/f"))
    figures["tracebacks"]            # 0
    figures["worst_cpu_s"], figures["worst_peak_rss_mib"]

Overhead: hypothesis' generation plus PyYAML's parse: ~5-30 ms a case on a
2-core node; files up to the loader's 1 MiB limit.
"""
from __future__ import annotations

import logging
import re
import time
import traceback
from pathlib import Path

import yaml
from hypothesis import HealthCheck, Phase, given, seed as hseed, settings, strategies as st

from reflexarc.actuators.specs import SPECS
from reflexarc.controller.policy.diagnostics import PolicyError
from reflexarc.controller.policy.loader import load_policies
from reflexarc.controller.policy.model import AGGREGATIONS, MODES, ON_RESTART, OPERATORS, ROLLBACK_TRIGGERS
from reflexarc.controller.policy.schema import SECTIONS
from reflexarc.controller.signals.producers import REQUIREMENTS
from reflexarc.controller.signals.catalogue import CATALOGUE
from reflexarc.core.dscp import DSCP_NAMES

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "policies").glob("*.yaml"))
LABELS = sorted({label for spec in CATALOGUE.values() for label in spec.labels})
ALL_KEYS = sorted({key for section in SECTIONS.values() for key in section.keys})
KEPT = 20                      # tracebacks kept with their input
CHUNK = 1000                   # examples per hypothesis run
HANG = 120.0                   # seconds: a file the loader has not answered by then hangs it

# --- wild values ----------------------------------------------------------------------------
HUGE_NUMBERS = ("1" + "0" * 400, "-1" + "0" * 400, "1e400", "-1e400", "1e-400", ".nan", ".NaN", ".inf", "-.inf",
                "9223372036854775808", "-9223372036854775809", "0x7fffffffffffffff", "0o777", "1_000", "-0",
                "-0.0", "4.9e-324", "1.7976931348623157e308", "nan", "inf", "NaN", "Infinity")
UNICODE = ("é", "ß", "İ", "ﬁ", "\u200b", "\u202e", "\ufeff", "\U0001f525", "日本", "\u0301", "\u00a0", "ǅ",
           "\u2028", "\x85", "\ud7ff", "\uffff")
DURATIONS = ("30s", "1h", "10m", "500ms", "2d", "0", "0s", "-5m", "1e400s", "nans", "inf", "1.5h", "3x", "", "1w",
             "99999999999999999999h", "1m30s", "PT5M")
TAGS = ("!!binary aGVsbG8=", "!!set {a, b}", "!!omap [a: 1]", "!!timestamp 2001-12-14", "!custom x",
        "!!python/object:os.system x", "!!str 5", "!!int 5", "!!float 1", "!!null ''", "!!bool yes", "!!pairs [a: 1]")
NUMBER_TOKEN = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])")


def scalars() -> st.SearchStrategy:
    return st.one_of(
        st.integers(), st.integers(min_value=-(10 ** 30), max_value=10 ** 30),
        st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
        st.text(max_size=30), st.sampled_from(UNICODE), st.sampled_from(DURATIONS),
        st.sampled_from(HUGE_NUMBERS).map(Raw), st.sampled_from(TAGS).map(Raw),
        st.sampled_from(ALL_KEYS + LABELS + list(CATALOGUE) + list(SPECS)),
    )


def wild() -> st.SearchStrategy:
    return st.recursive(scalars(), lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.text(max_size=10), st.sampled_from(ALL_KEYS),
                                                               st.integers()), inner, max_size=4)), max_leaves=8)


class Raw(str):
    """A scalar written into the YAML as it is (a tag, ``.nan``, a 400-digit number)."""


def wildness() -> st.SearchStrategy:
    """How wild one file is: the chance that a value is replaced by a wild one,
    a required key left out or a stray key added (one draw per file)."""
    return st.shared(st.sampled_from((0.0, 0.0, 0.01, 0.05, 0.2, 0.5)), key="wildness")


@st.composite
def maybe(draw, strategy: st.SearchStrategy):
    """``strategy``, now and then replaced by a wild value."""
    return draw(wild()) if draw(st.floats(0, 1)) < draw(wildness()) else draw(strategy)


def _valid(strategy: st.SearchStrategy, good: st.SearchStrategy) -> st.SearchStrategy:
    """``good`` in a file that is not wild, else ``strategy`` (good and bad values)."""
    return wildness().flatmap(lambda rate: good if rate == 0.0 else strategy)


@st.composite
def mapping(draw, section: str, values: dict) -> dict:
    """A mapping of ``section``: required keys present unless the file is wild,
    optional keys half the time, now and then a key from elsewhere in the
    language or a wild one."""
    spec = SECTIONS[section]
    rate = draw(wildness())
    out = {}
    for key, strategy in values.items():
        required = key in spec.required
        if draw(st.floats(0, 1)) < (1.0 - rate / 2 if required else 0.5):
            out[key] = draw(maybe(strategy))
    if draw(st.floats(0, 1)) < rate:
        out[draw(st.one_of(st.sampled_from(ALL_KEYS), st.text(max_size=12)))] = draw(wild())
    return out


def durations() -> st.SearchStrategy:
    return _valid(st.one_of(st.sampled_from(DURATIONS), st.integers(-10, 10 ** 6), st.floats(allow_nan=True)),
                  st.one_of(st.sampled_from(("30s", "1h", "10m", "500ms", "2d", "1.5h")), st.integers(1, 10 ** 6)))


def matchers(labels) -> st.SearchStrategy:
    value = st.one_of(st.text(max_size=12), st.sampled_from(("~.*", "~(", "!x", "~[a-", "~a{99999}", "0.99")),
                      st.integers(), st.booleans())
    return st.dictionaries(st.sampled_from(tuple(labels) or tuple(LABELS)), value, max_size=3)


@st.composite
def condition(draw) -> dict:
    signal = draw(st.one_of(st.sampled_from(sorted(CATALOGUE)), st.text(max_size=20)))
    labels = CATALOGUE[signal].labels if signal in CATALOGUE else LABELS
    return draw(mapping("condition", {
        "signal": st.just(signal), "agg": st.sampled_from(AGGREGATIONS), "window": durations(),
        "op": st.sampled_from(OPERATORS),
        "threshold": st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(),
                               st.sampled_from(("1.3x baseline", "0x baseline", "1e400x baseline", "x baseline",
                                                "3 x baseline"))),
        "match": matchers(labels), "baseline": durations()}))


def when() -> st.SearchStrategy:
    return st.recursive(condition(), lambda inner: st.one_of(
        st.fixed_dictionaries({"all": st.lists(inner, max_size=3)}),
        st.fixed_dictionaries({"any": st.lists(inner, max_size=3)}),
        st.fixed_dictionaries({"all": st.lists(inner, max_size=2), "any": st.lists(inner, max_size=2)}),
        st.lists(inner, max_size=2)), max_leaves=6)


def param_value(kind: str, choices) -> st.SearchStrategy:
    if choices:
        return st.one_of(st.sampled_from(choices), st.text(max_size=8))
    return {
        "str": st.one_of(st.text(max_size=20), st.integers()),
        "int": st.one_of(st.integers(-5, 2000), st.integers()),
        "float": st.floats(allow_nan=True, allow_infinity=True),
        "bool": st.one_of(st.booleans(), st.sampled_from(("yes", "no", "on", "true"))),
        "duration": durations(),
        "dscp": st.one_of(st.sampled_from(DSCP_NAMES), st.integers(-2, 70), st.sampled_from(("af41", "EF ", "cs9"))),
        "int_list": st.lists(st.one_of(st.integers(-2, 9000), st.integers()), max_size=5),
        "str_list": st.lists(st.one_of(st.text(max_size=16), st.sampled_from(("eth0", "lo", "a/b", "x" * 16,
                                                                              "10.0.0.0/8", "fd00::/64", "::1/200")),
                                       st.integers()), max_size=4),
        "port_range": st.lists(st.one_of(st.integers(-1, 70000), st.sampled_from(("29500-29510", "443", "5-1",
                                                                                  "0-65536", "a-b", "1-"))),
                               max_size=4),
        "mapping": st.dictionaries(st.text(max_size=8), wild(), max_size=4),
    }.get(kind, wild())


@st.composite
def action(draw) -> dict:
    name = draw(st.one_of(st.sampled_from(sorted(SPECS)), st.text(max_size=12)))
    spec = SPECS.get(name)
    params = {}
    if spec is not None:
        params = draw(st.fixed_dictionaries({}, optional={
            p.name: maybe(param_value(p.type, p.choices)) for p in spec.params}))
    out = draw(mapping("action", {"actuator": st.just(name), "params": st.just(params)}))
    return out


def rollback() -> st.SearchStrategy:
    return st.one_of(st.just("never"), mapping("rollback", {
        "on": st.lists(st.sampled_from(ROLLBACK_TRIGGERS + ("bogus",)), max_size=4),
        "ttl": durations(), "on_restart": st.sampled_from(ON_RESTART), "never": st.booleans()}))


def names() -> st.SearchStrategy:
    return st.one_of(st.from_regex(r"[a-z0-9][a-z0-9-]{0,20}", fullmatch=True), st.text(max_size=12))


@st.composite
def rule(draw) -> dict:
    return draw(mapping("rule", {
        "name": names(), "by": st.lists(st.sampled_from(LABELS), max_size=3), "when": when(),
        "for": durations(), "clear_for": durations(), "cooldown": durations(),
        "actions": st.lists(action(), max_size=3), "escalate": st.booleans(),
        "verify": mapping("verify", {"when": when(), "timeout": durations()}),
        "rollback": rollback(),
        "max_actions": mapping("max_actions", {"count": st.integers(-3, 10 ** 20), "window": durations()})}))


@st.composite
def selector(draw) -> dict:
    return draw(mapping("selector", {
        "match": matchers(LABELS), "processes": st.lists(st.text(max_size=20), max_size=3),
        "pids": st.lists(st.integers(-5, 1 << 23), max_size=3), "cgroup": st.text(max_size=30),
        "interfaces": param_value("str_list", ()), "netns": st.one_of(st.text(max_size=12), st.integers()),
        "link_speeds": st.dictionaries(st.text(max_size=16), st.one_of(st.sampled_from(
            ("200mbit", "10gbit", "0", "-1mbit", "1e400bit", "fast")), st.integers(), st.floats()), max_size=2),
        "ports": param_value("port_range", ())}))


@st.composite
def policy(draw) -> dict:
    return draw(mapping("policy", {
        "name": names(), "description": st.text(max_size=40), "mode": st.sampled_from(MODES + ("enforced",)),
        "selector": selector(), "requires": st.lists(st.sampled_from(tuple(REQUIREMENTS) + ("tpu",)), max_size=2),
        "rules": st.lists(rule(), max_size=3)}))


def render(doc, flow: bool, unicode: bool) -> str:
    """``doc`` as YAML, with each ``Raw`` scalar written as it is."""
    raws: list[str] = []

    class Dumper(yaml.SafeDumper):
        pass

    def raw(dumper, value):
        raws.append(str(value))
        return dumper.represent_scalar("tag:yaml.org,2002:str", f"RAWQ{len(raws) - 1}QWAR")

    Dumper.add_representer(Raw, raw)
    text = yaml.dump(doc, Dumper=Dumper, default_flow_style=flow, allow_unicode=unicode, sort_keys=False, width=200)
    return re.sub(r"RAWQ(\d+)QWAR", lambda m: raws[int(m.group(1))], text)


# --- text mutations ---------------------------------------------------------------------------
SPLICES = (
    "x: &a [1, 2]\n", "<<: *a\n", "<<: {name: merged}\n", "*undefined\n", "? [complex, key]\n: v\n",
    "- " * 70 + "deep\n", "[" * 200 + "]" * 200 + "\n", "{" * 100 + "\n", "%YAML 1.1\n---\n", "---\n...\n---\n",
    "\t- tabbed\n", "'unterminated\n", "\"\\x\"\n", "key: !!python/object/apply:os.system [ls]\n",
    "a: &b [*b]\n", "name: " + "n" * 70000 + "\n",
)


def alias_bomb(levels: int, width: int) -> str:
    lines = ["bomb0: &b0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"bomb{i}: &b{i} [" + ", ".join([f"*b{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


@st.composite
def text_mutation(draw, text: str) -> str | bytes:
    op = draw(st.sampled_from(("truncate", "delete-line", "duplicate-line", "insert-unicode", "replace-number",
                               "splice", "invalid-utf8", "bomb", "indent", "nul", "bom")))
    lines = text.splitlines(keepends=True) or [""]
    at = draw(st.integers(0, max(len(text) - 1, 0)))
    line = draw(st.integers(0, len(lines) - 1))
    if op == "truncate":
        return text[:at]
    if op == "delete-line":
        return "".join(lines[:line] + lines[line + 1:])
    if op == "duplicate-line":
        return "".join(lines[:line + 1] + lines[line:])
    if op == "insert-unicode":
        return text[:at] + draw(st.one_of(st.sampled_from(UNICODE), st.characters(codec="utf-8"))) + text[at:]
    if op == "replace-number":
        numbers = list(NUMBER_TOKEN.finditer(text))
        if not numbers:
            return text + draw(st.sampled_from(HUGE_NUMBERS))
        m = numbers[draw(st.integers(0, len(numbers) - 1))]
        return text[:m.start()] + draw(st.sampled_from(HUGE_NUMBERS + ("-1", "0", "-0.5"))) + text[m.end():]
    if op == "splice":
        return "".join(lines[:line]) + draw(st.sampled_from(SPLICES)) + "".join(lines[line:])
    if op == "invalid-utf8":
        raw = text.encode()
        return raw[:at] + draw(st.sampled_from((b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80", b"\xf8\x88\x80"))) \
            + raw[at:]
    if op == "bomb":
        return alias_bomb(draw(st.integers(2, 9)), draw(st.integers(2, 10))) + text
    if op == "indent":
        return "".join(lines[:line]) + draw(st.sampled_from((" ", "\t", "   "))) + "".join(lines[line:])
    if op == "nul":
        return text[:at] + "\x00" + text[at:]
    return "\ufeff" + text if draw(st.booleans()) else text[:at] + "\ufeff" + text[at:]


@st.composite
def policy_files(draw) -> str | bytes:
    doc = draw(st.one_of(
        st.fixed_dictionaries({"policies": st.lists(policy(), max_size=3)}),
        mapping("file", {"policies": st.lists(policy(), max_size=2)}),
        wild()))
    text = render(doc, flow=draw(st.booleans()), unicode=draw(st.booleans()))
    for _ in range(draw(st.integers(0, 2))):
        text = draw(text_mutation(text))
        if isinstance(text, bytes):
            break
    return text


# --- data mutations of the shipped policies ----------------------------------------------------
def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _get(node, path):
    for p in path:
        node = node[p]
    return node


@st.composite
def data_mutation(draw, doc):
    paths = [p for p in _paths(doc) if p]
    if not paths:
        return doc
    path = draw(st.sampled_from(paths))
    parent, key = _get(doc, path[:-1]), path[-1]
    value = parent[key]
    op = draw(st.sampled_from(("delete", "rename", "retype", "number", "unicode", "repeat", "wild")))
    if op == "delete":
        del parent[key]
    elif op == "rename" and isinstance(parent, dict):
        new = draw(st.one_of(st.sampled_from(ALL_KEYS), st.just(str(key)[:-1] or "x"), st.just(str(key).upper()),
                             st.just(f"{key}{draw(st.sampled_from(UNICODE))}")))
        parent[new] = parent.pop(key)
    elif op == "retype":
        parent[key] = draw(st.sampled_from(([value], {"v": value}, str(value), None, 0, True, [], {})))
    elif op == "number":
        parent[key] = Raw(draw(st.sampled_from(HUGE_NUMBERS + ("-1", "-1000000", "0"))))
    elif op == "unicode":
        parent[key] = f"{value}{draw(st.sampled_from(UNICODE))}" if isinstance(value, str) else \
            draw(st.sampled_from(UNICODE))
    elif op == "repeat" and isinstance(value, list) and value:
        parent[key] = value * draw(st.integers(2, 400))
    else:
        parent[key] = draw(wild())
    return doc


@st.composite
def mutations(draw) -> str | bytes:
    path = draw(st.sampled_from(SHIPPED))
    text = path.read_text()
    if draw(st.booleans()):
        doc = yaml.safe_load(text)
        for _ in range(draw(st.integers(1, 3))):
            doc = draw(data_mutation(doc))
        text = render(doc, flow=draw(st.booleans()), unicode=draw(st.booleans()))
    for _ in range(draw(st.integers(0 if text != path.read_text() else 1, 3))):
        text = draw(text_mutation(text))
        if isinstance(text, bytes):
            break
    return text


# --- measuring one file ---------------------------------------------------------------------------
def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _load_one(path: str) -> dict:
    """Loads one file as ``run``/``validate`` do; what came of it, how long it took
    and the peak RSS while it ran (VmHWM, reset first)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                          # resets VmHWM to the current RSS
    before = _status_kib("VmRSS")
    began, cpu = time.perf_counter(), time.process_time()
    problem, outcome = None, "loaded"
    try:
        policies = load_policies([path])
    except PolicyError as exc:
        outcome = "located-error"
        bad = [d for d in exc.diagnostics if d.file != path or d.line < 1 or d.col < 1]
        hidden = [d for d in exc.diagnostics if "internal error while checking" in d.message]
        if not exc.diagnostics or bad or hidden:
            problem = f"diagnostics not located or hiding a crash: {[str(d) for d in (bad + hidden)][:3]}"
    except Exception as exc:  # noqa: BLE001 - what is counted
        outcome = "traceback"
        problem = "".join(traceback.format_exception(exc))[-3000:]
    else:
        if not all(p.name and p.rules for p in policies):
            problem = "a policy loaded without a name or rules"
    return {"outcome": outcome, "problem": problem, "seconds": time.perf_counter() - began,
            "cpu_s": time.process_time() - cpu, "peak_kib": _status_kib("VmHWM"), "before_kib": before}


def _worker(conn) -> None:
    logging.getLogger("reflexarc").setLevel(logging.CRITICAL)
    conn.send({"rss_kib": _status_kib("VmRSS")})
    while True:
        path = conn.recv()
        if path is None:
            conn.send({"rss_kib": _status_kib("VmRSS")})
            return
        conn.send(_load_one(path))


class Loader:
    """The loader in a process of its own, so a file's peak RSS is the loader's
    (not the generator's) and a crash or a hang of the loader is seen, not shared."""

    def __init__(self) -> None:
        self.started_rss: list[int] = []
        self.ended_rss: list[int] = []
        self._start()

    def _start(self) -> None:
        import multiprocessing
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        self.started_rss.append(self.conn.recv()["rss_kib"])

    def load(self, path: str) -> dict:
        self.conn.send(path)
        if self.conn.poll(HANG):
            try:
                return self.conn.recv()
            except EOFError:
                pass
            died = f"the loader's process died (exit {self.proc.exitcode})"
        else:
            died = f"no answer within {HANG:g}s (a hang)"
        self.proc.kill()
        self.proc.join()
        self._start()
        return {"outcome": "traceback", "problem": died, "seconds": HANG, "cpu_s": 0.0, "peak_kib": 0,
                "before_kib": 0}

    def close(self) -> None:
        self.conn.send(None)
        if self.conn.poll(30):
            self.ended_rss.append(self.conn.recv()["rss_kib"])
        self.proc.join(30)


class Tally:
    def __init__(self, tmp: Path, loader: Loader) -> None:
        self.tmp = tmp
        self.loader = loader
        self.cases = {"generated": 0, "mutated": 0}
        self.outcomes = {"loaded": 0, "located-error": 0, "traceback": 0}
        self.tracebacks: list[dict] = []
        self.worst_time = (0.0, None)
        self.worst_cpu = (0.0, None)
        self.worst_rss = (0, None)
        self.worst_growth = (0, None)
        self.biggest = 0
        self.path = tmp / "case.yaml"

    def _keep(self, name: str, data: bytes) -> str:
        kept = self.tmp / name
        kept.write_bytes(data)
        return str(kept)

    def check(self, source: str, content: str | bytes) -> None:
        n = sum(self.cases.values())
        self.cases[source] += 1
        data = content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass")
        self.path.write_bytes(data)
        self.biggest = max(self.biggest, len(data))
        res = self.loader.load(str(self.path))
        self.outcomes[res["outcome"]] += 1
        case = {"n": n, "source": source, "bytes": len(data)}
        if res["seconds"] > self.worst_time[0]:
            self.worst_time = (res["seconds"], {**case, "input": self._keep("worst-time.yaml", data)})
        if res["cpu_s"] > self.worst_cpu[0]:
            self.worst_cpu = (res["cpu_s"], {**case, "input": self._keep("worst-cpu.yaml", data)})
        if res["peak_kib"] > self.worst_rss[0]:
            self.worst_rss = (res["peak_kib"], {**case, "input": self._keep("worst-rss.yaml", data)})
        growth = res["peak_kib"] - res["before_kib"]
        if growth > self.worst_growth[0]:
            self.worst_growth = (growth, {**case, "input": self._keep("worst-growth.yaml", data)})
        if res["problem"]:
            kept = self._keep(f"traceback-{len(self.tracebacks)}.yaml", data) if len(self.tracebacks) < KEPT else None
            self.tracebacks.append({**case, "problem": res["problem"], "input": kept,
                                    "head": data[:300].decode("utf-8", "replace")})

    def figures(self) -> dict:
        return {
            "cases": sum(self.cases.values()), "by_source": dict(self.cases), "outcomes": dict(self.outcomes),
            "tracebacks": len(self.tracebacks), "traceback_details": self.tracebacks[:KEPT],
            "worst_time_s": round(self.worst_time[0], 4), "worst_time_case": self.worst_time[1],
            "worst_cpu_s": round(self.worst_cpu[0], 4), "worst_cpu_case": self.worst_cpu[1],
            "worst_peak_rss_mib": round(self.worst_rss[0] / 1024, 1), "worst_peak_rss_case": self.worst_rss[1],
            "worst_rss_growth_mib": round(self.worst_growth[0] / 1024, 1),
            "worst_rss_growth_case": self.worst_growth[1],
            "loader_rss_mib": {"at_start": [round(k / 1024, 1) for k in self.loader.started_rss],
                               "at_end": [round(k / 1024, 1) for k in self.loader.ended_rss]},
            "largest_file_bytes": self.biggest,
        }


def run_fuzz(cases: int, seed: int, tmp: Path) -> dict:
    """``cases`` fuzzed files, half generated and half mutated; the figures."""
    tmp.mkdir(parents=True, exist_ok=True)
    loader = Loader()
    tally = Tally(tmp, loader)
    common = dict(database=None, deadline=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck),
                  derandomize=False, print_blob=False)
    began = time.monotonic()
    try:
        plan = [("generated", policy_files(), cases - cases // 2), ("mutated", mutations(), cases // 2)]
        for k, (source, strategy, count) in enumerate(plan):
            # in rounds of at most CHUNK examples: hypothesis keeps what it tried in memory
            for chunk in range(0, count, CHUNK):
                @hseed(seed * 1_000_003 + k * 100_003 + chunk)
                @settings(max_examples=min(CHUNK, count - chunk), **common)
                @given(st.tuples(st.just(source), strategy))
                def one(case):
                    tally.check(*case)

                one()
    finally:
        loader.close()
    return {**tally.figures(), "seconds": round(time.monotonic() - began, 1), "requested": cases}
