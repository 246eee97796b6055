"""sched_numa probe against real migrations and real on-CPU time of a real
task, under a topology given outright and under one read from a fixture sysfs
tree.

A child names itself ``pt_data_worker`` and spins; the test moves it between
CPU 0 and CPU 1 with ``sched_setaffinity`` (each move of a running task is one
``sched_migrate_task``). Under the node map {0: [0], 1: [1]} every move crosses
a node, and each crossing is one ring-buffer event; after loading {0: [0, 1]}
(a map update) none does. A probe given a fixture sys root that declares cpu0
on node 0 and cpu1 on node 1 counts the same moves as crossings; one on the
real /sys of this one-node machine counts none.

On this one-node machine every page is on node 0, so under {0: [0], 1: [1]} a
busy worker pinned to CPU 1 runs remote from its memory (ratio ~1), one pinned
to CPU 0 local (~0), one taking turns on both about half the time. How the
memory node is found (numa_maps, then the allowed CPUs) is checked on a
fixture proc tree.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from conftest import require, require_bpf, two_node_sys

from reflexarc.bpf.probe import OK, Selection
from reflexarc.bpf.sched_numa import SchedNuma, numa_maps_kb
from reflexarc.controller.signals.catalogue import CATALOGUE
from reflexarc.core.topology import NodeMap, Topology

pytestmark = [pytest.mark.kernel]

SPINNER = r"""
import ctypes, sys, time
ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)   # PR_SET_NAME
time.sleep(0.05)
while True:
    pass
"""


SLEEPER = r"""
import ctypes, sys, time
ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)   # PR_SET_NAME
time.sleep(60)
"""

# Named argv[1], busy in 20 ms turns, each on the next CPU of argv[2], sleeping 1 ms after
# each turn as a loader waits for its next item; pinned before it takes the
# name, so no watched time runs elsewhere.
TURNS = r"""
import ctypes, os, sys, time
cpus = [int(c) for c in sys.argv[2].split(",")]
os.sched_setaffinity(0, {cpus[0]})
ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)   # PR_SET_NAME
while True:
    for cpu in cpus:
        os.sched_setaffinity(0, {cpu})
        end = time.monotonic() + 0.02
        while time.monotonic() < end:
            pass
        time.sleep(0.001)
"""


def cpu_of(pid: int) -> int:
    """Field 39 of /proc/<pid>/stat: the CPU the task last ran on."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[36])


def move(pid: int, cpu: int) -> None:
    os.sched_setaffinity(pid, {cpu})
    deadline = time.monotonic() + 5
    while cpu_of(pid) != cpu:
        assert time.monotonic() < deadline, f"task {pid} never reached CPU {cpu}"
        time.sleep(0.001)


