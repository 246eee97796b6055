"""``reflexarc top``: the step signals real training scripts report through the
hooks, grouped by job and training process; a process that exits disappears
(its pid is gone from the process table, not just quiet); the process table is
read under an injectable root."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import require_root
from reflexarc.controller.cli.top import TopView, read_hooks

pytestmark = [pytest.mark.kernel]


SCRIPT = r"""
import sys, time
from reflexarc.actuators.hooks import Hooks
with Hooks.start(job=sys.argv[2], rank=int(sys.argv[3]), hook_dir=sys.argv[1]) as hooks:
    print("ready", flush=True)
    while True:
        hooks.report(step_time_ms=182.5, dataloader_batch_wait_ms=12.25, step_pre_collective_ms=40.0)
        hooks.step_boundary()
        time.sleep(0.02)
"""
SIGNALS = {"step_time_ms": "182.5", "dataloader_batch_wait_ms": "12.25", "step_pre_collective_ms": "40"}


@pytest.fixture
def hook_dir(tmp_path) -> Path:
    """A hook directory of this test's own: root's, mode 0755, as the hook channel requires."""
    require_root()
    d = tmp_path / "hooks"
    d.mkdir()
    os.chmod(d, 0o755)
    assert d.stat().st_uid == 0
    return d


@pytest.fixture
def scripts(hook_dir):
    """Start training scripts (job, rank) that report step signals; each is running when returned."""
    started = []

    def start(job: str, rank: int) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(hook_dir), job, str(rank)],
                                stdout=subprocess.PIPE, text=True)
        started.append(proc)
        assert proc.stdout.readline().strip() == "ready"
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=30)


def section(text: str, pid: int) -> list[str]:
    """The rows under the heading of training process ``pid``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  trainer {pid} "))
    rows = []
    for line in lines[start + 1:]:
        if not line.startswith("    "):
            break
        rows.append(line.split())
    return rows


def test_hook_signals_grouped_by_trainer_and_an_exited_process_disappears(hook_dir, scripts):
    first, second = scripts("llama", 0), scripts("llama", 1)
    view = TopView(proc_root="/proc")
    now = time.time()
    view.update(read_hooks(str(hook_dir)), now)
    view.prune(now)
    text = view.render(now)
    assert text.splitlines()[0].endswith("2 training processes, 6 series")
    assert text.splitlines()[1] == "job llama"
    for proc, rank in ((first, 0), (second, 1)):
        assert f"  trainer {proc.pid} (rank {rank}, python" in text
        rows = section(text, proc.pid)
        assert {row[0]: row[1] for row in rows} == SIGNALS
        assert [row[0] for row in rows] == list(SIGNALS)            # the step signals first, in this order
        assert all(row[2] == "ms" for row in rows)

    second.kill()                      # no clean-up: its socket stays behind
    second.wait(timeout=30)
    socket = hook_dir / f"llama-1-{second.pid}.sock"
    assert socket.exists()
    now = time.time()
    view.update(read_hooks(str(hook_dir)), now)
    view.prune(now)
    text = view.render(now)
    assert text.splitlines()[0].endswith("1 training process, 3 series (3 of exited or silent targets dropped)")
    assert f"trainer {second.pid}" not in text
    assert {row[0]: row[1] for row in section(text, first.pid)} == SIGNALS


def test_top_once_without_probes_prints_one_grouped_table(hook_dir, scripts, cli):
    proc = scripts("llama", 0)
    r = cli("--hook-dir", str(hook_dir), "--proc-root", "/proc", "top", "--once", "--no-probes")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].endswith("1 training process, 3 series") and lines[1] == "job llama"
    assert lines[2].startswith(f"  trainer {proc.pid} (rank 0, python")
    assert {row[0]: row[1] for row in section(r.stdout, proc.pid)} == SIGNALS


def test_top_without_probes_needs_the_hook_directory(tmp_path, cli):
    r = cli("--hook-dir", str(tmp_path / "none"), "top", "--once", "--no-probes")
    assert r.returncode != 0 and "nothing to show without the hook directory" in r.stderr


def fake_process(root: Path, pid: int, start: int, state: str = "S", comm: str = "python") -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    fields = [state, "1"] + ["0"] * 17 + [str(start)] + ["0"] * 10
    (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(fields) + "\n")
    (d / "comm").write_text(comm + "\n")


def test_series_of_processes_gone_from_the_process_table_are_dropped(tmp_path):
    """Probe series of a training process and its DataLoader workers: a worker pid
    that exited, a zombie, and a pid reused by a later process all disappear; a
    node-wide series stays until it falls silent."""
    proc = tmp_path / "proc"
    fake_process(proc, 100, 5000)                      # the training process
    fake_process(proc, 101, 5001, comm="pt_data_worker")
    fake_process(proc, 102, 5002, comm="pt_data_worker")
    fake_process(proc, 200, 6000, state="Z")           # exited, not yet reaped
    view = TopView(proc_root=str(proc), stale_after=30.0)
    p99 = "dataloader_read_latency_us"
    samples = [(p99, {"job": "llama", "trainer": "100", "pid": str(pid), "quantile": "0.99"}, 812.0)
               for pid in (101, 102, 103)]           # 103 is not in the table: it exited
    samples += [("sched_runqueue_latency_us", {"trainer": "200", "pid": "200"}, 40.0),
                ("link_utilization_pct", {"iface": "eth0", "traffic": "other"}, 45.0)]
    view.update(samples, 1000.0)
    view.prune(1000.0)
    text = view.render(1000.0)
    assert "pid=101" in text and "pid=102" in text and "pid=103" not in text and "trainer 200" not in text
    assert "  trainer 100 (pt_data_worker" not in text and "  trainer 100 (python)" in text
    assert text.splitlines()[0].endswith("1 training process, 3 series (2 of exited or silent targets dropped)")
    lines = text.splitlines()
    assert "node" in lines and any("link_utilization_pct{traffic=other}" in line for line in lines)

    fake_process(proc, 102, 7777, comm="pt_data_worker")   # the pid now names a process that started later
    view.prune(1010.0)
    assert "pid=102" not in view.render(1010.0) and "pid=101" in view.render(1010.0)
    view.update([s for s in samples if s[1].get("pid") == "101"], 1040.0)
    view.prune(1045.0)                                 # the link series has had no sample for 45 s
    text = view.render(1045.0)
    assert "link_utilization_pct" not in text and "pid=101" in text
