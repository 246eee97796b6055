"""Files a user names as input: only regular files, and directories of them, are read.

A FIFO, a socket or a device where a file is expected would block its reader
(a FIFO nobody writes to) or never end (``/dev/zero``). So a path is stat'ed
before it is opened, opened with ``O_NONBLOCK`` (an open cannot wait for a
writer) and kept so (a regular file never blocks; one of the kernel's that
would, like ``/proc/kmsg``, fails with EAGAIN instead), and the open file is
checked again with ``fstat`` before a byte is read; whole-file reads stop at a
size limit. Every refusal is an
``InputFileError`` whose text is ``PATH: reason``.

Example::

    text = read_text("policies/tests/numa.yaml", max_bytes=1 << 20)
    with open_regular("audit.jsonl", text=True) as fh:
        first = fh.readline()
    files_in(["policies/tests/"], (".yaml", ".yml"))   # [PosixPath('policies/tests/numa.yaml'), ...]
    read_text("/tmp/fifo", 1024)     # InputFileError: /tmp/fifo: is a FIFO, not a regular file

Overhead: one ``stat`` and one ``fstat`` per file.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import IO

KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
         (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class InputFileError(ValueError):
    """A path that cannot be read as an input file; ``str()`` is ``PATH: reason``."""

    def __init__(self, path, reason: str, line: int | None = None, col: int | None = None) -> None:
        self.path, self.reason, self.line, self.col = str(path), reason, line, col
        where = f":{line}:{col}" if line is not None else ""
        super().__init__(f"{self.path}{where}: {reason}")


def kind_of(mode: int) -> str:
    """'a FIFO', 'a directory', ... for a ``st_mode`` that is not a regular file's."""
    return next((name for test, name in KINDS if test(mode)), "not a regular file")


def _reason(exc: OSError) -> str:
    text = exc.strerror or str(exc)
    return text[:1].lower() + text[1:]


def _stat(path: str | Path) -> os.stat_result:
    try:
        return os.stat(path)
    except OSError as exc:
        raise InputFileError(path, _reason(exc)) from None
    except ValueError as exc:                 # an embedded NUL byte
        raise InputFileError(repr(str(path)), f"not a path ({exc})") from None


def check_regular(path: str | Path) -> None:
    """Raise ``InputFileError`` unless ``path`` exists and is a regular file."""
    st = _stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(path, f"is {kind_of(st.st_mode)}, not a regular file")


def open_regular(path: str | Path, text: bool = False, follow: bool = True) -> IO:
    """``path`` opened for reading (binary, or UTF-8 text with undecodable bytes
    replaced), refused unless it is a regular file when stat'ed and when open;
    with ``follow=False`` a symbolic link is refused too."""
    if not follow and os.path.islink(path):
        raise InputFileError(path, "is a symbolic link, not followed")
    check_regular(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    except OSError as exc:
        raise InputFileError(path, "is a symbolic link, not followed" if exc.errno == errno.ELOOP and not follow
                             else _reason(exc)) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):               # replaced between the stat and the open
        os.close(fd)
        raise InputFileError(path, f"is {kind_of(mode)}, not a regular file")
    if text:
        return os.fdopen(fd, "r", encoding="utf-8", errors="replace")
    return os.fdopen(fd, "rb")


def read_kernel_file(path: str | Path, max_bytes: int) -> bytes:
    """At most ``max_bytes + 1`` bytes of a small file of the kernel's (a sysfs
    attribute, a ``/proc`` status), opened non-blocking so that a FIFO planted
    in a fixture tree reads empty instead of waiting: more than ``max_bytes``
    means it is not the file expected. OSError as the read raised it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        data = b""
        while len(data) <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - len(data))
            if not chunk:
                break
            data += chunk
        return data
    finally:
        os.close(fd)


def position(data: bytes, index: int) -> tuple[int, int]:
    """1-based (line, column) of byte ``index`` in ``data``."""
    before = data[:index]
    return before.count(b"\n") + 1, index - (before.rfind(b"\n") + 1) + 1


def read_text(path: str | Path, max_bytes: int) -> str:
    """The UTF-8 text of the regular file ``path`` (a BOM is dropped); refused
    past ``max_bytes`` and at the first byte that is not UTF-8 (located)."""
    with open_regular(path) as fh:
        try:
            data = fh.read(max_bytes + 1)
        except OSError as exc:
            raise InputFileError(path, _reason(exc)) from None
    if len(data) > max_bytes:
        raise InputFileError(path, f"larger than {max_bytes} bytes")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line, col = position(data, exc.start)
        raise InputFileError(path, f"not UTF-8 text: byte 0x{data[exc.start]:02x} cannot be decoded",
                             line, col) from None


def files_in(paths: list[str], suffixes: tuple[str, ...]) -> list[Path]:
    """The files ``paths`` name: a file as given, a directory's files with one of
    ``suffixes`` (sorted, hidden ones left out). Anything that is not a regular
    file, named or found in a directory, is refused."""
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not str(raw).strip():
            raise InputFileError(repr(str(raw)), "an empty path")
        if stat.S_ISDIR(_stat(path).st_mode):
            try:
                entries = sorted(p for p in path.iterdir() if p.suffix in suffixes and not p.name.startswith("."))
            except OSError as exc:
                raise InputFileError(path, _reason(exc)) from None
        else:
            entries = [path]
        for entry in entries:
            check_regular(entry)
        out.extend(entries)
    return out
