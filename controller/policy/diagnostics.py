"""Located findings about policy files, in the ``file:line:col: severity: message``
form compilers use, so editors and CI annotate the exact key or value at fault.

Example::

    d = Diagnostic("policies/numa.yaml", 12, 9, "error", "unknown key 'clearfor'; did you mean 'clear_for'?")
    str(d)   # 'policies/numa.yaml:12:9: error: unknown key ...'
    raise PolicyError([d])

Overhead: plain dataclasses.
"""
from __future__ import annotations

from dataclasses import dataclass

@dataclass(frozen=True, order=True)
class Diagnostic:
    file: str
    line: int       # 1-based
    col: int        # 1-based
    severity: str   # "error" | "warning"
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.severity}: {self.message}"

    @property
    def is_error(self) -> bool:
        return self.severity == "error"


class PolicyError(Exception):
    """Policy files that do not validate; ``diagnostics`` holds every finding."""

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        self.diagnostics = list(diagnostics)
        errors = [d for d in self.diagnostics if d.is_error]
        lines = "\n".join(str(d) for d in self.diagnostics)
        super().__init__(f"{len(errors)} error(s) in policy files:\n{lines}")


def errors(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    return [d for d in diagnostics if d.is_error]
