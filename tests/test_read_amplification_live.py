"""The shipped read-amplification-alert fires from the live signals of an
unmodified job: a PyTorch DataLoader (``workloads/record_reader.py``, started
by no launcher, no ``--job`` flag) reads 16 KiB records of a loop device under
the default readahead, and its loop waits for every batch. ``reflexarc run``
with the shipped policy file as it is (dry-run) reads the real dataloader_io
and batch_wait probes, and plans the alert for that job, with the ratio in
its evidence; nothing is applied."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

from conftest import ROOT, loop_device, require_bpf, wait_until

import pytest

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

WORKLOAD = ROOT / "tests" / "workloads" / "record_reader.py"
POLICY = ROOT / "policies" / "read-amplification-alert.yaml"
RUN_S = 100                 # the rule's minute of for, after its conditions hold from the first samples


@pytest.fixture
def records_device(tmp_path):
    require_bpf()
    with loop_device(tmp_path / "records.img", 4 << 30) as dev:      # sparse: 16,384 places for a record
        yield dev


def test_the_shipped_policy_plans_its_alert_for_a_loader_whose_disk_reads_4x(tmp_path, records_device, cli):
    job_proc = subprocess.Popen([sys.executable, str(WORKLOAD), "--device", records_device, "--duration", "300"],
                                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, cwd="/",
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
    lines: list[dict] = []

    def read() -> None:
        for line in job_proc.stdout:
            try:
                lines.append(json.loads(line))
            except ValueError:
                pass
    threading.Thread(target=read, daemon=True).start()
    try:
        wait_until("the job's first step", lambda: any(e.get("event") == "step" for e in list(lines)), timeout=180)
        pid = next(e["pid"] for e in lines if e.get("event") == "ready")
        state = tmp_path / "state"
        run = cli("--state-dir", str(state), "--hook-dir", str(tmp_path / "hooks"), "run", "--policy", str(POLICY),
                  "--duration", str(RUN_S), timeout=400)
        assert job_proc.poll() is None, "the job ran through the controller's run"
    finally:
        if job_proc.poll() is None:
            os.killpg(job_proc.pid, signal.SIGKILL)
        job_proc.wait(timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    job = f"record_reader.py-{pid}"
    recs = [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]
    actions = [r for r in recs if r["kind"] == "action"]
    planned = [r for r in actions if r.get("rule") == "loader-reads-amplified" and r["outcome"] == "planned"]
    assert planned, (f"no alert planned; transitions: "
                     f"{[(r.get('target'), r['to']) for r in recs if r['kind'] == 'transition']}; "
                     f"controller: {run.stderr[-1500:]}")
    assert planned[0]["target_labels"]["job"] == job, planned[0]
    assert all(r["outcome"] != "applied" for r in actions), actions
    fired = next(r for r in recs if r["kind"] == "transition" and r["to"] == "firing")
    ratio = next(e for e in fired["evidence"] if e["signal"] == "dataloader_read_amplification_ratio")
    wait = next(e for e in fired["evidence"] if e["signal"] == "dataloader_batch_wait_ms")
    assert ratio["value"] > 2.5 and wait["value"] > 10, fired["evidence"]
