"""Whether a policy file may drive enforcement: only files no other local user
can write, or could have replaced.

A root controller that enforces a policy does what the file says, so the file
must be as trusted as the controller: owned by root or by the user running the
controller, not writable by group or others, and every directory above it
likewise (a directory others may write could swap the file), except sticky
directories such as /tmp, where others cannot replace a file they do not own.

The controller runs as root, so it can read files their owners guard: a
policy path another user could point elsewhere (a link planted in a directory
others may write) could make it print a root-only file in its messages.
``withheld`` keeps the findings of such files, which ``run`` and reloads
print and audit, from quoting them: each becomes one line that says why its
messages are withheld.

Example::

    reason = untrusted("/etc/reflexarc/policies/numa.yaml")
    if reason: refuse(f"{path}: {reason}")
    diagnostics = withheld(diagnostics)     # before printing or auditing them

Overhead: one ``stat`` per path component, once per file at start.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path


def _owner_ok(st: os.stat_result, euid: int) -> bool:
    return st.st_uid in (0, euid)


def untrusted(path: str | Path, euid: int | None = None) -> str | None:
    """Why ``path`` must not drive enforcement, or None when it may."""
    euid = os.geteuid() if euid is None else euid
    path = Path(os.path.abspath(path))
    st = os.stat(path)
    if not _owner_ok(st, euid):
        return f"owned by uid {st.st_uid}, not by root or the controller's user"
    if st.st_mode & 0o022:
        who = {0o022: "group and others", 0o002: "others", 0o020: "its group"}[st.st_mode & 0o022]
        return f"writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    for parent in path.parents:
        pst = os.stat(parent)
        if not _owner_ok(pst, euid):
            return f"directory {parent} is owned by uid {pst.st_uid}, not by root or the controller's user"
        if pst.st_mode & 0o022 and not pst.st_mode & stat.S_ISVTX:
            return f"directory {parent} is writable by others (mode {stat.S_IMODE(pst.st_mode):04o})"
    return None


def withheld(diagnostics: list) -> list:
    """``diagnostics`` with those of untrusted files replaced: one error per such
    file that has errors, without a word of its content (its line and column
    neither), and none of its warnings."""
    from reflexarc.core.diagnostics import Diagnostic
    reasons: dict[str, str | None] = {}
    out, said = [], set()
    for d in diagnostics:
        if d.file not in reasons:
            try:
                reasons[d.file] = untrusted(d.file)
            except OSError as exc:
                reasons[d.file] = f"unreadable ({exc.strerror or exc})"
        reason = reasons[d.file]
        if reason is None:
            out.append(d)
        elif d.is_error and d.file not in said:
            said.add(d.file)
            out.append(Diagnostic(d.file, 1, 1, "error", f"not a valid policy file; its messages are withheld, "
                                                         f"since the file is {reason}"))
    return out
