"""device_numa_local_ratio: whether the GPUs, NICs and disks a training process
uses sit on the NUMA node of the CPUs it may run on, read from /proc and sysfs.

The ratios and the bad-input handling run on fixture trees built here in the
kernel's layout: a two-node machine (CPUs 0-3 on node 0, 4-7 on node 1) at
``<sys_root>/devices/system/node``, PCI functions under
``<sys_root>/devices/pci0000:00`` with their ``numa_node`` (a NIC on node 0, a
GPU and an NVMe controller on node 1, a virtio function with -1), reached
through ``class/net``, ``block`` and ``bus/pci/devices`` links as in sysfs; and
at ``<proc_root>`` the training processes' ``status`` and ``fd`` links and the
NVIDIA driver's ``driver/nvidia/gpus/<addr>/information``. Garbage, missing
files and a process that vanishes mid-read are counted by reason, never
raised. One test reads this machine's real /proc and /sys.
"""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from reflexarc.bpf.device_locality import EVERY, LOCALITY, SKIP_REASONS, SKIPPED, DeviceLocality
from reflexarc.bpf.probe import Selection
from reflexarc.controller.cli.top import Point, TopView, locality_line
from reflexarc.controller.policy.explain import explain
from reflexarc.controller.policy.loader import load_policies
from reflexarc.controller.signals.catalogue import CATALOGUE, producers_of
from reflexarc.controller.signals.producers import POLLER, NodeFacts, Producer
from reflexarc.controller.signals.values import value_fault
from reflexarc.controller.sources.readers import ProbeSource
from reflexarc.core.devices import Devices

TRAINER, SPREAD = 4242, 4343          # CPUs 0-3 (node 0), CPUs 2-5 (both nodes)
NIC, GPU, NVME, VIRTIO = "0000:3b:00.0", "0000:86:00.0", "0000:5e:00.0", "0000:00:02.0"


def link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def pci(sys_root: Path, addr: str, numa: str | None) -> Path:
    d = sys_root / "devices" / "pci0000:00" / addr
    d.mkdir(parents=True, exist_ok=True)
    if numa is not None:
        (d / "numa_node").write_text(numa + "\n")
    link(sys_root / "bus" / "pci" / "devices" / addr, f"../../../devices/pci0000:00/{addr}")
    return d


def class_device(sys_root: Path, folder: str, name: str, under: Path, device: str | None) -> Path:
    """``<sys_root>/<folder>/<name>`` linked to its directory below ``under``, with its ``device`` link."""
    d = under / name
    d.mkdir(parents=True)
    if device is not None:
        (d / "device").symlink_to(device)
    link(sys_root / folder / name, os.path.relpath(d, sys_root / folder))
    return d


def process(proc_root: Path, pid: int, cpus: str, fds: dict[str, str] | None = None) -> Path:
    d = proc_root / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "status").write_text(f"Name:\tpython\nPid:\t{pid}\nCpus_allowed:\tff\nCpus_allowed_list:\t{cpus}\n"
                              "Mems_allowed_list:\t0-1\n")
    for fd, target in (fds or {}).items():
        (d / "fd" / fd).symlink_to(target)
    return d


