"""The affinity actuator against real processes: workers named ``pt_data_worker``
(prctl PR_SET_NAME) with several threads of different masks, and a real PyTorch
DataLoader. The NUMA topology is a fixture sysfs tree ``{node0: cpu0, node1: cpu1}``:
this machine has one node. The locality choice reads fixture ``numa_maps`` and
device links against a two-node fixture sysfs, and once this machine's own
(one node: node 0, from the training process's real numa_maps)."""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ROOT, require, require_root, two_node_sys

from reflexarc.actuators.affinity import AffinityActuator, numa_memory
from reflexarc.actuators.base import Change, PermanentActuatorError, Target
from reflexarc.core.cpus import format_cpulist
from reflexarc.core.procfs import ProcFS

pytestmark = [pytest.mark.kernel]

# A job's main process: forks workers on request. Each worker names itself
# pt_data_worker, gives its main thread and each extra thread its own mask, prints
# each thread's id and mask, and starts one more thread (inheriting the main thread's mask) on
# SIGUSR1.
JOB = textwrap.dedent(r"""
    import ctypes, json, os, signal, sys, threading
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    libc = ctypes.CDLL(None, use_errno=True)

    def say(obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    def hold(mask, barrier, tids):
        if mask is not None:
            os.sched_setaffinity(0, mask)
        tids.append([threading.get_native_id(), sorted(os.sched_getaffinity(0))])
        if barrier is not None:
            barrier.wait()
        threading.Event().wait()

    def worker(masks):
        libc.prctl(15, b"pt_data_worker", 0, 0, 0)
        os.sched_setaffinity(0, masks[0])
        barrier, tids = threading.Barrier(len(masks)), []
        for mask in masks[1:]:
            threading.Thread(target=hold, args=(mask, barrier, tids), daemon=True).start()
        barrier.wait()
        def more(*_):
            extra = []
            t = threading.Thread(target=hold, args=(None, None, extra), daemon=True)
            t.start()
            while not extra:
                pass
            say({"pid": os.getpid(), "new_thread": extra[0][0]})
        signal.signal(signal.SIGUSR1, more)
        tids.append([threading.get_native_id(), sorted(os.sched_getaffinity(0))])
        say({"pid": os.getpid(), "masks": tids})
        while True:
            signal.pause()

    say({"job": os.getpid()})
    for line in sys.stdin:
        masks = json.loads(line)
        if os.fork() == 0:
            try:
                worker(masks)
            finally:
                os._exit(0)
""")

LOADER = textwrap.dedent(r"""
    import json, os, sys
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Squares(Dataset):
        def __len__(self):
            return 4096
        def __getitem__(self, i):
            return torch.tensor([float(i), float(i * i)])

    os.sched_setaffinity(0, {0, 1})
    loader = DataLoader(Squares(), batch_size=8, num_workers=2, persistent_workers=True)
    batches = iter(loader)
    first = next(batches)
    print(json.dumps({"pid": os.getpid(), "first": first[:, 1].tolist()}), flush=True)
    sys.stdin.read()
""")


def read_line(proc: subprocess.Popen, bound: float = 60.0) -> dict:
    ready, _, _ = select.select([proc.stdout], [], [], bound)
    assert ready, f"no output from pid {proc.pid} within {bound}s"
    line = proc.stdout.readline()
    assert line, f"pid {proc.pid} closed its output (exit {proc.poll()})"
    return json.loads(line)


def allowed(pid: int, tid: int) -> str:
    for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split()[1]
    raise AssertionError(f"no Cpus_allowed_list for {pid}/{tid}")


def all_threads(pid: int) -> list[int]:
    return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))


class Job:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", JOB], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.pid = read_line(self.proc)["job"]

    def spawn(self, *masks: set[int]) -> dict:
        """A worker whose main thread has masks[0] and one extra thread per further mask;
        returns its pid, thread ids and each thread's own mask as the thread read it."""
        self.proc.stdin.write(json.dumps([sorted(m) for m in masks]) + "\n")
        self.proc.stdin.flush()
        info = read_line(self.proc)
        info["masks"] = {tid: format_cpulist(mask) for tid, mask in info["masks"]}
        info["threads"] = sorted(info["masks"])
        assert sorted(info["masks"].values()) == sorted(format_cpulist(m) for m in masks)
        return info

    def new_thread(self, pid: int) -> int:
        os.kill(pid, signal.SIGUSR1)
        return read_line(self.proc)["new_thread"]

    def target(self) -> Target:
        return Target(labels={"job": "llama"}, selector={"job": "llama", "pids": [self.pid]})

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


