"""``reflexarc probes``, ``--dump-bpf`` and ``top`` on the running kernel."""
from __future__ import annotations

import subprocess
import sys

from conftest import require_bpf

RX = [sys.executable, "-m", "reflexarc.controller.cli"]
LIGHT = ("dataloader_io", "sched_numa", "block_io", "gpu_submit", "net_tcp")


def test_probes_lists_light_ok_and_deep_degraded_with_reasons():
    require_bpf()
    r = subprocess.run(RX + ["probes"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines()[1:]}
    for name in LIGHT:
        assert rows[name][1:3] == ["light", "ok"], r.stdout
    assert rows["rdma_qp"][1:3] == ["deep", "degraded"], r.stdout
    line = next(x for x in r.stdout.splitlines() if x.startswith("rdma_qp"))
    assert "without kprobes" in line and "no RDMA device" in line and "uprobe" in line


def test_dump_bpf_prints_final_c_with_cflags():
    require_bpf()
    r = subprocess.run(RX + ["probes", "--dump-bpf"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for name in LIGHT:
        assert f"// probe: {name}" in r.stdout
    assert "// cflag: -D" in r.stdout and "TRACEPOINT_PROBE" in r.stdout


def test_top_prints_live_signals():
    require_bpf()
    r = subprocess.run(RX + ["top", "--interval", "0.5", "--count", "2"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("samples)") == 2


def test_top_shows_hook_step_signals_and_loader_signals_by_training_process(tmp_path):
    """A real DataLoader job with framework hooks: ``top`` shows the step signals it
    reports and its workers' read signals under its pid and rank."""
    require_bpf()
    import json
    import os
    import signal
    from conftest import ROOT
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    job = subprocess.Popen([sys.executable, str(ROOT / "tests" / "workloads" / "epoch_loader.py"), "--duration", "60",
                            "--hook-dir", str(hooks), "--job", "llama", "--interval", "0.5"],
                           stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        ready = None
        for line in job.stdout:
            rec = json.loads(line)
            if rec.get("event") in ("ready", "progress") and list(hooks.iterdir()):
                ready = rec
                break
        assert ready is not None, "the job did not start"
        r = subprocess.run(RX + ["--hook-dir", str(hooks), "top", "--job", "llama", "--interval", "1",
                                 "--count", "4"], capture_output=True, text=True, timeout=300)
    finally:
        os.killpg(job.pid, signal.SIGTERM)
        job.wait(timeout=30)
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()]
    step = [row for row in rows if len(row) >= 2 and row[1] == "step_time_ms"]
    assert step and step[0][0] == "job=llama,rank=0", r.stdout
    assert any(len(row) >= 2 and row[1] == "dataloader_batch_wait_ms" for row in rows), r.stdout
    loader = [row[0] for row in rows if len(row) >= 2 and row[1].startswith("dataloader_read")]
    assert loader and all(f"rank=0,trainer={job.pid}" in t for t in loader), r.stdout
