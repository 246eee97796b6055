"""Where the cgroup v2 hierarchy is mounted: ``/sys/fs/cgroup`` on a pure v2
host, ``/sys/fs/cgroup/unified`` on a hybrid v1/v2 one. A cgroup v2 id is the
inode number of the cgroup's directory there: what ``bpf_skb_cgroup_id`` and
``bpf_get_current_cgroup_id`` report.

Example::

    cgroup2_root()                         # Path("/sys/fs/cgroup/unified"), or None
    cgroup2_id("/job")                     # as /proc/PID/cgroup writes it: 4242
    cgroup2_id("/sys/fs/cgroup/unified/job")   # the same cgroup, by its absolute path: 4242

Overhead: one read of ``/proc/self/mountinfo`` per call, and ``cgroup2_id`` a
stat per mount it tries.
"""
from __future__ import annotations

import stat
from pathlib import Path


def cgroup2_mounts(proc_root: str = "/proc") -> list[Path]:
    """Every mount point of a cgroup2 file system, in mount order."""
    out = []
    for line in Path(proc_root, "self", "mountinfo").read_text().splitlines():
        fields = line.split()
        if "-" in fields and fields[fields.index("-") + 1] == "cgroup2":
            out.append(Path(fields[4]))
    return out


def cgroup2_root(proc_root: str = "/proc") -> Path | None:
    """The first cgroup2 mount, or None when none is mounted."""
    mounts = cgroup2_mounts(proc_root)
    return mounts[0] if mounts else None


def cgroup2_id(path: str | Path, proc_root: str = "/proc") -> int | None:
    """The id of the cgroup v2 ``path``: absolute, under a cgroup2 mount, or
    relative to the mount (as ``/proc/PID/cgroup`` writes it: ``/job``); None
    when it is not there (gone, not a directory, or no v2 mount)."""
    path, roots = Path(path), cgroup2_mounts(proc_root)
    under = any(path.is_relative_to(root) for root in roots)
    for candidate in [path] if under else [root / str(path).lstrip("/") for root in roots]:
        try:
            st = candidate.stat()
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            return st.st_ino
    return None
