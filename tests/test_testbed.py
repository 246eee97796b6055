"""The real-world testbed, for real: namespaces behind a DSCP-aware switch
bottleneck, the object store, a two-rank PyTorch job (gloo, DDP) and its
``dataloader.prefetch`` hook.

1. Teardown leaves nothing with the prefix (namespace, link, cgroup, process,
   work directory): after a normal run with fault processes still running,
   after ``up()`` fails half-way, and after the CLI gets SIGINT or SIGTERM
   mid-run.
2. The switch queues by DSCP: an unmarked bulk upload from rank 0 slows the
   collective, the same upload pre-marked CS1 lands in the scavenger class and
   does not.
3. The prefetch hook, called through reflexarc's framework-hook actuator,
   changes the running job's DataLoader from 2 to 8 workers (in the JSON lines
   and in the rank's cgroup), which lowers the batch wait under store latency;
   its undo brings 2 workers back.
4. Checkpoints pause every rank: rank 0 writes while rank 1 waits at a barrier.

Ratios are asserted coarsely (measured here: baseline ~185 ms, unmarked bulk
~2.3-3.5x, CS1 bulk ~1.05x); the whole file takes about 95 s.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, require, require_root

from reflexarc.actuators.base import Target
from reflexarc.actuators.framework_hook import FrameworkHookActuator
import reflexarc.simulations.testbed as testbed
from reflexarc.simulations.testbed import BulkUpload, CpuHog, StoreLatency, residue, sweep
from reflexarc.simulations.testbed.procs import cgroup2_root
from reflexarc.simulations.testbed.store import control

pytestmark = [pytest.mark.kernel, pytest.mark.testbed, pytest.mark.slow]


def require_testbed() -> None:
    require_root()
    require(bool(shutil.which("ip") and shutil.which("tc")), "ip and tc (iproute2)")
    require(any(" - cgroup2 " in line for line in Path("/proc/self/mountinfo").read_text().splitlines()),
            "a mounted cgroup2 hierarchy")
    require(importlib.util.find_spec("torch") is not None, "torch (pip install torch==2.13.0)")


def prefix(tag: str) -> str:
    """A prefix unique to this test run, e.g. ``rxta4242``."""
    return f"rxt{tag}{os.getpid() % 10000}"


@pytest.fixture
def fresh():
    """Hands out prefixes and sweeps each one afterwards, whatever the test did."""
    made = []

    def make(tag: str) -> str:
        made.append(prefix(tag))
        return made[-1]
    yield make
    for p in made:
        sweep(p)


def window(job, seconds: float, skip: float = 2.0) -> tuple[float, float]:
    """Sleep ``seconds``; the window's [t0, t1] without its first ``skip`` seconds."""
    start = time.time()
    time.sleep(seconds)
    return start + skip, time.time()


def test_down_removes_everything_even_running_faults(fresh):
    require_testbed()
    p = fresh("a")
    with testbed.Testbed(prefix=p) as tb:
        assert {f"{p}r0", f"{p}r1", f"{p}sw", f"{p}sp", f"{p}st"} <= {line.split()[0] for line in
                                                                     subprocess.run(["ip", "netns", "list"],
                                                                                    capture_output=True, text=True)
                                                                     .stdout.splitlines()}
        assert control(tb.store_control)["mode"] == "normal"
        fetched = subprocess.run(["ip", "netns", "exec", tb.rank_netns(0), sys.executable, "-c",
                                  f"import urllib.request; print(len(urllib.request.urlopen('{tb.store_url}/item/7')"
                                  ".read()))"], capture_output=True, text=True, timeout=30)
        assert fetched.stdout.strip() == str(64 * 1024), fetched.stderr
        BulkUpload(tb).start()            # left running on purpose: down() must end them
        CpuHog(tb, 0).start()
        assert any(r.startswith("pid ") for r in residue(p))
    assert residue(p) == []


