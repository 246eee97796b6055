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