def nvidia(proc_root: Path, addr: str, minor: str) -> Path:
    d = proc_root / "driver" / "nvidia" / "gpus" / addr
    d.mkdir(parents=True)
    (d / "information").write_text(f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 150\nGPU UUID: \t GPU-1234\n"
                                   f"Video BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
                                   f"Bus Location: \t {addr}\nDevice Minor: \t {minor}\n")
    return d


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    sys_root, proc_root = tmp_path / "sys", tmp_path / "proc"
    for node, cpus in (("node0", "0-3"), ("node1", "4-7")):
        (sys_root / "devices" / "system" / "node" / node).mkdir(parents=True)
        (sys_root / "devices" / "system" / "node" / node / "cpulist").write_text(cpus + "\n")
    (sys_root / "devices" / "system" / "cpu").mkdir(parents=True)
    (sys_root / "devices" / "system" / "cpu" / "online").write_text("0-7\n")
    nic = pci(sys_root, NIC, "0")
    pci(sys_root, GPU, "1")
    pci(sys_root, "0000:af:00.0", "1")                          # a second GPU the trainers do not open
    nvme = pci(sys_root, NVME, "1")
    virtio = pci(sys_root, VIRTIO, "-1")
    class_device(sys_root, "class/net", "eth0", nic / "net", "../..")
    class_device(sys_root, "class/net", "lo", sys_root / "devices" / "virtual" / "net", None)
    (nvme / "nvme" / "nvme0").mkdir(parents=True)                 # the controller: no numa_node of its own
    class_device(sys_root, "block", "nvme0n1", nvme / "nvme" / "nvme0", "..")
    (virtio / "virtio1").mkdir()
    class_device(sys_root, "block", "vda", virtio / "virtio1" / "block", "../..")
    class_device(sys_root, "block", "loop0", sys_root / "devices" / "virtual" / "block", None)
    nvidia(proc_root, GPU, "1")
    nvidia(proc_root, "0000:af:00.0", "0")
    process(proc_root, TRAINER, "0-3", {"0": "/dev/null", "5": "/dev/nvidia1", "6": "/dev/nvidiactl",
                                        "7": "/dev/nvidia-uvm", "8": "socket:[81234]"})
    process(proc_root, SPREAD, "2-5")
    return sys_root, proc_root


def poller(roots: tuple[Path, Path]) -> DeviceLocality:
    sys_root, proc_root = roots
    return DeviceLocality(node="n1", proc_root=str(proc_root), sys_root=str(sys_root))


def ratios(out: list) -> dict:
    return {(int(labels["pid"]), labels["dev"]): (labels["kind"], labels["numa_node"], labels["cpu_nodes"], value)
            for name, labels, value in out if name == LOCALITY.name}


def skipped(out: list) -> dict:
    return {labels["reason"]: value for name, labels, value in out if name == SKIPPED.name}


def test_the_share_of_the_allowed_cpus_on_each_device_s_node(roots):
    out = poller(roots).collect([TRAINER, SPREAD], 100.0)
    assert ratios(out) == {
        (TRAINER, "nvidia1"): ("gpu", "1", "0", 0.0),         # the GPU it has open, on the other socket
        (TRAINER, "eth0"): ("nic", "0", "0", 1.0),
        (TRAINER, "nvme0n1"): ("block", "1", "0", 0.0),       # the node of its controller's PCI function
        (TRAINER, "vda"): ("block", "unknown", "0", 1.0),     # numa_node -1: local to every CPU
        (SPREAD, "eth0"): ("nic", "0", "0,1", 0.5),           # no GPU open: none reported
        (SPREAD, "nvme0n1"): ("block", "1", "0,1", 0.5),
        (SPREAD, "vda"): ("block", "unknown", "0,1", 1.0),
    }
    assert skipped(out) == dict.fromkeys(SKIP_REASONS, 0.0)
    for name, labels, _ in out:
        assert labels["node"] == "n1" and set(labels) <= set(CATALOGUE[name].labels), labels
        if name == LOCALITY.name:
            assert labels["trainer"] == labels["pid"]