@pytest.mark.parametrize("where", ["netns", "cgroup"])
def test_up_failing_half_way_leaves_nothing(fresh, where):
    """A name already taken makes up() fail: at the store's namespace (after
    four namespaces exist) or at the cgroup (after the whole network and its
    qdiscs exist). Names with the prefix belong to the testbed, so the
    teardown removes the squatter too."""
    require_testbed()
    p = fresh("h" if where == "netns" else "c")
    if where == "netns":
        subprocess.run(["ip", "netns", "add", f"{p}st"], check=True)
    else:
        (cgroup2_root() / p).mkdir()
    tb = testbed.Testbed(prefix=p)
    with pytest.raises(testbed.TestbedError, match="exists"):
        tb.up()
    assert residue(p) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_cli_signal_mid_run_tears_down(fresh, sig):
    require_testbed()
    p = fresh("d" if sig == signal.SIGINT else "t")
    cli = subprocess.Popen([sys.executable, "-m", "reflexarc.simulations.testbed", "smoke", "--prefix", p,
                            "--baseline", "60", "--fault", "30"], cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        job = None
        deadline = time.monotonic() + 120
        while job is None and time.monotonic() < deadline:
            line = cli.stdout.readline()
            if not line:
                break
            event = json.loads(line)
            if event["event"] == "job":
                job = event
        assert job is not None, cli.stderr.read() if cli.poll() is not None else "no job line"
        for rank in job["ranks"]:         # each rank runs in its own cgroup v2 directory
            assert f"0::/{rank['cgroup']}\n" in Path(f"/proc/{rank['pid']}/cgroup").read_text()
            assert (cgroup2_root() / rank["cgroup"]).stat().st_ino == rank["cgroup_id"]
        time.sleep(3)
        cli.send_signal(sig)
        _, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 128 + sig
    assert [line for line in err.splitlines() if line.strip()] == \
        [f"error: interrupted by {sig.name}; the testbed was torn down"]
    assert residue(p) == []


def test_cli_errors_are_one_line():
    done = subprocess.run([sys.executable, "-m", "reflexarc.simulations.testbed", "down", "--prefix",
                           prefix("e")], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("error: no testbed")


def test_switch_queues_by_dscp(fresh):
    """The collective alone, then beside an unmarked bulk upload through the same
    switch egress, then beside the same upload pre-marked CS1."""
    require_testbed()
    with testbed.Testbed(prefix=fresh("f")) as tb:
        job = tb.start_job()
        time.sleep(5)                                      # workers up, TCP warm
        base = job.median_step_ms(*window(job, 12))
        unmarked = BulkUpload(tb)
        unmarked.start()
        plain = job.median_step_ms(*window(job, 12, skip=3))
        unmarked.stop()
        time.sleep(3)
        before = tb.class_stats()["1:30"]["bytes"]
        marked = BulkUpload(tb, tos=0x20)
        marked.start()
        cs1 = job.median_step_ms(*window(job, 12, skip=3))
        marked.stop()
        scavenged = tb.class_stats()["1:30"]["bytes"] - before
        job.stop()
    print(f"step ms: baseline {base:.0f}, unmarked bulk {plain:.0f}, CS1 bulk {cs1:.0f}")
    assert 100 < base < 400, "the all-reduce through 200 mbit takes ~170 ms"
    assert plain >= 1.3 * base
    assert cs1 <= 1.2 * base
    assert scavenged > 10**7, "the CS1 upload went through the scavenger class 1:30"


def worker_processes(cgroup: str) -> int:
    """DataLoader worker processes in a cgroup v2 directory."""
    count = 0
    for pid in (cgroup2_root() / cgroup / "cgroup.procs").read_text().split():
        try:
            count += Path(f"/proc/{pid}/comm").read_text().strip() == "pt_data_worker"
        except OSError:
            continue
    return count


def eventually(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def test_prefetch_hook_changes_the_running_job(fresh):
    require_testbed()
    with testbed.Testbed(prefix=fresh("g")) as tb:
        job = tb.start_job()
        rank0 = job.ranks[0]
        assert eventually(lambda: worker_processes(rank0.cgroup) == 2)
        StoreLatency(tb, 50).start()
        t0, t1 = window(job, 12, skip=3)
        starved = job.mean_wait_ms(t0, t1)
        assert {s["workers"] for s in job.steps(t0, t1)} == {2}

        act = FrameworkHookActuator(hook_dir=str(tb.hook_dir))
        change = act.plan(Target({"job": job.name}), {"handler": "dataloader.prefetch",
                                                       "args": {"prefetch_factor": 8, "num_workers": 8}})
        assert [ep["state"] for ep in change.before["endpoints"]] == [{"prefetch_factor": 2, "num_workers": 2}] * 2
        act.apply(change)
        applied = time.time()
        assert eventually(lambda: worker_processes(rank0.cgroup) == 8)
        t0, t1 = window(job, 12, skip=3)
        fed = job.mean_wait_ms(t0, t1)
        assert {s["workers"] for s in job.steps(t0, t1)} == {8}
        assert [s["workers"] for s in job.steps(applied, rank=0)][-1] == 8

        act.revert(change)
        undone = time.time()
        assert eventually(lambda: worker_processes(rank0.cgroup) == 2)
        time.sleep(2)
        assert [s["workers"] for s in job.steps(undone, rank=0)][-1] == 2
        job.stop()
    print(f"batch wait ms under 50 ms store latency: 2 workers {starved:.0f}, 8 workers {fed:.0f}")
    assert starved > 80, "50 ms per item starves 2 workers"
    assert fed < 0.5 * starved


def test_checkpoints_pause_every_rank(fresh):
    """``checkpoint_every``: rank 0 writes and fsyncs a checkpoint every N steps
    while rank 1 waits for it at a barrier, so the step after each checkpoint
    is long on both ranks (the natural jitter of the no-fault run)."""
    require_testbed()
    with testbed.Testbed(prefix=fresh("k")) as tb:
        job = tb.start_job(steps=25, hooks=False, checkpoint_every=10)
        assert job.wait(timeout=180) == [0, 0]
        marks = {r: job.checkpoints(rank=r) for r in (0, 1)}
        steps = {r: {s["step"]: s for s in job.steps(rank=r)} for r in (0, 1)}
    print({r: [c["ms"] for c in marks[r]] for r in marks})
    for r in (0, 1):
        assert [c["step"] for c in marks[r]] == [10, 20], marks[r]
        for c in marks[r]:
            after = steps[r][c["step"] + 1]
            assert after["step_ms"] >= c["ms"], (r, c, after)          # the pause is in the next step
    for mine, other in zip(marks[0], marks[1]):
        assert other["ms"] >= 0.5 * mine["ms"], (mine, other)         # rank 1 waited for rank 0's write
    typical = sorted(s["step_ms"] for s in steps[0].values())[len(steps[0]) // 2]
    assert all(steps[0][c["step"] + 1]["step_ms"] > 2 * typical for c in marks[0]), (typical, marks[0])
