"""Targets no actuator may act on, in any mode, against the real /proc: the
host's init, kernel threads (kthreadd, kswapd0), the init of a PID namespace,
the controller itself (its pid, a thread, a child), processes outside the
selector, and a target with no process scope. ``reflexarc act`` refuses each
with exit 1 and one ``error:`` line naming the pid and why; bad labels and
ports are one ``error:`` line too, never an internal error."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import require, require_root, run_cli

from reflexarc.actuators.affinity import AffinityActuator
from reflexarc.actuators.base import Target, TargetRefused
from reflexarc.core.procfs import ProcFS
from reflexarc.core.targets import ProcessGuard, Refusal, pid_label

pytestmark = [pytest.mark.kernel]


def by_comm(name: str) -> int:
    """The pid of a process named ``name`` (a kernel thread here), found in /proc."""
    for entry in sorted(os.listdir("/proc"), key=lambda n: int(n) if n.isdigit() else 0):
        try:
            if entry.isdigit() and Path(f"/proc/{entry}/comm").read_text().strip() == name:
                return int(entry)
        except OSError:
            continue
    require(False, f"a process named {name} in /proc")


def cpus_of(pid: int) -> set[int]:
    return os.sched_getaffinity(pid)


def child_of(parent: int) -> int:
    """The first child of ``parent`` to show up in /proc."""
    procfs = ProcFS()
    deadline = time.monotonic() + 30           # a bound on a broken run, not a timing assertion
    while time.monotonic() < deadline:
        for pid in procfs.pids():
            st = procfs.stat(pid)
            if st is not None and st.ppid == parent:
                return pid
        time.sleep(0.01)
    raise AssertionError(f"pid {parent} started no child")


def act(tmp_path: Path, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return run_cli("--state-dir", str(tmp_path / "state"), "--hook-dir", str(tmp_path / "hooks"), "act", *args,
                   prefix=prefix)


def one_error(r: subprocess.CompletedProcess) -> str:
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 1 and len(errors) == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    return errors[0]


@pytest.fixture
def pidns_init():
    """A process that is pid 1 of its own PID namespace (host pid returned)."""
    require_root()
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "sleep", "600"], start_new_session=True)
    child = child_of(proc.pid)
    assert ProcFS().nspid(child) == [child, 1]
    yield child
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.parametrize("mode", ["dry-run", "enforce"])
def test_act_refuses_init_kernel_threads_and_the_namespace_init(tmp_path, mode, pidns_init):
    kswapd = by_comm("kswapd0")
    before = {pid: cpus_of(pid) for pid in (1, 2, kswapd, pidns_init)}
    init = Path("/proc/1/comm").read_text().strip()
    for pid, comm, words in ((1, init, f"pid 1 ({init}) is init: never a target"),
                             (2, "kthreadd", "pid 2 (kthreadd) is a kernel thread: never a target"),
                             (kswapd, "kswapd0", f"pid {kswapd} (kswapd0) is a kernel thread: never a target"),
                             (pidns_init, "sleep", f"pid {pidns_init} (sleep) is the init of a PID namespace "
                                                   "(pid 1 there): never a target")):
        line = one_error(act(tmp_path, "affinity", "cpus=0", "--label", f"pid={pid}", "--process", comm,
                             "--mode", mode))
        assert line == f"error: affinity: plan: {words}", line
    assert {pid: cpus_of(pid) for pid in before} == before, "nothing was pinned"


def test_act_refuses_a_scope_rooted_at_init_or_a_kernel_thread(tmp_path):
    require_root()
    for pid in (1, 2):
        line = one_error(act(tmp_path, "affinity", "cpus=0", "--pid", str(pid), "--process", "kswapd0",
                             "--mode", "enforce"))
        assert f"pid {pid} (" in line and "never the root of a target's scope" in line, line
    line = one_error(act(tmp_path, "affinity", "cpus=0", "--label", "trainer=1"))
    assert "pid 1 (" in line and "is init" in line, line


def test_act_refuses_the_controller_itself(tmp_path, cli):
    require_root()
    # exec keeps the shell's pid: the controller is named by its own pid
    r = cli("--state-dir", str(tmp_path / "state"), "act", "affinity", "cpus=0", "--mode", "enforce",
            prefix=["sh", "-c", 'exec "$@" --label "pid=$$"', "sh"])
    line = one_error(r)
    assert re.fullmatch(r"error: affinity: plan: pid \d+ \(\S+\) is the controller itself: never a target", line), line


def test_act_refuses_a_target_named_by_a_process_name_alone(tmp_path):
    for actuator, params in (("affinity", ["cpus=0"]), ("framework_hook", ["handler=x"])):
        line = one_error(act(tmp_path, actuator, *params, "--process", "pt_data_worker"))
        assert line.startswith(f"error: {actuator} acts on processes: name the target by --pid PID, --cgroup PATH, "
                               "--job NAME, --label pid=PID or --label trainer=PID")
    line = one_error(act(tmp_path, "affinity", "cpus=0", "--job", "llama"))
    assert "no process scope: comm pt_data_worker would match processes anywhere on the node" in line
    line = one_error(act(tmp_path, "affinity", "cpus=0", "--cgroup", "/"))
    assert "cgroup / is the root cgroup: every process on the node" in line


def test_act_refuses_a_process_outside_the_selector(tmp_path):
    require_root()
    sleeper = subprocess.Popen(["sleep", "600"])
    other = subprocess.Popen(["sleep", "600"])
    try:
        line = one_error(act(tmp_path, "affinity", "cpus=0", "--pid", str(sleeper.pid), "--label",
                             f"pid={other.pid}", "--process", "sleep", "--mode", "enforce"))
        assert f"pid {other.pid} is outside the selector: not below pids {sleeper.pid}" in line, line
    finally:
        for proc in (sleeper, other):
            proc.kill()
            proc.wait()


def test_bad_labels_pids_ports_and_params_are_one_error_line(tmp_path):
    for args, words in ((["affinity", "cpus=0", "--label", "pid=abc"], "label pid='abc' is not a process id"),
                        (["affinity", "cpus=0", "--label", "trainer=-3"], "label trainer='-3' is not a process id"),
                        (["affinity", "cpus=0", "--label", "pid"], "--label 'pid': labels are key=value"),
                        (["affinity", "cpus=0", "--pid", "0"], "--pid 0 is not a process id"),
                        (["affinity", "cpus=0", "--pid", "5", "--port", "abc"], "bad port 'abc'"),
                        (["framework_hook", "handler=x", "args=[1]", "--job", "j"], "[1] is not a valid mapping"),
                        (["framework_hook", "handler=x", "--job", "j", "--label", "rank=abc"], "no hook socket")):
        line = one_error(act(tmp_path, *args))
        assert words in line, (args, line)


# ---- the guard and the actuator, in this process (the test is the controller) ----------------

def test_the_guard_refuses_the_controller_its_threads_and_children():
    require_root()
    guard = ProcessGuard(ProcFS())
    me = os.getpid()
    assert guard.touch(me).reason is Refusal.CONTROLLER and guard.root(me).reason is Refusal.CONTROLLER
    started, stop, tids = threading.Event(), threading.Event(), []

    def run():
        tids.append(threading.get_native_id())
        started.set()
        stop.wait()
    thread = threading.Thread(target=run)
    thread.start()
    started.wait()
    try:
        refused = guard.touch(tids[0])
        assert refused.reason is Refusal.CONTROLLER and refused.pid == tids[0]
        assert refused.message.startswith(f"thread {tids[0]} of pid {me} (")
    finally:
        stop.set()
        thread.join()
    child = subprocess.Popen(["sh", "-c", "sleep 600 & wait"], start_new_session=True)
    try:
        grandchild = child_of(child.pid)
        refused = guard.touch(child.pid)
        assert refused.reason is Refusal.CONTROLLER and "is a child of the controller" in refused.message
        assert guard.touch(grandchild) is None, "a grandchild (a training job's worker) may be a target"
        assert guard.root(child.pid) is None
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    assert guard.touch(2).reason is Refusal.KERNEL_THREAD and guard.touch(1).reason is Refusal.INIT


def test_the_affinity_planner_refuses_with_a_typed_reason():
    require_root()
    act_ = AffinityActuator(proc_root="/proc", sys_root="/sys")
    child = subprocess.Popen(["sleep", "600"])
    try:
        for target, reason, pid in ((Target({"pid": "1"}), Refusal.INIT, 1),
                                    (Target({"pid": "2"}), Refusal.KERNEL_THREAD, 2),
                                    (Target({"pid": str(os.getpid())}), Refusal.CONTROLLER, os.getpid()),
                                    (Target({"pid": str(child.pid)}, {"processes": ["sleep"]}), Refusal.CONTROLLER,
                                     child.pid),
                                    (Target(selector={"pids": [os.getpid()], "processes": ["sleep"]}),
                                     Refusal.CONTROLLER, os.getpid()),
                                    (Target(selector={"processes": ["sleep"]}), Refusal.UNSCOPED, None)):
            with pytest.raises(TargetRefused) as refused:
                act_.plan(target, {"cpus": [0]})
            assert (refused.value.reason, refused.value.pid) == (reason, pid), refused.value
    finally:
        child.kill()
        child.wait()


def test_a_pid_label_is_a_whole_number_above_zero():
    assert pid_label({"pid": "812"}, "pid") == 812 and pid_label({}, "pid") is None
    assert pid_label({"trainer": ""}, "trainer") is None
    for bad in ("abc", "0", "-1", "1.5", "0x10"):
        with pytest.raises(ValueError, match="is not a process id"):
            pid_label({"pid": bad}, "pid")
