"""``core.cgroups.cgroup2_id``, the one cgroup path -> cgroup v2 id helper (the
DSCP actuator's cgroup match, discovery's job cgroups, the testbed's ranks):
relative to the mount, as /proc/PID/cgroup writes it, or absolute under it;
None for what is not a cgroup there. A fake mountinfo points at directories
made for the test, so no root is needed; one real check when the host has a
cgroup2 mount.
"""
from __future__ import annotations

from pathlib import Path

from conftest import require

from reflexarc.core.cgroups import cgroup2_id, cgroup2_root


def fake_proc(tmp: Path, *mounts: Path) -> str:
    """A /proc whose self/mountinfo lists a cgroup v1 mount, then ``mounts`` as cgroup2."""
    lines = [f"30 25 0:27 / {tmp / 'v1'} rw shared:9 - cgroup cgroup rw,cpu"]
    lines += [f"{36 + i} 25 0:31 / {m} rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate"
              for i, m in enumerate(mounts)]
    (tmp / "proc" / "self").mkdir(parents=True)
    (tmp / "proc" / "self" / "mountinfo").write_text("\n".join(lines) + "\n")
    return str(tmp / "proc")


def test_relative_absolute_and_missing(tmp_path):
    first, second = tmp_path / "unified", tmp_path / "again"
    (first / "job" / "rank0").mkdir(parents=True)
    (second / "only-here").mkdir(parents=True)
    (first / "cgroup.procs").write_text("")
    (tmp_path / "v1" / "job").mkdir(parents=True)
    proc = fake_proc(tmp_path, first, second)
    rank = (first / "job" / "rank0").stat().st_ino
    assert cgroup2_id("/job/rank0", proc) == cgroup2_id("job/rank0", proc) == rank
    assert cgroup2_id(str(first / "job" / "rank0"), proc) == cgroup2_id(first / "job" / "rank0", proc) == rank
    assert cgroup2_id("/", proc) == first.stat().st_ino
    assert cgroup2_id("/only-here", proc) == (second / "only-here").stat().st_ino    # the next mount
    assert cgroup2_id("/gone", proc) is None
    assert cgroup2_id("/cgroup.procs", proc) is None                                  # a file, not a cgroup
    assert cgroup2_id(str(tmp_path / "v1" / "job"), proc) is None                     # a v1 cgroup
    assert cgroup2_id("/job", fake_proc(tmp_path / "none")) is None                   # no cgroup2 mount


def test_a_real_cgroup():
    root = cgroup2_root()
    require(root is not None, "a mounted cgroup2 hierarchy")
    assert cgroup2_id("/") == cgroup2_id(root) == root.stat().st_ino
