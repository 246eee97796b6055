"""A controller killed right after an apply, then restarted: the restart
reconciles the journal and reverts the change on the real system. Tested for
the affinity re-pin (real threads) and the tc-BPF DSCP retag (a real veth in a
real network namespace). The kill comes from the executor's fault-injection
point (``REFLEXARC_FAULT_INJECT=after-apply``: SIGKILL right after the journal
says ``applied``)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, allowed, require, require_bpf, require_root, run_cli, two_node_sys
from netns import NetnsPair
import pytest

pytestmark = [pytest.mark.kernel, pytest.mark.netns]

WORKER = str(ROOT / "tests" / "workloads" / "idle_worker.py")


def crash_then_restart(base: list[str], act_args: list[str]) -> None:
    r = run_cli(*base, "act", *act_args, "--mode", "enforce",
                env={**os.environ, "REFLEXARC_FAULT_INJECT": "after-apply"})
    assert r.returncode == -signal.SIGKILL, r.stderr


def restart(base: list[str], tmp: Path) -> None:
    r = run_cli(*base, "run", "--no-probes", "--duration", "0", "--kill-switch", str(tmp / "off"))
    assert r.returncode == 0, r.stderr
    listed = run_cli(*base, "journal", timeout=60)
    assert listed.stdout.strip() == "", "nothing left open in the journal"


def test_affinity_reverted_after_crash(tmp_path):
    require_root()
    require(len(os.sched_getaffinity(0)) >= 2, "at least two CPUs")
    sysroot = two_node_sys(tmp_path / "sys")
    base = ["--state-dir", str(tmp_path / "state"), "--sys-root", str(sysroot), "--hook-dir", str(tmp_path / "hooks")]
    w = subprocess.Popen([sys.executable, WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert w.stdout.readline().strip() == "ready"
        before = allowed(w.pid)
        assert before == {"0-1"} or len(before) == 1
        crash_then_restart(base, ["affinity", "node=1", "--pid", str(os.getpid()), "--label", f"pid={w.pid}"])
        assert allowed(w.pid) == {"1"}, "applied to every thread before the kill"
        restart(base, tmp_path)
        assert allowed(w.pid) == before
    finally:
        w.stdin.close()
        w.wait(timeout=30)


def tc_state(pair: NetnsPair) -> str:
    q = pair.run("a", "tc", "qdisc", "show", "dev", pair.if_a).stdout
    f = pair.run("a", "tc", "filter", "show", "dev", pair.if_a, "egress").stdout
    return q + f


def test_dscp_reverted_after_crash(tmp_path):
    require_bpf()
    base = ["--state-dir", str(tmp_path / "state"), "--hook-dir", str(tmp_path / "hooks")]
    with NetnsPair("crash") as pair:
        before = tc_state(pair)
        crash_then_restart(base, ["dscp", "dscp=EF", f"interfaces={pair.if_a}", f"netns={pair.ns_a}",
                                  "ports=5201", "protocol=udp"])
        during = tc_state(pair)
        assert "clsact" in during and "bpf" in during, during
        restart(base, tmp_path)
        assert tc_state(pair) == before