@pytest.fixture
def sys_root(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    for node, cpus in (("node0", "0"), ("node1", "1")):
        (root / "devices/system/node" / node).mkdir(parents=True)
        (root / "devices/system/node" / node / "cpulist").write_text(cpus + "\n")
    (root / "devices/system/cpu").mkdir(parents=True)
    (root / "devices/system/cpu/online").write_text("0-1\n")
    for addr, node in (("0000:3b:00.0", "1"), ("0000:5e:00.0", "-1")):
        (root / "bus/pci/devices" / addr).mkdir(parents=True)
        (root / "bus/pci/devices" / addr / "numa_node").write_text(node + "\n")
    return root


@pytest.fixture
def act(sys_root: Path) -> AffinityActuator:
    return AffinityActuator(proc_root="/proc", sys_root=str(sys_root))


@pytest.fixture
def job():
    require_root()
    require(len(os.sched_getaffinity(0)) >= 2 and {0, 1} <= os.sched_getaffinity(0), "CPUs 0 and 1 usable")
    j = Job()
    yield j
    j.close()


def journal_roundtrip(change: Change) -> Change:
    return Change.from_dict(json.loads(json.dumps(change.to_dict())))


def fake_proc(root: Path, pid: int, comm: str, ppid: int, cgroup: str, tids=(), start: int = 5000) -> None:
    """One process in a fixture proc tree: stat (with start time), comm, cgroup, tasks."""
    stat = f"{pid} ({comm}) S {ppid} " + " ".join(["0"] * 17) + f" {start} 0 0\n"
    for tid in (pid, *tids):
        task = root / str(pid) / "task" / str(tid)
        task.mkdir(parents=True)
        (task / "stat").write_text(stat.replace(f"{pid} (", f"{tid} (", 1))
        status = root / str(tid) / "status"          # /proc/<tid> resolves any thread id
        status.parent.mkdir(parents=True, exist_ok=True)
        status.write_text(f"Name:\t{comm}\nTgid:\t{pid}\nPid:\t{tid}\n")
    (root / str(pid) / "stat").write_text(stat)
    (root / str(pid) / "comm").write_text(comm + "\n")
    (root / str(pid) / "cgroup").write_text(cgroup)


def test_cpus_come_from_node_device_or_list(act):
    assert act.target_cpus({"node": 1}) == ([1], "node 1")
    assert act.target_cpus({"device": "3b:00.0"}) == ([1], "node 1 of 3b:00.0")
    assert act.target_cpus({"cpus": [1, 0], "reserved_cpus": [0]})[0] == [1]
    for bad, words in (({"device": "0000:5e:00.0"}, "numa_node -1"), ({"node": 7}, "no NUMA node 7"),
                       ({"device": "0000:aa:00.0"}, "no PCI device"), ({"device": "../../x"}, "not a PCI"),
                       ({"node": 0, "reserved_cpus": [0]}, "no CPU left"), ({"cpus": [5]}, "not online"),
                       ({"node": 0, "cpus": [1]}, "exactly one"), ({}, "exactly one"),
                       ({"node": 0, "locality": True}, "exactly one"), ({"locality": False}, "got none")):
        with pytest.raises(PermanentActuatorError, match=words):
            act.target_cpus(bad)


GIB_4K_PAGES = 262144      # 1 GiB in 4 KiB pages


def numa_maps(proc: Path, pid: int, *lines: str) -> None:
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "numa_maps").write_text("".join(line + "\n" for line in lines))


@pytest.fixture
def two_nodes(tmp_path: Path) -> tuple[AffinityActuator, Path, Path]:
    """An actuator over a two-node fixture sysfs and a fixture /proc (whose
    numa_maps the tests write), with those roots."""
    sys_root, proc = two_node_sys(tmp_path / "sys"), tmp_path / "proc"
    proc.mkdir()
    return AffinityActuator(proc_root=str(proc), sys_root=str(sys_root)), sys_root, proc


def test_numa_maps_sums_pages_per_node_by_page_size(tmp_path):
    numa_maps(tmp_path, 1,
              "55d0c0a00000 default file=/usr/bin/python3.11 mapped=700 mapmax=3 N0=700 kernelpagesize_kB=4",
              "7f3a40000000 default anon=393216 dirty=393216 N0=131072 N1=262144 kernelpagesize_kB=4",
              "7f2a00000000 default file=/dev/hugepages/buf huge dirty=3 N1=3 kernelpagesize_kB=2048",
              "7ffd1c3e0000 default stack anon=33 dirty=33 kernelpagesize_kB=4")    # no page resident on a node
    assert numa_memory(tmp_path / "1" / "numa_maps") == {0: (700 + 131072) * 4096,
                                                         1: 262144 * 4096 + 3 * 2048 * 1024}
    with pytest.raises(OSError):
        numa_memory(tmp_path / "2" / "numa_maps")