def test_bad_input_is_counted_by_reason_and_located_never_raised(roots, caplog):
    """A NUMA node that is no number, a FIFO where it should be, a NIC with no
    numa_node above it, a status without its CPU list or with garbage or an
    absurd one, a GPU minor no driver file names, an information file without
    its minor, an fd directory that cannot be listed: each counted, told once
    with the file (and line); the rest still read."""
    sys_root, proc_root = roots
    (sys_root / "devices" / "pci0000:00" / NIC / "numa_node").write_text("node one\n")
    platform = sys_root / "devices" / "platform" / "soc" / "eth1"
    platform.mkdir(parents=True)
    class_device(sys_root, "class/net", "eth1", platform / "net", "../..")     # no numa_node anywhere
    fifo = pci(sys_root, "0000:d8:00.0", None)
    os.mkfifo(fifo / "numa_node")                                           # no writer: reads empty, never blocks
    class_device(sys_root, "class/net", "eth2", fifo / "net", "../..")
    (proc_root / "driver" / "nvidia" / "gpus" / "0000:af:00.0" / "information").write_text("Model: broken\n")
    process(proc_root, 5001, "0-3", {"3": "/dev/nvidia7"})                  # a minor no information file names
    (proc_root / "5002").mkdir()
    (proc_root / "5002" / "status").write_text("Name:\tpython\nPid:\t5002\n")   # no Cpus_allowed_list
    process(proc_root, 5003, "zero-three")
    process(proc_root, 5004, "0-4000000000")                                # must not build 4e9 CPUs
    process(proc_root, 5005, "64-71")                                       # no CPU of a node
    shutil.rmtree(process(proc_root, 5006, "0-3") / "fd")
    (proc_root / "5006" / "fd").write_text("")                              # listing fails: ENOTDIR
    probe = poller(roots)
    with caplog.at_level(logging.WARNING, logger="reflexarc.probes.device_locality"):
        out = probe.collect([TRAINER, 5001, 5002, 5003, 5004, 5005, 5006], 100.0)
        again = probe.collect([TRAINER, 5001, 5002, 5003, 5004, 5005, 5006], 100.0 + EVERY)
    got = ratios(out)
    assert got[(TRAINER, "nvidia1")] == ("gpu", "1", "0", 0.0)              # the good ones still count
    assert got[(5006, "vda")] == ("block", "unknown", "0", 1.0)             # fds unreadable: NICs and disks known
    assert {dev for pid, dev in got if pid == 5001} == {"nvme0n1", "vda"}   # its GPU has no sample
    assert not {dev for _, dev in got if dev.startswith("eth")}             # no usable node: no sample
    assert not {pid for pid, _ in got} & {5002, 5003, 5004, 5005}
    assert skipped(out) == {"vanished": 0.0, "unreadable": 1.0, "malformed": 6.0, "missing": 3.0}
    assert skipped(again) == {"vanished": 0.0, "unreadable": 2.0, "malformed": 12.0, "missing": 6.0}   # each read
    told = [r.getMessage() for r in caplog.records]
    assert len(told) == 10, told                                             # each (file, reason) once
    pci_dir = sys_root / "devices" / "pci0000:00"
    for start in (f"{pci_dir / NIC}/numa_node:1: malformed: 'node one' is not a NUMA node",
                  f"{pci_dir}/0000:d8:00.0/numa_node:1: malformed: '' is not a NUMA node",
                  f"{sys_root}/class/net/eth1/device: missing: no numa_node on it or on a device above it",
                  f"{proc_root}/driver/nvidia/gpus/0000:af:00.0/information: malformed: no 'Device Minor: N' line",
                  f"{proc_root}/5001/fd: missing: /dev/nvidia7: no {proc_root}/driver/nvidia/gpus/*/information "
                  f"names Device Minor 7",
                  f"{proc_root}/5002/status: missing: no Cpus_allowed_list line",
                  f"{proc_root}/5003/status:4: malformed: bad CPU list",
                  f"{proc_root}/5004/status:4: malformed: '0-4000000000' names a CPU beyond 65535",
                  f"{proc_root}/5005/status:4: malformed: '64-71' names no CPU of a NUMA node",
                  f"{proc_root}/5006/fd: unreadable: Not a directory"):
        assert any(m.startswith(start) for m in told), (start, told)


def test_a_process_that_vanishes_is_skipped_and_counted(roots):
    """Gone before its status is read, or between its status and its fd
    directory (mid-read): no sample, counted once a read, not every collect."""
    _, proc_root = roots
    shutil.rmtree(proc_root / str(SPREAD) / "fd")                          # exited after its status was read
    probe = poller(roots)
    out = probe.collect([TRAINER, SPREAD, 9999], 100.0)                    # 9999: no /proc entry at all
    assert {pid for pid, _ in ratios(out)} == {TRAINER}
    assert skipped(out)["vanished"] == 2.0
    assert skipped(probe.collect([TRAINER, SPREAD, 9999], 101.0))["vanished"] == 2.0    # not read again yet
    probe.collect([TRAINER], 102.0)                                        # 9999 and SPREAD left the list
    assert skipped(probe.collect([TRAINER, 9999], 103.0))["vanished"] == 3.0, "forgotten: read afresh"


