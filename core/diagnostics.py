"""Located findings about files people write, in the ``file:line:col: severity: message``
form compilers use, so editors and CI annotate the exact key or value at fault.

A ``Diagnostic`` is one finding (an error or a warning); ``LocatedError`` raises
one error, for readers that stop at the first (scenarios, policy tests).

Example::

    d = Diagnostic("policies/numa.yaml", 12, 9, "error", "unknown key 'clearfor'; did you mean 'clear_for'?")
    str(d)     # 'policies/numa.yaml:12:9: error: unknown key ...'
    raise LocatedError("s.yaml", 1, 11, "bad duration '10x'")   # str(): 's.yaml:1:11: error: bad duration ...'

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


class LocatedError(ValueError):
    """One error at a place in a file; ``str()`` is ``file:line:col: error: message``."""

    def __init__(self, file: str, line: int, col: int, message: str) -> None:
        self.file, self.line, self.col, self.message = str(file), line, col, message
        super().__init__(str(self.diagnostic))

    @property
    def diagnostic(self) -> Diagnostic:
        return Diagnostic(self.file, self.line, self.col, "error", self.message)