def test_locality_chooses_the_node_holding_most_of_the_training_processs_memory(two_nodes):
    act, _, proc = two_nodes
    numa_maps(proc, 4242, f"7f3a40000000 default anon=1 N0={GIB_4K_PAGES} N1={3 * GIB_4K_PAGES} kernelpagesize_kB=4")
    by_trainer = Target({"trainer": "4242"}, {"processes": ["pt_data_worker"]})
    assert act.target_cpus({"locality": True}, by_trainer) == (
        [1], "node 1, holding 75% of the memory of training process 4242 (numa_maps: node 0 1.0 GiB, node 1 3.0 GiB)")

    # Huge pages count by their size: 2 GiB of 2 MiB pages on node 0 tip it there.
    numa_maps(proc, 4243, f"7f3a40000000 default anon=1 N1={GIB_4K_PAGES} kernelpagesize_kB=4",
              "7f2a00000000 default file=/dev/hugepages/b huge N0=1024 kernelpagesize_kB=2048")
    cpus, where = act.target_cpus({"locality": True}, Target(selector={"pids": [4243, 4242]}))
    assert cpus == [1] and where.startswith("node 1, holding 57% of the memory of processes 4243, 4242 ")
    assert act.local_node(Target(selector={"pids": [4243]}))[0] == 0


def test_locality_prefers_a_device_the_job_uses(two_nodes):
    """A NIC the job sends on, whose PCI function sysfs places on node 1, wins
    over memory on node 0; a virtual interface (no device) does not count."""
    act, sys_root, proc = two_nodes
    numa_maps(proc, 4242, f"7f3a40000000 default anon=1 N0={GIB_4K_PAGES} kernelpagesize_kB=4")
    nic = sys_root / "devices" / "pci0000:3a" / "0000:3a:00.0" / "0000:3b:00.0"
    (nic / "net" / "ens1f0").mkdir(parents=True)
    (nic / "numa_node").write_text("1\n")
    (sys_root / "class" / "net").mkdir(parents=True)
    (sys_root / "class" / "net" / "ens1f0").mkdir()
    (sys_root / "class" / "net" / "ens1f0" / "device").symlink_to(nic)
    (sys_root / "class" / "net" / "veth0").mkdir()
    by_trainer = {"trainer": "4242"}
    assert act.target_cpus({"locality": True}, Target(by_trainer, {"interfaces": ["veth0", "ens1f0"]})) == (
        [1], "node 1, that of network interface ens1f0, which the job sends on")
    assert act.local_node(Target({**by_trainer, "iface": "veth0"}))[0] == 0          # memory, then
    assert act.local_node(Target({**by_trainer, "dev": "../net/ens1f0"}))[0] == 0    # not a device name
    (nic / "numa_node").write_text("-1\n")                                           # no affinity given
    assert act.local_node(Target(by_trainer, {"interfaces": ["ens1f0"]}))[0] == 0


def test_locality_without_a_device_or_readable_memory_is_permanent(two_nodes):
    act, _, _ = two_nodes
    for target, words in ((Target({"pid": "77"}), "no training process"),
                          (Target({"trainer": "4242"}), r"cannot read .*/proc/4242/numa_maps"),
                          (None, "chosen for a target")):
        with pytest.raises(PermanentActuatorError, match=words):
            act.target_cpus({"locality": True}, target)


def test_locality_on_this_machine_plans_node_0_and_says_why(job):
    """This machine has one NUMA node: the training process's memory is all on
    node 0, and the plan (what dry-run shows) says so."""
    act = AffinityActuator()
    job.spawn({0, 1})
    change = act.plan(trainer_target(job), {"locality": True})
    assert change.after["cpus"] == sorted(os.sched_getaffinity(0)) == [0, 1]
    assert f"to CPUs 0-1 (node 0, holding 100% of the memory of training process {job.pid} (numa_maps: node 0 " \
        in change.summary, change.summary
    assert change.params == {"locality": True}


