"""ProbeManager on the real kernel: starting the light tier with one broken
probe, following new and exited workers, handing out probe events, switching
a deep probe on and off; plus the catalogue and the /proc scanner on fixtures.

Workers here carry a name unique to this run, so DataLoader workers of other
tests on the machine are not picked up.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from conftest import require, require_bpf, two_node_sys
from test_probe_sched_numa import Spinner, move

from reflexarc.bpf import catalog
from reflexarc.bpf.block_io import BlockIo
from reflexarc.bpf.dataloader_io import DataloaderIo
from reflexarc.bpf.manager import ProbeManager
from reflexarc.bpf.probe import DEEP_EVENTS_PER_S, OK, STOPPED, UNSUPPORTED, Probe, ProbeStatus, Selection
from reflexarc.bpf.sched_numa import SchedNuma
from reflexarc.controller.signals.catalogue import CATALOGUE
from reflexarc.controller.cli.top import format_event
from reflexarc.core.procfs import ProcFS
from reflexarc.core.topology import NodeMap, Topology

pytestmark = [pytest.mark.kernel]

COMM = f"rxw{os.getpid() % 100000}"

WORKER = r"""
import ctypes, os, sys
ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)   # PR_SET_NAME
zero = os.open("/dev/zero", os.O_RDONLY)
print("ready", flush=True)
for line in sys.stdin:          # per line, READS_PER_LINE read syscalls; EOF ends
    for _ in range(int(sys.argv[2])):
        os.read(zero, 1)
    print("ok", flush=True)
