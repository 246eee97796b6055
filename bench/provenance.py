"""What every benchmark records about the code it measured, and how SIGTERM
ends it: shared by ``churn.py`` and ``fleet.py``.

Example::

    from provenance import code_version, interrupted
    signal.signal(signal.SIGTERM, interrupted)
    result["code"] = code_version()
"""
from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def code_version() -> dict:
    """The commit, the files changed since it (read-only git) and where
    ``reflexarc`` was imported from, since the controller's code is what is measured."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *argv], capture_output=True, text=True).stdout.strip()
    return {"commit": git("rev-parse", "HEAD"), "changed": git("status", "--porcelain").splitlines(),
            "imported_from": str(Path(importlib.util.find_spec("reflexarc.controller").origin).parent)}


def interrupted(*_) -> None:
    """SIGTERM ends the benchmark as Ctrl-C does: through every cleanup."""
    raise KeyboardInterrupt
