"""Which training process owns a DataLoader worker (``core/trainers.py``): on a
fixture proc tree for each start method's shape (fork/spawn: the parent;
forkserver: past the fork server; a worker's own worker; an orphan; a reused
pid), and on real processes started through Python's forkserver."""
from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

from test_actuator_affinity import fake_proc

from reflexarc.core.trainers import Trainers

RENAME_AND_WAIT = ("import ctypes, time\n"
                   "ctypes.CDLL(None).prctl(15, b'pt_data_worker', 0, 0, 0)\n"   # PR_SET_NAME
                   "time.sleep(60)\n")


def with_cmdline(root: Path, pid: int, *args: str) -> None:
    (root / str(pid) / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in args))


def tree(root: Path) -> Path:
    fake_proc(root, 1, "systemd", 0, "")
    fake_proc(root, 100, "python", 1, "")                    # python train.py
    with_cmdline(root, 100, "python", "train.py")
    fake_proc(root, 101, "pt_data_worker", 100, "")          # fork / spawn: a child of the trainer
    fake_proc(root, 102, "pt_data_worker", 101, "")          # a worker's own worker
    fake_proc(root, 110, "python3", 100, "")                 # the trainer's fork server
    with_cmdline(root, 110, "/usr/bin/python3", "-B", "-c",
                 "from multiprocessing.forkserver import main; main(3, 5, ['__main__'])")
    fake_proc(root, 111, "pt_data_worker", 110, "")
    fake_proc(root, 120, "python3", 100, "")                 # a child script that mentions the fork server
    with_cmdline(root, 120, "python3", "-c", "import multiprocessing.forkserver")
    fake_proc(root, 121, "pt_data_worker", 120, "")
    fake_proc(root, 200, "pt_data_worker", 1, "")            # orphan: reparented to init
    return root


def test_owner_for_each_start_method_shape(tmp_path):
    trainers = Trainers(str(tree(tmp_path / "proc")))
    assert trainers.of(101) == 100
    assert trainers.of(102) == 100, "past a worker's parent worker"
    assert trainers.of(111) == 100, "past the fork server"
    assert trainers.of(121) == 120, "only the fork server's own -c argument counts"
    assert trainers.of(200) is None, "an orphan has no training process"
    assert trainers.of(999) is None, "a gone process has none"


def test_resolved_once_per_process_and_afresh_for_a_reused_pid(tmp_path):
    root = tree(tmp_path / "proc")
    trainers = Trainers(str(root))
    assert trainers.of(101) == 100

    def restart_101(ppid: int, start: int) -> None:
        (root / "101" / "stat").write_text(f"101 (pt_data_worker) S {ppid} " + " ".join(["0"] * 17) + f" {start} 0 0\n")

    restart_101(1, 5000)
    assert trainers.of(101) == 100, "cached: no /proc read for a known process"
    trainers.prune(active=())
    assert trainers.of(101) == 100, "an idle process that still runs keeps its owner"
    fake_proc(root, 300, "python", 1, "", start=9000)
    with_cmdline(root, 300, "python", "other.py")
    restart_101(300, 9100)
    trainers.prune(active=())
    assert trainers.of(101) == 300, "pid 101 now names a process started later: resolved afresh"
    (root / "101" / "stat").unlink()
    trainers.prune(active=())
    assert trainers.of(101) is None, "an exited process is forgotten"


def test_real_forkserver_workers_belong_to_the_starting_process():
    ctx = multiprocessing.get_context("forkserver")
    workers = [ctx.Process(target=exec, args=(RENAME_AND_WAIT,), daemon=True) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        deadline = time.monotonic() + 30
        for w in workers:
            while Path(f"/proc/{w.pid}/comm").read_text().strip() != "pt_data_worker":
                assert time.monotonic() < deadline, f"worker {w.pid} never renamed itself"
                time.sleep(0.01)
        server = int(Path(f"/proc/{workers[0].pid}/stat").read_text().rpartition(")")[2].split()[1])
        assert server != os.getpid(), "the workers' parent is the fork server"
        trainers = Trainers()
        assert [trainers.of(w.pid) for w in workers] == [os.getpid(), os.getpid()]
    finally:
        for w in workers:
            w.kill()
            w.join()
