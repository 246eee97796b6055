"""Where the cgroup v2 hierarchy is mounted: ``/sys/fs/cgroup`` on a pure v2
host, ``/sys/fs/cgroup/unified`` on a hybrid v1/v2 one. A cgroup v2 id is the
inode number of the cgroup's directory there.

Example::

    cgroup2_root()                         # Path("/sys/fs/cgroup/unified"), or None
    (cgroup2_root() / "job").stat().st_ino # the id bpf_skb_cgroup_id() reports

Overhead: one read of ``/proc/self/mountinfo`` per call.
"""
from __future__ import annotations

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


def cgroup2_id(path: str, proc_root: str = "/proc") -> int | None:
    """The id of the cgroup v2 ``path`` as ``/proc/PID/cgroup`` writes it (``/job``,
    relative to the mount), or None when it is not there (gone, or no v2 mount)."""
    root = cgroup2_root(proc_root)
    if root is None:
        return None
    try:
        return (root / path.lstrip("/")).stat().st_ino
    except OSError:
        return None