def test_pins_every_thread_and_reverts_each_own_mask(act, job):
    workers = [job.spawn({0, 1}, {0}, {1}), job.spawn({0}, {0, 1}, {0})]
    job_mask = allowed(job.pid, job.pid)
    change = act.plan(job.target(), {"node": 1})
    assert sorted(p["pid"] for p in change.before["processes"]) == sorted(w["pid"] for w in workers)
    assert change.before["cpus"] is None and change.after["cpus"] == [1] and not change.noop
    for w in workers:
        assert all(allowed(w["pid"], tid) == mask for tid, mask in w["masks"].items()), "plan must not write"

    act.apply(change)
    for w in workers:
        assert all_threads(w["pid"]) == sorted(w["threads"])
        assert {allowed(w["pid"], tid) for tid in w["threads"]} == {"1"}
    assert allowed(job.pid, job.pid) == job_mask, "the job's main process is not a worker"
    assert act.plan(job.target(), {"node": 1}).noop

    act.revert(journal_roundtrip(change))
    for w in workers:
        assert {tid: allowed(w["pid"], tid) for tid in w["threads"]} == w["masks"]
    act.revert(change)   # idempotent
    for w in workers:
        assert {tid: allowed(w["pid"], tid) for tid in w["threads"]} == w["masks"]


def test_a_thread_started_between_plan_and_apply_is_pinned_and_reverted(act, job):
    """A DataLoader worker may start a thread after the plan was read: apply pins
    it too, and revert gives it the process's original mask."""
    w = job.spawn({0, 1})
    change = act.plan(job.target(), {"node": 1})
    late = job.new_thread(w["pid"])
    assert late not in w["threads"] and allowed(w["pid"], late) == "0-1"
    act.apply(change)
    assert {allowed(w["pid"], tid) for tid in all_threads(w["pid"])} == {"1"}
    act.revert(journal_roundtrip(change))
    assert {allowed(w["pid"], tid) for tid in all_threads(w["pid"])} == {"0-1"}


def test_single_worker_from_pid_label(act, job):
    one, other = job.spawn({0, 1}, {0, 1}), job.spawn({0, 1}, {0, 1})
    target = Target(labels={"pid": str(one["threads"][1])}, selector={"pids": [job.pid]})
    change = act.plan(target, {"device": "0000:3b:00.0"})
    assert [p["pid"] for p in change.before["processes"]] == [one["pid"]]
    act.apply(change)
    assert {allowed(one["pid"], t) for t in one["threads"]} == {"1"}
    assert {allowed(other["pid"], t) for t in other["threads"]} == {"0-1"}
    act.revert(change)
    assert {allowed(one["pid"], t) for t in one["threads"]} == {"0-1"}


def test_no_matching_process_is_permanent(act, job):
    with pytest.raises(PermanentActuatorError, match="no process matches comm pt_data_worker below pids"):
        act.plan(job.target(), {"node": 0})


def test_revert_never_touches_a_reused_pid(act, job):
    reused, kept = job.spawn({0}, {0}), job.spawn({0}, {0})
    change = act.plan(job.target(), {"node": 1})
    act.apply(change)
    record = journal_roundtrip(change)
    for proc in record.before["processes"]:
        if proc["pid"] == reused["pid"]:
            proc["start"] += 1      # as if the pid now named a process started later
    act.revert(record)
    assert {allowed(reused["pid"], t) for t in reused["threads"]} == {"1"}
    assert {allowed(kept["pid"], t) for t in kept["threads"]} == {"0"}


def test_revert_tolerates_exited_targets(act, job):
    gone, kept = job.spawn({0}, {0, 1}), job.spawn({0}, {0, 1})
    change = act.plan(job.target(), {"node": 1})
    act.apply(change)
    os.kill(gone["pid"], signal.SIGKILL)
    while Path(f"/proc/{gone['pid']}").exists():   # the job ignores SIGCHLD: the kernel reaps it
        select.select([], [], [], 0.01)
    act.revert(change)
    assert {tid: allowed(kept["pid"], tid) for tid in kept["threads"]} == kept["masks"]


