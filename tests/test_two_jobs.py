"""Two jobs on one node, in the real testbed: a two-rank gloo job launched as
torchrun would (each rank in a pod-style cgroup, serving the framework hooks)
and an unmodified neighbour launched as Slurm would (its own step cgroups, its
own store), sharing the ranks' namespaces and the bottleneck. The controller is
given no job, cgroup or pid: it finds both. A slow store hits the first job
only; only the first job's target acts, and the neighbour's target is watched,
labelled as its own, and stays clean."""
from __future__ import annotations

import pytest
from test_closed_loop import loop, outcomes, require_loop

pytestmark = [pytest.mark.kernel, pytest.mark.testbed, pytest.mark.slow]


def test_a_fault_on_one_job_remediates_that_job_only(tmp_path):
    require_loop()
    r = loop("b", tmp_path, neighbour=True)
    job, other = r["job"], r["neighbour"]
    assert other["job"].startswith("slurm-") and other["job"] != job
    assert outcomes(r)[0] == ("framework_hook", "applied"), r["actions"]
    assert all(a["target"] == f"job={job}" for a in r["actions"]), r["actions"]
    assert other["actions"] == [], other["actions"]
    assert f"dataloader-starvation/loader-starved/job={other['job']}" in other["targets_evaluated"], other
    assert all(set(states) <= {"pending", "ok"} for states in other["transitions"].values()), other["transitions"]
    report = (tmp_path / "fault-b-neighbour" / "report" / "report.html").read_text()
    assert job in report and other["job"] in report
