"""Real inode flags for tests: ``chattr +i`` (immutable) and ``chattr +a``
(append-only) on files under a test's directory, cleared again on exit.

Example::

    with FileAttrs(tmp_path) as attrs:
        attrs.set(tmp_path / "journal.jsonl", "+i")

Needs root, e2fsprogs' ``chattr`` and a filesystem under ``root`` that keeps the
flags (ext4, xfs, btrfs); otherwise the test fails naming what is missing.
Overhead: one ``chattr`` process per call.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from conftest import require, require_root


class FileAttrs:
    def __init__(self, root: Path) -> None:
        require_root()
        require(shutil.which("chattr") is not None, "chattr (e2fsprogs)")
        probe = root / ".attr-probe"
        probe.write_text("")
        r = subprocess.run(["chattr", "+i", str(probe)], capture_output=True, text=True)
        require(r.returncode == 0, f"inode flags (chattr +i) on the filesystem of {root}: {r.stderr.strip()}")
        self.clear(probe)
        probe.unlink()
        self._set: list[Path] = []

    def __enter__(self) -> "FileAttrs":
        return self

    def __exit__(self, *exc) -> None:
        for path in self._set:
            if path.exists():
                self.clear(path)

    def set(self, path: Path, flag: str) -> None:
        subprocess.run(["chattr", flag, str(path)], check=True, capture_output=True)
        self._set.append(path)

    @staticmethod
    def clear(path: Path) -> None:
        subprocess.run(["chattr", "-i", "-a", str(path)], check=True, capture_output=True)
