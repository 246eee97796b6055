"""Policy files that do not validate: ``PolicyError`` carries every finding, each
a ``Diagnostic`` (``reflexarc.core.diagnostics``: ``file:line:col: severity: message``),
so editors and CI annotate the exact key or value at fault.

Example::

    d = Diagnostic("policies/numa.yaml", 12, 9, "error", "unknown key 'clearfor'; did you mean 'clear_for'?")
    raise PolicyError([d])     # "1 error(s) in policy files:\npolicies/numa.yaml:12:9: error: unknown key ..."
    errors([d])                # [d]

Overhead: plain dataclasses.
"""
from __future__ import annotations

from reflexarc.core.diagnostics import Diagnostic

__all__ = ["PolicyError", "errors"]


class PolicyError(Exception):
    """Policy files that do not validate; ``diagnostics`` holds every finding."""

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        self.diagnostics = list(diagnostics)
        errors = [d for d in self.diagnostics if d.is_error]
        lines = "\n".join(str(d) for d in self.diagnostics)
        super().__init__(f"{len(errors)} error(s) in policy files:\n{lines}")


def errors(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    return [d for d in diagnostics if d.is_error]
