"""A training job started by hand, with no launcher, is still a job: an
unmodified PyTorch script (``workloads/sleepy_trainer.py``) run as a plain
``python`` process, with no launcher variable in its environment and outside
any pod or Slurm cgroup, starved of batches by its slow Dataset. ``reflexarc
jobs`` lists it under a job of its own (``sleepy_trainer.py-PID``, found by
``process``), and ``reflexarc run`` with the shipped policies, no ``--job``
and the default dry-run gives ``dataloader-starvation`` (grouped ``by: [job]``)
a target with that job, evaluated on the real batch_wait and dataloader_io
probes' signals; nothing is applied."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from conftest import ROOT, require, require_bpf, wait_until

from reflexarc.core.cgroup_jobs import from_cgroups
from reflexarc.core.procfs import ProcFS
import pytest

pytestmark = [pytest.mark.kernel]

WORKLOAD = ROOT / "tests" / "workloads" / "sleepy_trainer.py"
POLICY = "dataloader-starvation"
RUN_S = 25                  # the controller's run: the rule's 10 s window filled twice


def start_trainer() -> tuple[subprocess.Popen, list[dict]]:
    """sleepy_trainer.py starved (40 ms an item, 2 workers: ~80 ms a batch), with
    only PATH in its environment; its JSON lines gathered by a thread."""
    proc = subprocess.Popen([sys.executable, str(WORKLOAD), "--item-ms", "40", "--duration", "240"],
                            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, cwd="/",
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    lines: list[dict] = []

    def read() -> None:
        for line in proc.stdout:
            try:
                lines.append(json.loads(line))
            except ValueError:
                pass
    threading.Thread(target=read, daemon=True).start()
    return proc, lines


def stepping(lines: list[dict]) -> int | None:
    """The trainer's pid once it took its first batch (its workers run)."""
    if not any(e.get("event") == "step" for e in lines):
        return None
    return next(e["pid"] for e in lines if e.get("event") == "ready")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def records(state: Path) -> list[dict]:
    audit = state / "audit.jsonl"
    return [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []


def test_a_job_started_by_no_launcher_gets_a_target_of_its_own(tmp_path, cli):
    require_bpf()
    require(from_cgroups(ProcFS().cgroups(os.getpid())) is None,
            "a test process outside kubelet and Slurm cgroups (its children would be a pod's or a step's)")
    trainer, lines = start_trainer()
    try:
        pid = wait_until("the trainer's first step", lambda: stepping(list(lines)), timeout=180)
        state = tmp_path / "state"
        # Every tick's evaluation audited (the default writes a quiet rule-target's
        # first one and then one per 20 minutes): the batch wait over the whole run.
        run = cli("--state-dir", str(state), "--hook-dir", str(tmp_path / "hooks"), "run", "--duration", str(RUN_S),
                  "--audit-sample", "1s", timeout=300)
        table = cli("jobs")
        assert trainer.poll() is None, "the trainer ran through the controller's run"
    finally:
        stop(trainer)
    assert run.returncode == 0, run.stderr[-2000:]
    job = f"sleepy_trainer.py-{pid}"

    recs = records(state)
    mine = [r for r in recs if r.get("policy") == POLICY and r.get("target_labels", {}).get("job") == job]
    seen = sorted({r["target"] for r in recs if r.get("policy") == POLICY and "target" in r})
    evals = [r for r in mine if r["kind"] == "eval"]
    assert evals, f"no evaluation of {POLICY} for job {job}; its targets: {seen}; controller: {run.stderr[-1500:]}"
    assert {r["target"] for r in evals} == {f"job={job}"}
    waits = [v["value"] for r in evals for v in r["values"]
             if v["signal"] == "dataloader_batch_wait_ms" and v["value"] is not None]
    assert waits and max(waits) > 10, f"the starved loop's batch wait, from the probe: {waits}"
    actions = [r for r in recs if r["kind"] == "action"]
    assert all(r["outcome"] != "applied" and r["mode"] == "dry-run" for r in actions), actions
    fired = [r for r in mine if r["kind"] == "transition" and r["to"] == "firing"]
    if fired:      # reads slow enough too (p99 over 1 ms, for 10 s): its first action is the prefetch hook
        planned = [r for r in mine if r["kind"] == "action"]
        assert planned and planned[0]["actuator"] == "framework_hook", planned

    assert table.returncode == 0, table.stderr
    row = next((line.split() for line in table.stdout.splitlines() if line.split()[:1] == [job]), None)
    assert row is not None and row[4] == str(pid) and row[1] == "-", table.stdout
    assert f"{job}: found by process" in table.stdout, table.stdout