class Spinner:
    def __init__(self, comm: str, script: str = SPINNER, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", script, comm, *args])
        self.pid = self.proc.pid
        deadline = time.monotonic() + 10
        while open(f"/proc/{self.pid}/comm").read().strip() != comm:
            assert time.monotonic() < deadline, "spinner never renamed itself"
            time.sleep(0.01)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def counters(samples, pid: int) -> dict[str, float]:
    return {name: value for name, labels, value in samples
            if labels.get("pid") == str(pid) and "quantile" not in labels}


@pytest.fixture(scope="module")
def probe():
    require_bpf()
    require(len(os.sched_getaffinity(0) & {0, 1}) == 2, "CPUs 0 and 1 available to this process")
    p = SchedNuma(Selection(comms=("pt_data_worker",), job="t-numa"), topology=NodeMap({0: [0], 1: [1]}))
    assert p.start().state == OK
    yield p
    p.stop()


def test_signals_are_catalogued():
    for spec in SchedNuma.signals:
        assert CATALOGUE[spec.name] == spec
        assert set(spec.labels) <= {"node", "job", "pid", "trainer", "rank", "pod", "quantile", "probe"}


def lost(samples) -> list[tuple[dict, float]]:
    return [(labels, value) for name, labels, value in samples if name == "probe_events_lost_total"]


def events_of(events, pid: int) -> list[dict]:
    return [e for e in events if e["tgid"] == pid]


def test_cross_numa_migrations_counted_exactly(probe):
    moves = 10
    spinner = Spinner("pt_data_worker")
    try:
        probe.set_topology(NodeMap({0: [0], 1: [1]}))
        move(spinner.pid, 0)
        before = counters(probe.collect(time.time()), spinner.pid)
        for i in range(moves):
            move(spinner.pid, 1 if i % 2 == 0 else 0)
        samples = probe.collect(time.time())
        after = counters(samples, spinner.pid)

        # Same CPUs, one node: the same moves no longer cross.
        probe.set_topology(NodeMap({0: [0, 1]}))
        for i in range(moves):
            move(spinner.pid, 1 if i % 2 == 0 else 0)
        last = counters(probe.collect(time.time()), spinner.pid)
    finally:
        spinner.stop()

    all0 = before.get("numa_migrations_total", 0)
    cross0 = before.get("numa_cross_migrations_total", 0)
    assert after["numa_migrations_total"] - all0 >= moves
    assert after["numa_cross_migrations_total"] - cross0 == moves
    assert last["numa_migrations_total"] - after["numa_migrations_total"] >= moves
    assert last["numa_cross_migrations_total"] == after["numa_cross_migrations_total"]
    # Every move preempted the spinner and queued it on the other CPU.
    runq = {labels["quantile"] for name, labels, _ in samples
            if name == "dataloader_runq_latency_us" and labels["pid"] == str(spinner.pid)}
    assert runq == {"0.5", "0.99"}
    assert all(labels["job"] == "t-numa" for name, labels, _ in samples if "job" in CATALOGUE[name].labels)
    # The spinner is this test's child: this process is its training process.
    assert {labels.get("trainer") for _, labels, _ in samples
            if labels.get("pid") == str(spinner.pid)} == {str(os.getpid())}


def test_cross_numa_migrations_sent_as_events(probe):
    moves = 6
    spinner = Spinner("pt_data_worker")
    try:
        probe.set_topology(NodeMap({0: [0], 1: [1]}))
        move(spinner.pid, 0)
        probe.collect(time.time())
        probe.drain_events()
        for i in range(moves):
            move(spinner.pid, 1 if i % 2 == 0 else 0)
        samples = probe.collect(time.time())
        events = events_of(probe.drain_events(), spinner.pid)
    finally:
        spinner.stop()

    expected = [{"kind": "cross_numa_migration", "tgid": spinner.pid, "tid": spinner.pid,
                 "comm": "pt_data_worker", "orig_cpu": i % 2, "dest_cpu": 1 - i % 2,
                 "orig_node": i % 2, "dest_node": 1 - i % 2} for i in range(moves)]
    assert [{k: e[k] for k in expected[0]} for e in events] == expected
    stamps = [e["ts_ns"] for e in events]
    assert stamps == sorted(stamps) and len(set(stamps)) == moves
    assert abs(events[-1]["time"] - time.time()) < 60      # on the wall clock, not since boot
    assert lost(samples) == [({"node": probe.node, "probe": "sched_numa"}, 0)]
    assert probe.drain_events() == []                        # handed out once


def test_unselected_task_not_counted(probe):
    other = Spinner("rx_not_a_worker")
    try:
        probe.set_topology(NodeMap({0: [0], 1: [1]}))     # its moves would cross
        probe.collect(time.time())
        for i in range(4):
            move(other.pid, 1 if i % 2 == 0 else 0)
        samples = probe.collect(time.time())
        events = probe.drain_events()
    finally:
        other.stop()
    assert str(other.pid) not in {labels.get("pid") for _, labels, _ in samples}
    assert events_of(events, other.pid) == []


def test_full_ring_buffer_counts_lost_events():
    """One page holds ~70 events: more crossings than that between two polls
    are counted as lost, and the rest arrive."""
    require_bpf()
    moves = 120
    small = SchedNuma(Selection(comms=("pt_data_worker",)), topology=NodeMap({0: [0], 1: [1]}), ring_pages=1)
    assert small.start().state == OK
    spinner = Spinner("pt_data_worker")
    try:
        move(spinner.pid, 0)
        small.collect(time.time())
        small.drain_events()
        for i in range(moves):
            move(spinner.pid, 1 if i % 2 == 0 else 0)
        samples = small.collect(time.time())
        events = small.drain_events()
    finally:
        spinner.stop()
        small.stop()
    (_, dropped), = lost(samples)
    mine = len(events_of(events, spinner.pid))
    assert 0 < mine < moves
    assert dropped >= moves - mine        # other selected workers may also have crossed
    with pytest.raises(ValueError):
        SchedNuma(ring_pages=3)


def test_runq_latency_rises_when_cpu_is_shared(probe):
    worker, hog = Spinner("pt_data_worker"), Spinner("rx_cpu_hog")
    try:
        move(worker.pid, 1)
        move(hog.pid, 1)
        probe.collect(time.time())
        time.sleep(0.5)
        samples = probe.collect(time.time())
    finally:
        worker.stop()
        hog.stop()
    p99 = [v for name, labels, v in samples if name == "dataloader_runq_latency_us"
           and labels["pid"] == str(worker.pid) and labels["quantile"] == "0.99"]
    # Two spinners on one CPU take turns a scheduler slice (0.75-3 ms) at a time:
    # the worker waits at least that long whenever the hog holds the CPU.
    assert p99 and p99[0] >= 500, samples


def cross_migrations_of_moves(sys_root: str, moves: int) -> tuple[float, float]:
    """(all, cross) migrations a probe reading its topology from ``sys_root``
    counts for a worker moved ``moves`` times between CPU 0 and CPU 1."""
    p = SchedNuma(Selection(comms=("pt_data_worker",)), sys_root=sys_root)
    assert p.start().state == OK
    spinner = Spinner("pt_data_worker")
    try:
        move(spinner.pid, 0)
        before = counters(p.collect(time.time()), spinner.pid)
        for i in range(moves):
            move(spinner.pid, 1 if i % 2 == 0 else 0)
        after = counters(p.collect(time.time()), spinner.pid)
    finally:
        spinner.stop()
        p.stop()
    return tuple(after[name] - before.get(name, 0)
                 for name in ("numa_migrations_total", "numa_cross_migrations_total"))


def test_fixture_sys_root_declares_the_nodes_the_kernel_counts(tmp_path):
    require_bpf()
    require(len(os.sched_getaffinity(0) & {0, 1}) == 2, "CPUs 0 and 1 available to this process")
    require(len(Topology().nodes()) == 1, "a one-node machine (the real /sys lists one NUMA node)")
    moves = 6
    moved, crossed = cross_migrations_of_moves(str(two_node_sys(tmp_path / "sys")), moves)
    assert moved >= moves and crossed == moves
    moved, crossed = cross_migrations_of_moves("/sys", moves)
    assert moved >= moves and crossed == 0


def remote_ratio(probe: SchedNuma, cpus: str) -> tuple[list[tuple[dict, float]], int]:
    """The numa_remote_ratio samples of a worker busy on ``cpus`` in turn
    (``TURNS``) over 0.6 s, and the node the probe finds its memory on."""
    worker = Spinner("pt_data_worker", TURNS, cpus)
    try:
        probe.collect(time.time())
        time.sleep(0.6)
        samples = probe.collect(time.time())
        home = probe.memory_node(worker.pid)
    finally:
        worker.stop()
    return [(labels, v) for name, labels, v in samples
            if name == "numa_remote_ratio" and labels["pid"] == str(worker.pid)], home


@pytest.mark.parametrize("cpus, low, high", [("1", 0.95, 1.0), ("0", 0.0, 0.05), ("0,1", 0.25, 0.75)],
                         ids=["remote", "local", "half"])
def test_remote_ratio_is_the_share_of_cpu_time_off_the_memory_node(probe, cpus, low, high):
    require(len(Topology().nodes()) == 1, "a one-node machine (all memory on node 0)")
    probe.set_topology(NodeMap({0: [0], 1: [1]}))
    ratios, home = remote_ratio(probe, cpus)
    assert home == 0
    (labels, ratio), = ratios
    assert low <= ratio <= high, ratio
    assert labels["job"] == "t-numa" and labels["trainer"] == str(os.getpid())


def test_remote_ratio_follows_the_declared_topology(probe):
    """The same worker on CPU 1 is local once both CPUs are on node 0."""
    probe.set_topology(NodeMap({0: [0, 1]}))
    try:
        ratios, home = remote_ratio(probe, "1")
    finally:
        probe.set_topology(NodeMap({0: [0], 1: [1]}))
    assert home == 0
    assert [ratio for _, ratio in ratios] == [0.0]


def test_idle_process_gets_no_remote_ratio(probe):
    sleeper = Spinner("pt_data_worker", SLEEPER)
    try:
        time.sleep(0.2)
        probe.collect(time.time())
        time.sleep(0.3)
        samples = probe.collect(time.time())
    finally:
        sleeper.stop()
    assert str(sleeper.pid) not in {labels["pid"] for name, labels, _ in samples if name == "numa_remote_ratio"}


NUMA_MAPS = """\
55d0c0000000 default file=/usr/bin/python3.11 mapped=300 mapmax=4 N1=300 kernelpagesize_kB=4
7f1000000000 default anon=10 dirty=10 active=0 N0=4 N1=6 kernelpagesize_kB=4
7f1000200000 bind:0 anon=2 dirty=2 N0=2 kernelpagesize_kB=2048
7f1000600000 default
7ffd00000000 default stack anon=3 dirty=3 N0=1 N2=2 kernelpagesize_kB=4
"""


def fake_proc(root, pid: int, numa_maps: str | None, allowed: str):
    d = root / str(pid)
    d.mkdir(parents=True)
    if numa_maps is not None:
        (d / "numa_maps").write_text(numa_maps)
    (d / "status").write_text(f"Name:\tpt_data_worker\nCpus_allowed:\t3\nCpus_allowed_list:\t{allowed}\n"
                              "Mems_allowed_list:\t0-1\n")


def test_memory_node_from_numa_maps_then_allowed_cpus(tmp_path):
    proc = tmp_path / "proc"
    fake_proc(proc, 100, NUMA_MAPS, "1")
    fake_proc(proc, 101, NUMA_MAPS.replace("kernelpagesize_kB=2048", "kernelpagesize_kB=4"), "0")
    fake_proc(proc, 102, None, "1")                          # numa_maps unreadable
    fake_proc(proc, 103, "7f1000600000 default\n", "0")      # no pages on any node
    fake_proc(proc, 104, None, "0-1")                        # allowed CPUs on two nodes
    fake_proc(proc, 105, None, "1-2")                        # CPU 2 is on no declared node

    # Pages weigh their size: two 2 MiB pages outweigh 306 small ones.
    assert numa_maps_kb(str(proc / "100/numa_maps")) == {0: 4 * 4 + 2 * 2048 + 1 * 4, 1: 306 * 4, 2: 2 * 4}
    assert numa_maps_kb(str(proc / "102/numa_maps")) == {}
    probe = SchedNuma(topology=NodeMap({0: [0], 1: [1]}), proc_root=str(proc))
    assert probe.memory_node(100) == 0
    assert probe.memory_node(101) == 1
    assert probe.memory_node(102) == 1
    assert probe.memory_node(103) == 0
    assert probe.memory_node(104) is None
    assert probe.memory_node(105) is None
    assert probe.memory_node(106) is None                   # no such process