def test_reads_at_most_every_30_s_and_forgets_processes_that_left(roots):
    sys_root, proc_root = roots
    probe = poller(roots)
    assert ratios(probe.collect([TRAINER], 100.0))[(TRAINER, "nvidia1")][3] == 0.0
    (proc_root / str(TRAINER) / "status").write_text("Cpus_allowed_list:\t4-7\n")   # re-pinned to node 1
    (sys_root / "devices" / "pci0000:00" / NIC / "numa_node").write_text("1\n")
    cached = ratios(probe.collect([TRAINER], 100.0 + EVERY - 1))
    assert cached[(TRAINER, "nvidia1")][3] == 0.0 and cached[(TRAINER, "eth0")][1] == "0"   # the cached values
    fresh = ratios(probe.collect([TRAINER], 100.0 + EVERY))
    assert fresh[(TRAINER, "nvidia1")] == ("gpu", "1", "1", 1.0)
    assert fresh[(TRAINER, "eth0")] == ("nic", "1", "1", 1.0)
    probe.collect([], 131.0)                                                 # it left the list: forgotten
    (proc_root / str(TRAINER) / "status").write_text("Cpus_allowed_list:\t0-7\n")
    assert ratios(probe.collect([TRAINER], 132.0))[(TRAINER, "nvidia1")][3] == 0.5   # read afresh at once


class Manager:
    """What the probe source asks a probe manager, with discovery's trainers and labels."""

    def __init__(self, trainers: tuple[int, ...]) -> None:
        self.selection = Selection(trainers=trainers)
        self.exited: frozenset[int] = frozenset()

    def refresh_selection(self) -> bool:
        return False

    def expire_deep(self, now: float) -> list[str]:
        return []

    def collect(self, now: float) -> list:
        return []

    def label_job(self, labels: dict) -> None:
        if "trainer" in labels:
            labels.update({"job": "llama", "rank": {str(TRAINER): "0", str(SPREAD): "1"}[labels["trainer"]]})


def test_the_probe_source_reports_it_for_discovery_s_trainers_with_their_job(roots):
    manager = Manager((TRAINER, SPREAD))
    source = ProbeSource(manager, refresh_every=5.0, locality=poller(roots))
    got = [(labels["trainer"], labels["job"], labels["rank"], labels["dev"]) for name, labels, _ in source.poll(1.0)
           if name == LOCALITY.name]
    assert ("4242", "llama", "0", "nvidia1") in got and ("4343", "llama", "1", "eth0") in got
    manager.exited = frozenset({SPREAD})                                     # the probes saw it exit
    source.poll(2.0)
    manager.exited = frozenset()
    later = {labels["trainer"] for name, labels, _ in source.poll(3.0) if name == LOCALITY.name}
    assert later == {"4242"}, "no series of an exited process comes back before discovery forgets it"
    assert all(n != LOCALITY.name for n, _, _ in ProbeSource(manager).poll(4.0)), "only given a poller"


def test_top_says_it_in_one_line_per_training_process(roots):
    out = poller(roots).collect([TRAINER, SPREAD], 100.0)
    assert locality_line([(LOCALITY.name, labels, Point(value, 100.0, 100.0)) for name, labels, value in out
                          if name == LOCALITY.name and labels["pid"] == str(TRAINER)]) == \
        "locality: nvidia1 remote (node 1; CPUs on node 0), nvme0n1 remote (node 1; CPUs on node 0)"
    view = TopView(proc_root=str(roots[1]))
    labelled = [(name, {**labels, "job": "llama"} if "pid" in labels else labels, value) for name, labels, value in out]
    view.update(labelled + [("step_time_ms", {"trainer": str(SPREAD), "job": "llama"}, 180.0),
                            (LOCALITY.name, {"trainer": "77", "pid": "77", "job": "llama", "dev": "eth0",
                                             "kind": "nic", "numa_node": "0", "cpu_nodes": "0"}, 1.0)], 100.0)
    text = view.render(100.0)
    lines = text.splitlines()
    assert "    locality: eth0 50% local (node 0; CPUs on nodes 0,1), nvme0n1 50% local (node 1; CPUs on nodes 0,1)" \
        == lines[lines.index(f"  trainer {SPREAD}") + 1], text
    assert lines[lines.index("  trainer 77") + 1] == "    locality: all local", text
    assert LOCALITY.name not in text                                         # the line, not a row per device
    assert "step_time_ms" in text and "device_locality_skipped_total" in text


