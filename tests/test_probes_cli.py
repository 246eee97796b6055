"""``reflexarc probes``, ``--dump-bpf`` and ``top`` on the running kernel."""
from __future__ import annotations

import re
import subprocess
import sys

from conftest import require_bpf
import pytest

pytestmark = [pytest.mark.kernel]

LIGHT = ("dataloader_io", "sched_numa", "block_io", "gpu_submit", "net_tcp")
RUNNING_HERE = ("dataloader_io", "sched_numa", "block_io", "net_tcp")     # gpu_submit: no GPU here


def test_probes_lists_light_ok_and_deep_degraded_with_reasons(cli):
    require_bpf()
    r = cli("probes", timeout=300)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines()[1:]}
    for name in RUNNING_HERE:
        assert rows[name][1:3] == ["light", "ok"], r.stdout
    assert rows["gpu_submit"][1:3] == ["light", "unsupported"] and "no GPU" in " ".join(rows["gpu_submit"])
    assert rows["rdma_qp"][1:3] == ["deep", "degraded"], r.stdout
    line = next(x for x in r.stdout.splitlines() if x.startswith("rdma_qp"))
    assert "without kprobes" in line and "no RDMA device" in line and "uprobe" in line


def test_dump_bpf_prints_final_c_with_cflags(cli):
    require_bpf()
    r = cli("probes", "--dump-bpf")
    assert r.returncode == 0, r.stderr
    for name in LIGHT:
        assert f"// probe: {name}" in r.stdout
    assert "// cflag: -D" in r.stdout and "TRACEPOINT_PROBE" in r.stdout


def test_top_prints_live_signals(cli):
    require_bpf()
    r = cli("top", "--interval", "0.5", "--count", "2", timeout=300)
    assert r.returncode == 0, r.stderr
    frames = [line for line in r.stdout.splitlines() if re.match(r"\d\d:\d\d:\d\d  \d+ training process", line)]
    assert len(frames) == 2, r.stdout


def test_top_shows_hook_step_signals_and_loader_signals_by_training_process(tmp_path, cli):
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
        r = cli("--hook-dir", str(hooks), "top", "--job", "llama", "--interval", "1", "--count", "4", timeout=300)
    finally:
        os.killpg(job.pid, signal.SIGTERM)
        job.wait(timeout=30)
    assert r.returncode == 0, r.stderr
    # each frame: job llama, then this training process (rank 0) with its step
    # signals (all reported by the last frame) and its workers' read signals. The loader forks new
    # workers every epoch, so a frame drawn just after an epoch turned over may
    # not have the new workers' reads yet: at least one frame must hold all.
    lines = r.stdout.splitlines()
    blocks = []
    for start in (i for i, line in enumerate(lines) if line.startswith("job llama")):
        head = next(i for i in range(start, len(lines)) if lines[i].startswith(f"  trainer {job.pid} (rank 0"))
        names = []
        for line in lines[head + 1:]:
            if not line.startswith("    "):
                break
            names.append(line.split()[0])
        blocks.append(names)
    assert len(blocks) == 4, r.stdout
    assert "step_time_ms" in blocks[-1] and "dataloader_batch_wait_ms" in blocks[-1], r.stdout
    assert any(any(n.startswith("dataloader_read_latency_us") for n in names) for names in blocks), r.stdout