def test_refresh_pins_new_workers_and_threads(act, job):
    first = job.spawn({0, 1}, {1})
    change = act.plan(job.target(), {"node": 0})
    act.apply(change)
    assert act.refresh(change) is None

    late = job.spawn({1}, {0, 1}, {1})
    extra_tid = job.new_thread(first["pid"])          # inherits the pinned mask
    assert allowed(first["pid"], extra_tid) == "0"
    assert {allowed(late["pid"], t) for t in late["threads"]} != {"0"}

    grown = act.refresh(change)
    assert grown is not None
    assert {allowed(late["pid"], t) for t in late["threads"]} == {"0"}
    recorded = {p["pid"]: {t["tid"]: format_cpulist(t["cpus"]) for t in p["threads"]}
                for p in grown.before["processes"]}
    assert recorded[late["pid"]] == late["masks"]
    assert recorded[first["pid"]][extra_tid] == "0-1", "an inherited mask reverts to the process's original"
    assert act.refresh(grown) is None

    act.revert(journal_roundtrip(grown))
    assert {tid: allowed(late["pid"], tid) for tid in late["threads"]} == late["masks"]
    assert {tid: allowed(first["pid"], tid) for tid in first["threads"]} == first["masks"]
    assert allowed(first["pid"], extra_tid) == "0-1"


def test_revert_restores_threads_born_after_the_last_refresh(act, job):
    first = job.spawn({0, 1}, {1})
    change = act.plan(job.target(), {"node": 0})
    act.apply(change)
    extra_tid = job.new_thread(first["pid"])          # inherits the pinned mask; no refresh since
    assert allowed(first["pid"], extra_tid) == "0"
    act.revert(journal_roundtrip(change))
    assert {tid: allowed(first["pid"], tid) for tid in first["threads"]} == first["masks"]
    assert allowed(first["pid"], extra_tid) == "0-1", "back to the process's original mask"


def trainer_target(job: Job) -> Target:
    """A target as the DataLoader policy makes it: grouped by training process."""
    return Target(labels={"trainer": str(job.pid)}, selector={"processes": ["pt_data_worker"]})


def end(pid: int) -> None:
    """Kill a worker and wait until it is gone (the job ignores SIGCHLD: the kernel reaps it)."""
    os.kill(pid, signal.SIGKILL)
    while Path(f"/proc/{pid}").exists():
        select.select([], [], [], 0.01)


def test_target_by_trainer_follows_the_workers_of_each_epoch(act, job):
    first = job.spawn({0, 1}, {1})
    change = act.plan(trainer_target(job), {"node": 0})
    trainer = {"pid": job.pid, "start": ProcFS().start_time(job.pid),
               "comm": Path(f"/proc/{job.pid}/comm").read_text().strip()}
    assert change.before["trainer"] == change.after["trainer"] == trainer
    assert [p["pid"] for p in change.before["processes"]] == [first["pid"]]
    assert f"DataLoader workers of training process {job.pid} (python" in change.summary, change.summary
    assert f"pids {first['pid']})" in change.summary and "new workers as they start" in change.summary
    act.apply(change)
    assert {allowed(first["pid"], t) for t in first["threads"]} == {"0"}

    end(first["pid"])                          # the epoch is over; the next one starts new workers
    second = [job.spawn({0, 1}, {1}), job.spawn({1}, {0, 1})]
    grown = act.refresh(journal_roundtrip(change))
    assert grown is not None and grown.before["trainer"] == grown.after["trainer"] == trainer
    assert sorted(p["pid"] for p in grown.before["processes"]) == sorted(w["pid"] for w in second)
    for w in second:
        assert {allowed(w["pid"], t) for t in w["threads"]} == {"0"}
    assert allowed(job.pid, job.pid) == "0-1", "the training process itself is not a worker"
    assert act.refresh(grown) is None

    act.revert(journal_roundtrip(grown))
    for w in second:
        assert {tid: allowed(w["pid"], tid) for tid in w["threads"]} == w["masks"]


def test_target_by_trainer_between_epochs_pins_the_next_workers(act, job):
    change = act.plan(trainer_target(job), {"cpus": [1]})
    assert change.before["processes"] == [] and "no worker running now" in change.summary, change.summary
    act.apply(change)
    late = job.spawn({0, 1}, {0, 1})
    grown = act.refresh(change)
    assert [p["pid"] for p in grown.before["processes"]] == [late["pid"]]
    assert {allowed(late["pid"], t) for t in late["threads"]} == {"1"}
    act.revert(grown)
    assert {allowed(late["pid"], t) for t in late["threads"]} == {"0-1"}