def test_catalogued_with_its_producer_and_explained(tmp_path):
    assert CATALOGUE[LOCALITY.name] == LOCALITY and CATALOGUE[SKIPPED.name] == SKIPPED
    assert producers_of(LOCALITY.name) == (Producer(POLLER, "device_locality"),)
    assert value_fault(LOCALITY.name, 1.0) is None and value_fault(LOCALITY.name, 1.5) is not None
    path = tmp_path / "locality.yaml"
    path.write_text("""policies:
  - name: remote-gpu
    mode: alert-only
    rules:
      - name: gpu-off-socket
        by: [trainer, dev]
        when: {signal: device_numa_local_ratio, match: {kind: gpu}, agg: max, window: 2m, op: "<", threshold: 0.5}
        for: 1m
        actions:
          - actuator: alert
            params: {severity: warning, summary: a GPU sits on another NUMA node than its process's CPUs}
""")
    text = " ".join(explain(load_policies([str(path)]), NodeFacts(Devices(sys_root=str(tmp_path))), True).split())
    assert ('the max of device_numa_local_ratio{kind="gpu"} over 2 m is below 0.5' in text
            and "for one training process and device (by: trainer, dev" in text), text
    assert ("device_numa_local_ratio (ratio): Share of a training process's allowed CPUs on the NUMA node of a "
            "device it uses") in text, text
    assert "from the device_locality poller (/proc and sysfs, no BPF program): can run here" in text, text
    assert "readiness here: nothing keeps it from working on this node." in text, text


def test_this_machine_s_devices():
    """The real /proc and /sys: every NIC and disk with a ``device`` link is
    reported for this process, with the node of the nearest ``numa_node``
    above it; one of -1 (a virtual machine's virtio devices) gives 1.0."""
    sys_root = Path("/sys")
    assert (sys_root / "class" / "net").is_dir() and (sys_root / "block").is_dir(), \
        "missing capability: sysfs with /sys/class/net and /sys/block"
    want = {}
    for folder, kind in ((sys_root / "class" / "net", "nic"), (sys_root / "block", "block")):
        for entry in folder.iterdir():
            if (entry / "device").exists():
                path = Path(os.path.realpath(entry / "device"))
                while sys_root in path.parents and not (path / "numa_node").exists():
                    path = path.parent
                if (path / "numa_node").exists():
                    want[entry.name] = (kind, int((path / "numa_node").read_text()))
    assert {kind for kind, _ in want.values()} == {"nic", "block"}, f"this machine has a NIC and a disk: {want}"
    out = DeviceLocality(node="n1").collect([os.getpid()], 1.0)
    got = {labels["dev"]: (labels["kind"], labels["numa_node"], value)
           for name, labels, value in out if name == LOCALITY.name}
    assert set(got) == set(want), (got, want)
    mine = os.sched_getaffinity(0)
    for dev, (kind, numa) in want.items():
        if numa < 0:
            assert got[dev] == (kind, "unknown", 1.0), dev
        else:
            on = {int(c) for c in _cpus(sys_root / "devices" / "system" / "node" / f"node{numa}" / "cpulist")}
            assert got[dev] == (kind, str(numa), len(mine & on) / len(mine)), dev
    assert skipped(out)["vanished"] == 0.0 and skipped(out)["malformed"] == 0.0


def _cpus(path: Path) -> set[int]:
    out = set()
    for part in path.read_text().strip().split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out
