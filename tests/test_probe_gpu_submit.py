"""gpu_submit probe against real ioctl syscalls.

There is no GPU here. Child processes issue ioctls with NVIDIA-type numbers
(type 'F') on /dev/null: the syscall fails with ENOTTY but
``syscalls:sys_enter_ioctl`` fires exactly as for the driver. Each child also
issues a terminal ioctl (type 'T') that must not be counted. The probe is
given a stand-in ``/dev`` naming ``nvidia0`` (``conftest.gpu_dev``); without
one it attaches nothing. A child stands for a training process when it is
listed in ``Selection.trainers``, as the probe manager lists the training
processes job discovery found.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace

from conftest import gpu_dev, require_bpf

from reflexarc.bpf.gpu_submit import GpuSubmit
from reflexarc.bpf.probe import OK, UNSUPPORTED, Selection
from reflexarc.controller.signals.catalogue import CATALOGUE
import pytest

pytestmark = [pytest.mark.kernel]

CALLS, GAP_S = 200, 0.005

CHILD = r"""
import fcntl, os, sys, time
comm, calls, gap = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
with open("/proc/self/comm", "w") as f:
    f.write(comm)
fd = os.open("/dev/null", os.O_RDONLY)
NVIDIA = (3 << 30) | (32 << 16) | (ord("F") << 8) | 0x2a   # _IOWR('F', 0x2a, 32 bytes)
TCGETS = 0x5401                                            # type 'T'
while sys.stdin.readline().strip() == "go":
    for _ in range(calls):
        for cmd in (NVIDIA, TCGETS):
            try:
                fcntl.ioctl(fd, cmd, bytes(32))
            except OSError:
                pass
        time.sleep(gap)
    print("done", flush=True)
"""


class Child:
    def __init__(self, comm: str, calls: int = CALLS, gap: float = GAP_S) -> None:
        self.comm = comm
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, comm, str(calls), str(gap)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # wait until the comm is set
            with open(f"/proc/{self.pid}/comm") as f:
                if f.read().strip() == comm:
                    return
            time.sleep(0.01)
        raise AssertionError(f"child {self.pid} never renamed itself to {comm}")

    def go(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def wait_done(self) -> None:
        assert self.proc.stdout.readline().strip() == "done"

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


def run_round(probe: GpuSubmit, children: list[Child]) -> tuple[float, list]:
    t0 = time.monotonic()
    probe.collect(t0)                     # opens the interval, drops start-up ioctls
    for c in children:
        c.go()
    for c in children:
        c.wait_done()
    t1 = time.monotonic()
    return t1 - t0, probe.collect(t1)


def by_pid(out: list, signal: str) -> dict:
    res: dict = {}
    for name, labels, value in out:
        if name == signal:
            res.setdefault(int(labels["pid"]), {})[labels.get("quantile")] = value
    return res


def test_counts_nvidia_ioctls_of_selected_processes_only(tmp_path):
    require_bpf()
    tag = f"rxgpu{os.getpid() % 100000}"
    a, b = Child(f"{tag}a"), Child(f"{tag}b")
    probe = GpuSubmit(Selection(pids=(a.pid,)), node="n1", dev_root=str(gpu_dev(tmp_path / "dev")))
    try:
        status = probe.start()
        assert status.state == OK, status
        assert status.attach_points == ["tracepoint:syscalls:sys_enter_ioctl"]

        elapsed, out = run_round(probe, [a, b])
        rates, gaps = by_pid(out, "gpu_submit_rate_hz"), by_pid(out, "gpu_submit_gap_us")
        assert set(rates) == {a.pid} and set(gaps) == {a.pid}, out
        rate = rates[a.pid][None]
        # Exactly the 'F' ioctls: the 'T' ones and those of b are not counted.
        assert round(rate * elapsed) == CALLS
        assert 1 / GAP_S / 2 <= rate <= 1 / GAP_S * 2
        p50, p99 = gaps[a.pid]["0.5"], gaps[a.pid]["0.99"]
        assert GAP_S * 1e6 / 2 <= p50 <= GAP_S * 1e6 * 2, p50
        assert p99 >= p50

        # Re-select through a map update: now only b counts.
        probe.update_selection(Selection(pids=(b.pid,)))
        elapsed, out = run_round(probe, [a, b])
        rates = by_pid(out, "gpu_submit_rate_hz")
        assert set(rates) == {b.pid}, out
        assert round(rates[b.pid][None] * elapsed) == CALLS
    finally:
        probe.stop()
        a.close()
        b.close()


def test_watches_the_training_processes_not_the_loader_workers(tmp_path):
    """A training process listed in ``Selection.trainers`` is watched, one not
    listed is not, and a DataLoader-worker selection by name selects nothing;
    a new set of training processes is a map update, not a recompile. No GPU
    here: a stand-in /dev (``gpu_dev``) and 'F' ioctls on /dev/null."""
    require_bpf()
    tag = f"rxgpt{os.getpid() % 100000}"
    trainer, other, worker = Child(f"{tag}t"), Child(f"{tag}o"), Child(f"{tag}w")
    selection = Selection(comms=(worker.comm,), trainers=(trainer.pid,))   # as the probe manager hands it
    probe = GpuSubmit(selection, node="n1", dev_root=str(gpu_dev(tmp_path / "dev")))
    try:
        assert probe.start().state == OK
        program = probe.bpf
        elapsed, out = run_round(probe, [trainer, other, worker])
        rates = by_pid(out, "gpu_submit_rate_hz")
        assert set(rates) == {trainer.pid}, out
        assert round(rates[trainer.pid][None] * elapsed) == CALLS
        assert {labels["pid"] for _, labels, _ in out} == {str(trainer.pid)}

        probe.update_selection(replace(selection, trainers=(other.pid,)))   # the next refresh's trainers
        assert probe.bpf is program
        elapsed, out = run_round(probe, [trainer, other, worker])
        rates = by_pid(out, "gpu_submit_rate_hz")
        assert set(rates) == {other.pid}, out
        assert round(rates[other.pid][None] * elapsed) == CALLS
    finally:
        probe.stop()
        for child in (trainer, other, worker):
            child.close()


def test_signals_and_labels_are_catalogued(tmp_path):
    require_bpf()
    child = Child(f"rxgpuc{os.getpid() % 100000}")
    probe = GpuSubmit(Selection(pids=(child.pid,), job="llama"), node="n1", dev_root=str(gpu_dev(tmp_path / "dev")))
    try:
        probe.start()
        _, out = run_round(probe, [child])
    finally:
        probe.stop()
        child.close()
    assert {name for name, _, _ in out} == {spec.name for spec in probe.signals}
    for name, labels, _ in out:
        assert set(labels) <= set(CATALOGUE[name].labels), (name, labels)
        assert labels["job"] == "llama" and labels["node"] == "n1"


def test_a_node_without_a_gpu_attaches_nothing(tmp_path):
    """No /dev/nvidia<N>: nothing to observe, so no syscall tracepoint is paid for."""
    require_bpf()
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").touch()          # a control node alone is not a GPU
    probe = GpuSubmit(Selection(), node="n1", dev_root=str(tmp_path / "dev"))
    try:
        status = probe.start()
        assert status.state == UNSUPPORTED and status.reason.startswith("no GPU"), status
        assert probe.bpf is None and status.attach_points == []
    finally:
        probe.stop()
