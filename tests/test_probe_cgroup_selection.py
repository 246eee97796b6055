"""Task selection by cgroup v2 id, against the real kernel.

Two identical child processes issue NVIDIA-type ioctls (type 'F') on
/dev/null; one of them is moved into a fresh cgroup in the unified hierarchy.
The gpu_submit probe, selecting only that cgroup's id (the inode number of its
directory, what ``bpf_get_current_cgroup_id`` returns), must count exactly the
ioctls of the process inside and none of the one outside, and stop counting it
once it leaves. The CLI derives the same id from a policy selector's
``cgroup`` path.
"""
from __future__ import annotations

import os
from pathlib import Path

from conftest import gpu_dev, require, require_bpf
from test_probe_gpu_submit import Child as IoctlChild

from reflexarc.bpf.gpu_submit import GpuSubmit
from reflexarc.bpf.probe import OK, Selection
from reflexarc.controller.cli.shared import _selection
from reflexarc.controller.policy.loader import load_policies
from reflexarc.core.cgroups import cgroup2_root
import pytest

pytestmark = [pytest.mark.kernel]

CALLS = 300

POLICY = """
policies:
  - name: job-cgroup
    selector:
      cgroup: {cgroup}
    rules:
      - name: submissions-stalled
        when: {{signal: gpu_submit_rate_hz, agg: last, window: 1m, op: "<", threshold: 1}}
        actions:
          - actuator: log
            params: {{message: submissions stalled}}
"""


class Child(IoctlChild):
    """A process that issues CALLS 'F' ioctls (and as many non-'F' ones) each time it is told to go."""

    def __init__(self) -> None:
        super().__init__(f"rxcg{os.getpid() % 100000}", CALLS, 0.0)

    def cgroup(self) -> str:
        """Its cgroup v2 path, relative to the cgroup2 mount."""
        for line in Path(f"/proc/{self.pid}/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:].lstrip("/")
        raise AssertionError(f"pid {self.pid} has no cgroup v2 membership")


def move(pid: int, cgroup: Path) -> None:
    (cgroup / "cgroup.procs").write_text(str(pid))


def counted(probe: GpuSubmit, children: list[Child]) -> dict[int, int]:
    """Run one round of every child's ioctls; the 'F' ioctls counted per pid."""
    probe.collect(0.0)                    # opens the interval, drops earlier ioctls
    for c in children:
        c.go()
    for c in children:
        c.wait_done()
    return {int(labels["pid"]): round(value)        # rate over a 1 s interval = count
            for name, labels, value in probe.collect(1.0) if name == "gpu_submit_rate_hz"}


def test_cgroup_id_selects_the_processes_in_the_cgroup_only(tmp_path):
    require_bpf()
    root = cgroup2_root()
    require(root is not None, "a mounted cgroup2 hierarchy")
    job = root / f"rxcgsel{os.getpid()}"
    job.mkdir()
    inside = outside = probe = None
    try:
        inside, outside = Child(), Child()
        home = root / inside.cgroup()
        move(inside.pid, job)
        assert inside.cgroup() == job.name
        assert outside.cgroup() != job.name
        cgroup_id = job.stat().st_ino

        policy_file = tmp_path / "job.yaml"
        policy_file.write_text(POLICY.format(cgroup=job))
        assert _selection(load_policies([str(policy_file)]), "llama").cgroup_ids == (cgroup_id,)

        probe = GpuSubmit(Selection(cgroup_ids=(cgroup_id,)), node="n1", dev_root=str(gpu_dev(tmp_path / "dev")))
        status = probe.start()
        assert status.state == OK, status

        assert counted(probe, [inside, outside]) == {inside.pid: CALLS}

        # Membership is read per event: once moved out, the process is no longer selected.
        move(inside.pid, home)
        assert counted(probe, [inside, outside]) == {}
    finally:
        if probe is not None:
            probe.stop()
        for child in (inside, outside):
            if child is not None:
                child.close()
        job.rmdir()