def test_a_reused_trainer_pid_is_never_followed(act, job):
    worker = job.spawn({0, 1})
    change = act.plan(trainer_target(job), {"node": 1})

    def reused() -> Change:
        record = journal_roundtrip(change)
        for side in (record.before, record.after):
            side["trainer"]["start"] += 1      # as if the pid now named a process started later
        return record

    with pytest.raises(PermanentActuatorError, match=f"training process {job.pid} .*no longer the process"):
        act.apply(reused())
    assert {allowed(worker["pid"], t) for t in worker["threads"]} == {"0-1"}, "refused: nothing touched"

    act.apply(change)
    late = job.spawn({0, 1})
    assert act.refresh(reused()) is None
    assert {allowed(late["pid"], t) for t in late["threads"]} == {"0-1"}, "a reused trainer's workers are not its"
    act.revert(reused())
    assert {allowed(worker["pid"], t) for t in worker["threads"]} == {"0-1"}, "the recorded workers are restored"


def test_trainer_targets_that_are_refused(act, job):
    job.spawn({0, 1})
    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                            capture_output=True, text=True, check=True)
    dead = int(exited.stdout)
    for labels, selector, words in (
            ({"trainer": str(dead)}, {}, f"training process {dead} is not running"),
            ({"trainer": "1"}, {}, r"pid 1 \(.*\) is init: never the root of a target's scope"),
            ({"trainer": str(job.pid)}, {"pids": [dead]}, f"training process {job.pid} is outside the selector: "
                                                          f"not below pids {dead}"),
            ({"trainer": str(job.pid)}, {"cgroup": "/no/such/job"}, "outside the selector: not in cgroup /no/such/job"),
            ({"trainer": "abc"}, {}, "label trainer='abc' is not a process id")):
        with pytest.raises(PermanentActuatorError, match=words):
            act.plan(Target(labels, selector), {"node": 0})
    inside = act.plan(Target({"trainer": str(job.pid)}, {"pids": [job.pid]}), {"node": 0})
    assert len(inside.before["processes"]) == 1


def test_real_dataloader_epochs_followed_by_trainer(act):
    """``workloads/epoch_loader.py``: a DataLoader without persistent_workers, new
    workers every epoch. One change by trainer, refreshed as the controller does
    while it is active, pins the workers of every later epoch."""
    require_root()
    require({0, 1} <= os.sched_getaffinity(0), "CPUs 0 and 1 usable")
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "workloads" / "epoch_loader.py"),
                             "--epochs", "4", "--epoch-items", "768"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        main = read_line(proc, bound=120.0)["pid"]
        change = act.plan(Target({"trainer": str(main)}, {"processes": ["pt_data_worker"]}), {"node": 1})
        act.apply(change)
        followed, checked = set(), 0
        deadline = time.monotonic() + 150      # a bound on a broken run, not a timing assertion
        while proc.poll() is None:
            assert time.monotonic() < deadline, "the job did not finish"
            change = act.refresh(change) or change
            for p in change.after["processes"]:
                followed.add(p["pid"])
                for t in p["threads"]:
                    try:
                        assert allowed(p["pid"], t["tid"]) == "1"
                        checked += 1
                    except FileNotFoundError:      # the worker ended with its epoch
                        pass
            time.sleep(0.05)
        events = [json.loads(line) for line in proc.stdout]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    epochs = [set(e["worker_pids"]) for e in events if e["event"] == "epoch"]
    assert len(epochs) == 4 and len(set.union(*epochs)) == 8, epochs
    for n, pids in enumerate(epochs[1:], 2):
        assert pids <= followed, f"epoch {n} workers {sorted(pids)} not pinned; followed {sorted(followed)}"
    assert checked > 0
    act.revert(change)


def test_real_dataloader_workers(act):
    require_root()
    require({0, 1} <= os.sched_getaffinity(0), "CPUs 0 and 1 usable")
    proc = subprocess.Popen([sys.executable, "-c", LOADER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        info = read_line(proc, bound=120.0)
        assert info["first"] == [float(i * i) for i in range(8)]
        main = info["pid"]
        change = act.plan(Target(selector={"pids": [main]}), {"node": 1})
        workers = [p["pid"] for p in change.before["processes"]]
        assert len(workers) == 2 and main not in workers
        for pid in workers:
            assert Path(f"/proc/{pid}/comm").read_text().strip() == "pt_data_worker"
            planned = [t["tid"] for p in change.before["processes"] if p["pid"] == pid for t in p["threads"]]
            # a worker may start a thread after the plan (apply pins it, revert restores it)
            assert pid in planned and set(planned) <= set(all_threads(pid)), (planned, all_threads(pid))
        act.apply(change)
        for pid in workers:
            assert {allowed(pid, t) for t in all_threads(pid)} == {"1"}
        assert allowed(main, main) == "0-1"
        act.revert(change)
        for pid in workers:
            assert {allowed(pid, t) for t in all_threads(pid)} == {"0-1"}
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()