"""
READS_PER_LINE = 10


class Worker:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, COMM, str(READS_PER_LINE)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        self.pid = self.proc.pid

    def feed(self, lines: int) -> None:
        """Make the worker do READS_PER_LINE * lines reads, and wait for them."""
        for _ in range(lines):
            self.proc.stdin.write("x\n")
            self.proc.stdin.flush()
            assert self.proc.stdout.readline().strip() == "ok"

    def stop(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


class BrokenProbe(Probe):
    """Its C does not compile."""
    name = "broken"
    signals = ()
    fallback_order = ("none",)

    def __init__(self, selection=None, features=None, node="", source=None) -> None:
        super().__init__(selection, features, node)
        self._source = source

    @property
    def source_path(self):
        return self._source

    def choose_attach_points(self) -> ProbeStatus:
        return ProbeStatus(OK, "", ["tracepoint:sched:sched_switch"])

    def attach(self) -> None:
        raise AssertionError("never reached: compilation fails first")

    def collect(self, now):
        return []


class GetppidCounter(Probe):
    """A deep probe for the switching test: counts getppid() calls of one pid
    (given as a session param) and reports them as deep_probe_events_per_s."""
    name = "getppid_counter"
    tier = "deep"
    signals = (DEEP_EVENTS_PER_S,)
    fallback_order = ("syscalls:sys_enter_getppid",)
    SOURCE = ""

    def __init__(self, selection=None, features=None, node="", target_pid=0) -> None:
        super().__init__(selection, features, node)
        self.target_pid = target_pid

    @property
    def source_path(self):
        return self.SOURCE

    def cflags(self):
        return [f"-DTARGET={self.target_pid}"]

    def choose_attach_points(self) -> ProbeStatus:
        return ProbeStatus(OK, "", ["tracepoint:syscalls:sys_enter_getppid"])

    def attach(self) -> None:
        self.bpf.attach_tracepoint(tp=b"syscalls:sys_enter_getppid", fn_name=b"on_getppid")

    def collect(self, now):
        table = self.bpf[b"calls"]
        n = table[table.Key(0)].value
        table[table.Key(0)] = table.Leaf(0)
        return [("deep_probe_events_per_s", self.labels(probe=self.name), float(n))]


DEEP_C = r"""
BPF_ARRAY(calls, u64, 1);
int on_getppid(void *ctx)
{
    if ((bpf_get_current_pid_tgid() >> 32) != TARGET)
        return 0;
    u32 zero = 0;
    u64 *n = calls.lookup(&zero);
    if (n)
        __sync_fetch_and_add(n, 1);
    return 0;
}
"""


@pytest.fixture(scope="module")
def manager(tmp_path_factory):
    require_bpf()
    broken = tmp_path_factory.mktemp("broken") / "broken.bpf.c"
    broken.write_text("int this is not C;\n")
    mgr = ProbeManager(Selection(comms=(COMM,), job="t-mgr"),
                       probes=[DataloaderIo, SchedNuma, BlockIo, BrokenProbe(source=broken)])
    mgr.start()
    yield mgr
    mgr.stop()


def test_starts_all_and_isolates_a_broken_probe(manager):
    statuses = manager.statuses()
    assert {k: v.state for k, v in statuses.items()} == {
        "dataloader_io": OK, "sched_numa": OK, "block_io": OK, "broken": UNSUPPORTED}
    assert statuses["broken"].reason            # the compiler's complaint, not empty
    assert manager.armed_after > 0
    assert manager.probes["broken"].bpf is None
    assert all(manager.probes[n].bpf is not None for n in ("dataloader_io", "sched_numa", "block_io"))
    dump = manager.dump_bpf()
    for name in ("dataloader_io", "sched_numa", "block_io", "broken"):
        assert f"// probe: {name}" in dump

    worker = Worker()
    try:
        worker.feed(20)
        samples = manager.collect(time.time())
    finally:
        worker.stop()
    reads = {int(labels["pid"]): v for n, labels, v in samples if n == "dataloader_reads_total"}
    assert reads.get(worker.pid, 0) >= 20 * READS_PER_LINE    # picked up by name in the kernel
    assert all(CATALOGUE[n] for n, _, _ in samples)
    assert all(labels["job"] == "t-mgr" for n, labels, _ in samples if "job" in CATALOGUE[n].labels)
    node = manager.probes["sched_numa"].node
    assert ("probe_events_lost_total", {"node": node, "probe": "sched_numa"}, 0) in samples


def test_refresh_follows_new_and_exited_workers(manager):
    manager.refresh_selection()
    worker = Worker()
    try:
        assert worker.pid not in manager.selection.pids
        assert manager.refresh_selection() is True
        assert worker.pid in manager.selection.pids
        assert manager.refresh_selection() is False        # nothing new
        for name in ("dataloader_io", "sched_numa"):
            kernel_pids = {k.value for k in manager.probes[name].bpf[b"sel_pid"].keys()}
            assert worker.pid in kernel_pids, name
        tids = {k.value for k in manager.probes["sched_numa"].bpf[b"tasks"].keys()}
        assert worker.pid in tids
        migrations = {labels["pid"] for n, labels, _ in manager.collect(time.time())
                      if n == "numa_migrations_total"}
        assert str(worker.pid) in migrations                # reported from zero
    finally:
        worker.stop()
    assert manager.refresh_selection() is True
    assert worker.pid not in manager.selection.pids
    kernel_pids = {k.value for k in manager.probes["dataloader_io"].bpf[b"sel_pid"].keys()}
    assert worker.pid not in kernel_pids


def test_events_are_tagged_and_handed_out_once(manager):
    require(len(os.sched_getaffinity(0) & {0, 1}) == 2, "CPUs 0 and 1 available to this process")
    numa = manager.probes["sched_numa"]
    numa.set_topology(NodeMap({0: [0], 1: [1]}))
    spinner = Spinner(COMM)
    try:
        manager.refresh_selection()
        move(spinner.pid, 0)
        manager.collect(time.time())
        manager.events()
        for i in range(4):
            move(spinner.pid, 1 if i % 2 == 0 else 0)
        manager.collect(time.time())
        events = manager.events()
        again = manager.events()
    finally:
        spinner.stop()
        numa.set_topology(Topology().node_map())
    assert [(e["probe"], e["kind"], e["tgid"], e["comm"], e["orig_node"], e["dest_node"]) for e in events] == [
        ("sched_numa", "cross_numa_migration", spinner.pid, COMM, i % 2, 1 - i % 2) for i in range(4)]
    assert again == []
    line = format_event(events[0])
    assert line.endswith(f"cross-NUMA migration pid={spinner.pid} tid={spinner.pid} ({COMM}) "
                         "cpu0/node0 -> cpu1/node1")
    assert time.strftime("%H:%M:%S", time.localtime(events[0]["time"])) == line.split()[0]
    assert format_event({"kind": "outlier", "time": 0, "pid": 7}).endswith(" outlier pid=7")


def test_deep_probe_switching(manager, tmp_path, monkeypatch):
    source = tmp_path / "getppid_counter.bpf.c"
    source.write_text(DEEP_C)
    monkeypatch.setattr(GetppidCounter, "SOURCE", source)
    real = catalog.probe_class
    monkeypatch.setattr(catalog, "probe_class",
                        lambda name: GetppidCounter if name == "getppid_counter" else real(name))
    now = [1000.0]
    monkeypatch.setattr(manager, "clock", lambda: now[0])

    def deep_events() -> float | None:
        for n, labels, v in manager.collect(now[0]):
            if n == "deep_probe_events_per_s":
                return v
        return None

    assert manager.enable_deep("k1", "getppid_counter", ttl=30, params={"target_pid": os.getpid()}).state == OK
    assert "getppid_counter[k1]" in manager.statuses()
    assert manager.active_deep() == {"k1": {"probe": "getppid_counter", "params": {"target_pid": os.getpid()},
                                            "expires_at": 1030.0, "status": "ok", "events_per_s": None}}
    for _ in range(7):
        os.getppid()
    assert deep_events() == 7

    probe = manager.deep_sessions()["k1"].probe
    now[0] += 20
    manager.enable_deep("k1", "getppid_counter", ttl=30, params={"target_pid": os.getpid()})
    assert manager.deep_sessions()["k1"].probe is probe     # extended, not recompiled
    assert manager.expire_deep(now[0] + 25) == []
    assert manager.expire_deep(now[0] + 30) == ["k1"]
    assert probe.bpf is None and probe.status.state == STOPPED
    os.getppid()
    assert deep_events() is None

    assert manager.enable_deep("k2", "getppid_counter", ttl=5, params={"bogus": 1}).state == UNSUPPORTED
    assert manager.enable_deep("k3", "block_io", ttl=5).state == UNSUPPORTED      # light, always on
    assert manager.enable_deep("k4", "no_such_probe", ttl=5).state == UNSUPPORTED
    assert manager.enable_deep("k5", "getppid_counter", ttl=60, params={"target_pid": 1}).state == OK
    assert manager.disable_deep("k5") is True and manager.disable_deep("k5") is False
    assert manager.deep_sessions() == {}


def test_run_yields_a_batch_per_interval(manager, monkeypatch):
    monkeypatch.setattr(manager, "interval", 0.05)
    worker = Worker()
    batches, selected = [], []
    try:
        for batch in manager.run(should_stop=lambda: len(batches) >= 3, refresh_every=0.01):
            worker.feed(2)
            batches.append(batch)
            selected.append(worker.pid in manager.selection.pids)
    finally:
        worker.stop()
    assert len(batches) == 3
    assert selected[-1], "the periodic refresh never picked the worker up"
    seen = {int(labels["pid"]) for batch in batches for n, labels, _ in batch if n == "dataloader_reads_total"}
    assert worker.pid in seen


def test_sys_root_reaches_the_probes_that_read_the_topology(tmp_path):
    root = two_node_sys(tmp_path / "sys")
    mgr = ProbeManager(Selection(), probes=["sched_numa", "dataloader_io"], sys_root=str(root))
    assert mgr.probes["sched_numa"].topology.nodes == {0: [0], 1: [1]}
    assert ProbeManager(Selection(), probes=["sched_numa"]).probes["sched_numa"].topology.nodes == Topology().nodes()


def test_unavailable_probe_is_unsupported_not_fatal():
    mgr = ProbeManager(Selection(), probes=["no_such_probe"])
    assert mgr.statuses()["no_such_probe"].state == UNSUPPORTED
    assert mgr.collect(time.time()) == []


def test_catalogue_lists_every_probe_and_its_signals():
    assert catalog.names("light")[:3] == ["dataloader_io", "sched_numa", "block_io"]
    assert catalog.names("deep") == ["rdma_qp"]
    for name in catalog.names():
        try:
            cls = catalog.probe_class(name)
        except catalog.ProbeNotAvailable:
            continue            # written elsewhere; listed before it lands
        assert cls.name == name and cls.tier == catalog.entry(name).tier
        for spec in cls.signals:
            assert CATALOGUE.get(spec.name) == spec, f"{name} emits uncatalogued {spec.name}"
    with pytest.raises(catalog.ProbeNotAvailable):
        catalog.probe_class("nope")


def test_proc_scanner_on_fixture_tree(tmp_path):
    def task(pid, tid, comm):
        d = tmp_path / str(pid) / "task" / str(tid)
        d.mkdir(parents=True)
        (d / "comm").write_text(comm + "\n")
        if pid == tid:
            (tmp_path / str(pid) / "comm").write_text(comm + "\n")

    task(10, 10, "python")
    task(10, 11, "pt_data_pin")              # a thread's name does not name its process
    task(20, 20, "pt_data_worker")
    task(20, 21, "pt_data_worker")
    task(30, 30, "a_very_long_nam")           # the kernel keeps 15 bytes
    (tmp_path / "self").mkdir()
    procs = ProcFS(str(tmp_path))
    assert procs.pids() == [10, 20, 30]
    assert procs.threads(20) == [20, 21] and procs.threads(99) == []
    assert procs.find(["pt_data_worker", "pt_data_pin"]) == [20]
    assert procs.find(["a_very_long_name_indeed"]) == [30]
    assert procs.find([]) == []
    assert procs.alive(10) and not procs.alive(99)
