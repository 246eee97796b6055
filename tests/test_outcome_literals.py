"""Outcomes are compared as ``core.outcomes.Outcome``, never as bare strings.

The scan reads the Python files of ``SCANNED`` with ``ast`` and names, file:line,
each string constant equal to an Outcome value that is compared (``==``,
``in``, ...; also inside a tuple, list or set compared against), used as a
dict key (a dict literal's key, a subscript, ``.get()``/``.pop()``/
``.setdefault()``) or matched in a ``case``. A word that is spelled like an
outcome but means something else (a lifecycle state) is a named constant
(``incidents.FAILED_STATE``): the scan does not look at assignments.
``SCANNED`` is every package and the benchmarks; ``core/outcomes.py``, where
the words are defined, is the one file left out.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from reflexarc.core.outcomes import Outcome

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ["core", "bpf", "actuators", "controller", "simulations", "bench"]
DEFINED = ROOT / "core" / "outcomes.py"
OUTCOME_WORDS = {o.value for o in Outcome}
KEY_METHODS = {"get", "pop", "setdefault"}


def _constants(node: ast.AST) -> list[ast.Constant]:
    """``node`` itself when it is a string constant, or the string constants of a tuple, list or set literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [c for elt in node.elts for c in _constants(elt)]
    return []


def outcome_literals(source: str) -> list[tuple[int, str, str]]:
    """(line, word, how it is used) of every outcome word compared or used as a key in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        uses: list[tuple[ast.AST, str]] = []
        if isinstance(node, ast.Compare):
            uses = [(operand, "compared") for operand in (node.left, *node.comparators)]
        elif isinstance(node, ast.Dict):
            uses = [(key, "a dict key") for key in node.keys if key is not None]
        elif isinstance(node, ast.Subscript):
            uses = [(node.slice, "a key")]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in KEY_METHODS and node.args):
            uses = [(node.args[0], "a key")]
        elif isinstance(node, ast.MatchValue):
            uses = [(node.value, "matched")]
        for operand, how in uses:
            found += [(c.lineno, c.value, how) for c in _constants(operand) if c.value in OUTCOME_WORDS]
    return sorted(found)


def scanned_files() -> list[Path]:
    return sorted(p for d in SCANNED for p in (ROOT / d).rglob("*.py") if p != DEFINED)


def test_the_scan_finds_each_kind_of_use():
    source = '''
if row["outcome"] == "applied": pass
ok = outcome in ("planned", "alerted")
MEANING = {"noop": "already so", Outcome.KEPT: "kept"}
n = counts.get("reverted", 0) + counts["failed"]
match outcome:
    case "would-revert": pass
STATE = "failed"          # an assignment: not a comparison
if state == STATE and kind == "action": pass
'''
    assert outcome_literals(source) == [(2, "applied", "compared"), (3, "alerted", "compared"),
                                        (3, "planned", "compared"), (4, "noop", "a dict key"),
                                        (5, "failed", "a key"), (5, "reverted", "a key"),
                                        (7, "would-revert", "matched")]


def test_the_scanned_packages_exist():
    assert all((ROOT / d).is_dir() for d in SCANNED)
    assert scanned_files()


@pytest.mark.parametrize("path", scanned_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_outcomes_are_compared_as_the_enum(path):
    found = outcome_literals(path.read_text(encoding="utf-8"))
    where = [f"{path.relative_to(ROOT)}:{line}: {word!r} {how}; use Outcome.{Outcome(word).name}"
             for line, word, how in found]
    assert not where, "\n".join(where)
