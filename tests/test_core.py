"""The bottom layer, ``reflexarc.core``: the parsers every layer shares, the
/proc reader, and the signal declarations the catalogue is assembled from."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from test_actuator_affinity import fake_proc

from reflexarc.actuators import hooks
from reflexarc.bpf import catalog
from reflexarc.controller.signals.catalogue import CATALOGUE, EXTERNAL, assemble
from reflexarc.core.cpus import format_cpulist, parse_cpulist
from reflexarc.core.dscp import dscp_code, dscp_name
from reflexarc.core.durations import DurationError, parse_duration
from reflexarc.core.params import EVIDENCE_PARAM, ActuatorSpec, ParamError, ParamSpec, check_params, convert
from reflexarc.core.ports import format_port_ranges, port_range, port_ranges
from reflexarc.core.procfs import ProcFS, ProcStat
from reflexarc.core.signals import SignalSpec, suggest
from reflexarc.core.targets import target_key
from reflexarc.core.topology import NO_NODE, NodeMap, Topology, TopologyError, normalise_pci_address

CORE = Path(__file__).resolve().parents[1] / "core"


# ---- durations -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, seconds", [
    ("250ms", 0.25), ("30s", 30.0), ("5m", 300.0), ("1h", 3600.0), ("1h30m", 5400.0), ("2d", 172800.0),
    ("1d2h3m4s5ms", 93784.005), ("1.5s", 1.5), (" 10s ", 10.0), ("90", 90.0), ("0", 0.0),
    (45, 45.0), (0.5, 0.5),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "5 min", "5min", "30s5m", "1h1h", "ms", "-5s", "1e3s", "abc", -1,
                                 float("inf"), float("nan"), True, None, [1]])
def test_bad_durations_show_an_example(bad):
    with pytest.raises(DurationError) as info:
        parse_duration(bad)
    assert "e.g. '250ms', '30s', '5m', '1h30m'" in str(info.value)


def test_duration_messages_say_what_is_wrong():
    with pytest.raises(DurationError, match="bad duration '5 min': use a number with a unit"):
        parse_duration("5 min")
    with pytest.raises(DurationError, match="is negative"):
        parse_duration("-5s")
    with pytest.raises(DurationError, match="not finite"):
        parse_duration(float("inf"))
    with pytest.raises(DurationError, match="got bool True"):
        parse_duration(True)


# ---- CPU lists -------------------------------------------------------------------------------

def test_cpulist_notation_roundtrips():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpulist([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    for text in ("0", "0-1", "0,2,4", "0-3,8,10-11", "1-2,5-6,9"):
        assert format_cpulist(parse_cpulist(text)) == text
    assert parse_cpulist(" 0 - 2 , 5 ") == [0, 1, 2, 5]
    assert parse_cpulist("") == [] and parse_cpulist("\n") == [] and format_cpulist([]) == ""
    assert parse_cpulist([3, 1, 1]) == [1, 3] and parse_cpulist(()) == []
    assert format_cpulist({5, 4, 7}) == "4-5,7"


@pytest.mark.parametrize("bad, words", [
    ("3-1", "runs backwards"), ("a", "'a' is not a CPU or a range"), ("0,,2", "'' is not a CPU"),
    ("1-", "'1-' is not a CPU"), ("-1", "'-1' is not a CPU"), ([0, -1], "CPU numbers are integers >= 0"),
    ([True], "bad CPU True"), (["0"], "bad CPU '0'"), (7, "bad CPU list 7"),
])
def test_bad_cpulists_name_the_bad_part(bad, words):
    with pytest.raises(ValueError, match=words) as info:
        parse_cpulist(bad)
    if isinstance(bad, str):
        assert "e.g. '0-15' or '0-3,8'" in str(info.value)


# ---- port ranges -----------------------------------------------------------------------------

def test_port_ranges_in_every_spelling():
    assert port_ranges(["29500-29510", 443, "80", [1, 2], (7, 7)]) == [(29500, 29510), (443, 443), (80, 80),
                                                                      (1, 2), (7, 7)]
    assert port_ranges("80, 8000-8080") == [(80, 80), (8000, 8080)]
    assert port_ranges(443) == [(443, 443)] and port_ranges(None) == [] and port_ranges([]) == []
    assert port_ranges(((29500, 29500), (29600, 29610))) == [(29500, 29500), (29600, 29610)]
    assert port_range(" 70 - 80 ") == (70, 80) and port_range(65535) == (65535, 65535)
    assert format_port_ranges([(443, 443), (29500, 29510)]) == "443,29500-29510"
    assert format_port_ranges(port_ranges("1-2,3")) == "1-2,3"


@pytest.mark.parametrize("bad, message", [
    ("80-70", "bad port range '80-70': ports are 1-65535 and lo <= hi"),
    (0, "bad port range '0'"), (70000, "bad port range '70000'"), ([9, 1], "bad port range '9-1'"),
    ("http", "bad port 'http': use a port (12345) or a range 'lo-hi' ('29500-29510')"),
    (True, "bad port 'True'"), (1.5, "bad port '1.5'"), ([1, 2, 3], "bad port '[1, 2, 3]'"),
])
def test_bad_port_ranges(bad, message):
    with pytest.raises(ValueError) as info:
        port_range(bad)
    assert message in str(info.value)
    with pytest.raises(ValueError, match="bad port"):
        port_ranges(["443", bad])


# ---- DSCP ------------------------------------------------------------------------------------

def test_dscp_names_and_numbers():
    assert dscp_code("AF41") == 34 and dscp_code("ef") == 46 and dscp_code("CS1") == 8
    assert dscp_code("LE") == 1 and dscp_code(63) == 63 and dscp_code("0") == 0
    assert dscp_name(46) == "EF" and dscp_name(34) == "AF41" and dscp_name(5) == "5"
    for bad in ("AF44", "64", "-1", "fast", True, 64):
        with pytest.raises(ValueError, match=r"bad DSCP .*: use a name \(CS0, .*\) or a number 0-63"):
            dscp_code(bad)


# ---- parameter conversion --------------------------------------------------------------------

def P(kind: str, **kw) -> ParamSpec:
    return ParamSpec("p", kind, **kw)


@pytest.mark.parametrize("kind, value, out", [
    ("str", "x", "x"), ("str", 5, "5"), ("str", 1.5, "1.5"),
    ("int", 3, 3), ("int", "42", 42), ("int", " -7 ", -7),
    ("float", 2, 2.0), ("float", "2.5", 2.5), ("float", 0.25, 0.25),
    ("bool", True, True), ("bool", "yes", True), ("bool", "False", False), ("bool", "0", False),
    ("duration", "1h30m", 5400.0), ("duration", 90, 90.0), ("duration", "250ms", 0.25),
    ("dscp", "CS1", 8), ("dscp", "af41", 34), ("dscp", 46, 46), ("dscp", "46", 46),
    ("int_list", [3, 1, 3], [1, 3]), ("int_list", "0-2,5", [0, 1, 2, 5]),
    ("str_list", ["eth1", "eth0", "eth1"], ["eth1", "eth0"]), ("str_list", "a, b,,c", ["a", "b", "c"]),
    ("str_list", "eth0", ["eth0"]), ("str_list", [1, "x"], ["1", "x"]),
    ("port_range", ["29500-29510", 443], [(29500, 29510), (443, 443)]), ("port_range", "1-2,7", [(1, 2), (7, 7)]),
    ("mapping", {"a": 1, 2: "b"}, {"a": 1, "2": "b"}), ("mapping", '{"factor": 4}', {"factor": 4}),
])
def test_convert_gives_each_type_its_canonical_form(kind, value, out):
    assert convert(P(kind), value) == out
    assert convert(P(kind), None) is None
    assert convert(P(kind), out) == out, "a canonical form converts to itself"


@pytest.mark.parametrize("kind, value, message", [
    ("str", ["a"], "['a'] is not a valid str"), ("str", True, "True is not a valid str"),
    ("int", "zero", "'zero' is not a valid int"), ("int", 1.5, "'1.5' is not a valid int"),
    ("int", True, "'True' is not a valid int"),
    ("float", "fast", "'fast' is not a valid float"), ("float", "inf", "'inf' is not a finite number"),
    ("float", False, "False is not a valid float"),
    ("bool", "maybe", "'maybe' is not a valid bool: use true or false"), ("bool", 1, "'1' is not a valid bool"),
    ("duration", "5 min", "bad duration '5 min'"), ("duration", "-1s", "is negative"),
    ("dscp", "AF99", "bad DSCP 'AF99'"), ("dscp", 64, "bad DSCP '64'"),
    ("int_list", "3-1", "runs backwards"), ("int_list", [-1], "bad CPU -1"),
    ("str_list", {"a": 1}, "is not a valid str_list"),
    ("port_range", ["9-1"], "bad port range '9-1'"),
    ("mapping", "[1]", "[1] is not a valid mapping"), ("mapping", "{oops", "'{oops' is not a valid mapping"),
    ("mapping", ["a"], "['a'] is not a valid mapping"),
    ("colour", "red", "parameter type 'colour' is unknown"),
])
def test_convert_rejects_what_does_not_fit(kind, value, message):
    with pytest.raises(ParamError) as info:
        convert(P(kind), value)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


def test_choices_are_checked_after_conversion():
    level = P("str", choices=("info", "warning"))
    assert convert(level, "info") == "info"
    with pytest.raises(ParamError, match="'warn' is not one of info, warning"):
        convert(level, "warn")
    assert convert(P("int", choices=(1, 2)), "2") == 2


SPEC = ActuatorSpec("dscp", "retag flows", (ParamSpec("dscp", "dscp", required=True),
                                            ParamSpec("ports", "port_range"),
                                            ParamSpec("ttl", "duration")), accepts_evidence=True)


def test_check_params_converts_each_and_names_what_is_wrong():
    assert check_params(SPEC, {"dscp": "CS1", "ports": "443", "ttl": "5m"}) == {
        "dscp": 8, "ports": [(443, 443)], "ttl": 300.0}
    evidence = [{"signal": "tcp_srtt_us"}]
    assert check_params(SPEC, {"dscp": 46, EVIDENCE_PARAM: evidence})[EVIDENCE_PARAM] is evidence
    assert check_params(SPEC, {"ports": [80]}, partial=True) == {"ports": [(80, 80)]}
    with pytest.raises(ParamError, match="actuator 'dscp' needs parameter 'dscp'"):
        check_params(SPEC, {"ports": [80]})
    with pytest.raises(ParamError, match="actuator 'dscp' has no parameter 'prots'; it takes dscp, ports, ttl"):
        check_params(SPEC, {"dscp": "EF", "prots": [80]})
    with pytest.raises(ParamError, match="parameter 'ttl' of 'dscp': bad duration 'soon'"):
        check_params(SPEC, {"dscp": "EF", "ttl": "soon"})
    plain = ActuatorSpec("log", "log", (ParamSpec("message", "str"),))
    with pytest.raises(ParamError, match="has no parameter 'evidence'"):
        check_params(plain, {EVIDENCE_PARAM: []})


# ---- target keys -----------------------------------------------------------------------------

def test_target_key_is_sorted_labels_or_a_star():
    assert target_key({"trainer": "4242", "rank": "0"}) == "rank=0,trainer=4242"
    assert target_key({"pid": 7}) == "pid=7"
    assert target_key({}) == "*"


# ---- /proc -----------------------------------------------------------------------------------

def test_procfs_on_a_fixture_tree(tmp_path):
    root = tmp_path / "proc"
    train = "0::/system.slice/train.service\n4:cpuset:/\n"
    fake_proc(root, 1, "systemd", 0, "0::/init.scope\n")
    fake_proc(root, 100, "python", 1, train)
    (root / "100" / "cmdline").write_bytes(b"python\0train.py\0--lr\0003e-4\0")
    fake_proc(root, 101, "pt_data_worker", 100, "0::/system.slice/train.service/loader\n")
    fake_proc(root, 102, "pt_data_worker", 100, train, tids=(105,), start=7777)
    (root / "102" / "cmdline").write_bytes(b"")
    fake_proc(root, 200, "pt_data_worker", 1, "0::/system.slice/other.service\n")
    fake_proc(root, 210, "pt_data_worker", 1, "0::/system.slice/train.service2\n")   # a sibling, not below
    fake_proc(root, 300, "a_very_long_nam", 100, train, start=1000)   # the kernel keeps 15 bytes
    fake_proc(root, 400, "a) (b", 100, train, start=4242)
    (root / "self").mkdir()
    procfs = ProcFS(str(root))
    workers = ("pt_data_worker",)
    assert procfs.pids() == [1, 100, 101, 102, 105, 200, 210, 300, 400], "every numeric entry; 105 has a status only"
    assert procfs.find(workers) == [101, 102, 200, 210]
    assert procfs.find(workers, pids=[100]) == [101, 102]
    assert procfs.find(workers, cgroup="/system.slice/train.service/") == [101, 102]
    assert procfs.find(workers, pid=105) == [102], "a thread id names its process"
    assert procfs.find(workers, pids=[100], pid=200) == []
    assert procfs.find(["a_very_long_name_indeed"]) == [300]
    assert procfs.find(("a) (b",), pids=[1]) == [400] and procfs.find([]) == []
    assert procfs.stat(400) == ProcStat(100, 4242) and procfs.start_time(102, 105) == 7777
    assert procfs.stat(999) is None and procfs.start_time(102, 999) is None
    assert procfs.comm(400) == "a) (b" and procfs.comm(999) is None
    assert procfs.threads(102) == [102, 105] and procfs.threads(999) == []
    assert procfs.tgid(105) == 102 and procfs.tgid(999) is None
    assert procfs.ancestors(101) == [101, 100, 1] and procfs.ancestors(999) == [999]
    assert procfs.descends_from(101, [100]) and not procfs.descends_from(200, [100])
    assert procfs.cgroups(102) == ["/system.slice/train.service", "/"]
    assert procfs.in_cgroup(101, "system.slice/train.service") and not procfs.in_cgroup(200, "/system.slice/train")
    assert procfs.alive(102, 7777) and not procfs.alive(102, 7778) and not procfs.alive(999, 7777)
    assert procfs.alive(102, 7777, tid=105) and not procfs.alive(102, 5000, tid=105)
    assert procfs.alive(102) and not procfs.alive(999), "without a start time: the process exists"
    assert procfs.cmdline(100) == ["python", "train.py", "--lr", "3e-4"]
    assert procfs.cmdline(102) == [] and procfs.cmdline(999) == []


def test_procfs_reads_the_real_proc_for_this_process():
    procfs = ProcFS()
    me = os.getpid()
    started = threading.Event()
    stop = threading.Event()
    tids = []

    def run():
        tids.append(threading.get_native_id())
        started.set()
        stop.wait(10)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        started.wait(10)
        assert me in procfs.pids()
        assert {me, tids[0]} <= set(procfs.threads(me))
        assert procfs.tgid(tids[0]) == me
        st = procfs.stat(me)
        assert st.ppid == os.getppid() and st.start > 0
        assert procfs.start_time(me, tids[0]) >= st.start
        assert procfs.alive(me, st.start) and not procfs.alive(me, st.start + 1) and procfs.alive(me)
        comm = Path("/proc/self/comm").read_text().rstrip("\n")
        assert procfs.comm(me) == comm
        assert me in procfs.find([comm], pids=[os.getppid()])
        assert procfs.find([comm], pid=tids[0]) == [me]
        assert procfs.ancestors(me)[:2] == [me, os.getppid()]
        want = [line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()]
        assert procfs.cgroups(me) == want
        assert procfs.in_cgroup(me, want[-1])
        assert procfs.cmdline(me)[0] == Path("/proc/self/cmdline").read_bytes().split(b"\0")[0].decode()
    finally:
        stop.set()
        thread.join()


# ---- NUMA topology -------------------------------------------------------------------------------
def sysfs(root: Path, nodes: dict[str, str] | None = None, online: str | None = None,
          devices: dict[str, str] | None = None) -> Path:
    """A fixture sysfs: node name -> cpulist, cpu/online, PCI address -> numa_node."""
    for node, cpus in (nodes or {}).items():
        (root / "devices/system/node" / node).mkdir(parents=True)
        (root / "devices/system/node" / node / "cpulist").write_text(cpus + "\n")
    if online is not None:
        (root / "devices/system/cpu").mkdir(parents=True)
        (root / "devices/system/cpu/online").write_text(online + "\n")
    for addr, node in (devices or {}).items():
        (root / "bus/pci/devices" / addr).mkdir(parents=True)
        (root / "bus/pci/devices" / addr / "numa_node").write_text(node + "\n")
    return root


def test_topology_of_two_nodes(tmp_path):
    root = sysfs(tmp_path, {"node1": "4-7", "node0": "0-3,8", "nodeX": "9", "node1a": "10"}, online="0-8")
    (root / "devices/system/node/node2").mkdir()          # a node directory without a cpulist
    topo = Topology(str(root))
    assert topo.nodes() == {0: [0, 1, 2, 3, 8], 1: [4, 5, 6, 7]}
    assert topo.node_cpus(1) == [4, 5, 6, 7]
    assert topo.node_of(8) == 0 and topo.node_of(5) == 1 and topo.node_of(9) == NO_NODE
    assert topo.node_map().cpu_nodes(10) == [0, 0, 0, 0, 1, 1, 1, 1, 0, NO_NODE]
    assert topo.online_cpus() == list(range(9))
    with pytest.raises(TopologyError, match=r"no NUMA node 7 \(nodes: 0, 1\)"):
        topo.node_cpus(7)


def test_topology_is_read_afresh(tmp_path):
    root = sysfs(tmp_path, {"node0": "0-1"}, online="0-1")
    topo = Topology(root)
    (root / "devices/system/cpu/online").write_text("0\n")      # CPU 1 unplugged
    assert topo.online_cpus() == [0]


def test_topology_without_node_directory_is_one_node_of_online_cpus(tmp_path):
    topo = Topology(sysfs(tmp_path, online="0-2,5"))
    assert topo.nodes() == {0: [0, 1, 2, 5]}
    assert topo.node_cpus(0) == [0, 1, 2, 5] and topo.node_of(5) == 0 and topo.node_of(3) == NO_NODE
    assert Topology(tmp_path / "nothing").nodes() == {0: [0]}
    assert Topology(tmp_path / "nothing").online_cpus() is None


def test_topology_with_offline_cpus(tmp_path):
    topo = Topology(sysfs(tmp_path, {"node0": "0-1", "node1": "2-3"}, online="0-1,3"))
    assert topo.nodes() == {0: [0, 1], 1: [2, 3]}        # nodes list their offline CPUs too
    assert topo.online_cpus() == [0, 1, 3]
    assert Topology(sysfs(tmp_path / "flat", online="0,2-3")).nodes() == {0: [0, 2, 3]}


def test_pci_device_numa_node(tmp_path):
    topo = Topology(sysfs(tmp_path, {"node0": "0"}, devices={"0000:3b:00.0": "1", "0000:5e:00.0": "-1"}))
    assert topo.device_node("0000:3b:00.0") == 1
    assert topo.device_node(" 3B:00.0 ") == 1                 # domain optional, any case
    assert topo.device_node("0000:5e:00.0") is None           # -1: no affinity information
    with pytest.raises(TopologyError, match="no PCI device 0000:aa:00.0 under"):
        topo.device_node("aa:00.0")
    for bad in ("../../x", "0000:3b:00.8", "3b:00"):
        with pytest.raises(TopologyError, match="is not a PCI address"):
            topo.device_node(bad)
    assert normalise_pci_address("ABCD:3b:1F.7") == "abcd:3b:1f.7"


def test_node_map_given_outright():
    nodes = NodeMap({1: [3, 1], 0: [0]})
    assert nodes.nodes == {0: [0], 1: [1, 3]} and nodes.cpus() == [0, 1, 3]
    assert nodes.cpu_nodes(5) == [0, 1, NO_NODE, 1, NO_NODE]
    with pytest.raises(ValueError, match="more than one node"):
        NodeMap({0: [0, 1], 1: [1]})


def test_machine_topology_covers_the_cpus_this_process_may_use():
    topo = Topology()
    assert set(topo.node_map().cpus()) >= os.sched_getaffinity(0)
    assert set(topo.online_cpus()) >= os.sched_getaffinity(0)


# ---- signals ---------------------------------------------------------------------------------

def test_signal_specs_check_their_kind_and_labels():
    spec = SignalSpec("x_total", "1", ("node",), "counter", "x")
    assert spec.labels == ("node",)
    with pytest.raises(ValueError, match="kind 'level' is not one of gauge, counter"):
        SignalSpec("x", "1", ("node",), "level", "x")
    with pytest.raises(ValueError, match="labels must be a tuple"):
        SignalSpec("x", "1", "node job", "gauge", "x")
    assert suggest("dataloader_read_latency", CATALOGUE) == "dataloader_read_latency_us"
    assert suggest("zzz", CATALOGUE) is None


def test_the_catalogue_is_what_probes_hooks_and_external_sources_declare():
    """A probe's declaration is what reaches policies: every signal every probe
    class in bpf/catalog.py declares is in the catalogue as declared, and
    nothing else is there but the hooks' and the external signals."""
    declared = []
    for entry in catalog.ENTRIES:
        cls = catalog.probe_class(entry.name)
        assert cls.signals, f"probe {entry.name} declares no signals"
        for spec in cls.signals:
            assert isinstance(spec, SignalSpec)
            assert CATALOGUE[spec.name] == spec, f"probe {entry.name}: {spec.name}"
            declared.append(spec)
    external = [spec for spec, _ in EXTERNAL]
    for spec in (*hooks.SIGNALS, *external):
        assert CATALOGUE[spec.name] == spec
    assert set(CATALOGUE) == {s.name for s in (*declared, *hooks.SIGNALS, *external)}


def test_loader_signals_carry_the_training_process_and_its_rank():
    for name in ("dataloader_read_latency_us", "dataloader_reads_total", "dataloader_runq_latency_us",
                 "numa_migrations_total", "numa_cross_migrations_total", "numa_remote_ratio"):
        assert {"pid", "trainer", "rank"} <= set(CATALOGUE[name].labels), name


def test_two_declarations_of_a_signal_must_agree():
    a = SignalSpec("x", "1", ("node",), "gauge", "x")
    assert assemble([("one", [a]), ("two", [a])]) == {"x": a}
    b = SignalSpec("x", "ms", ("node",), "gauge", "x")
    with pytest.raises(ValueError, match="signal 'x' is declared differently by one .* and two"):
        assemble([("one", [a]), ("two", [b])])


# ---- layering --------------------------------------------------------------------------------

def _imported(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\n"
                          "print(' '.join(m for m in sys.modules if m.split('.')[0] == 'reflexarc'))"],
                         capture_output=True, text=True, timeout=60, check=True)
    return set(out.stdout.split())


def test_core_imports_nothing_else_of_reflexarc():
    modules = sorted(f"reflexarc.core.{p.stem}" for p in CORE.glob("*.py") if p.stem != "__init__")
    assert "reflexarc.core.procfs" in modules and "reflexarc.core.params" in modules
    loaded = _imported("".join(f"import {m}\n" for m in modules))
    assert loaded == {"reflexarc", "reflexarc.core", *modules}


def test_the_hooks_module_needs_only_the_core_signals():
    loaded = _imported("import reflexarc.actuators.hooks")
    assert loaded == {"reflexarc", "reflexarc.actuators", "reflexarc.actuators.hooks", "reflexarc.core",
                      "reflexarc.core.signals"}


def test_lower_layers_never_import_upward():
    """core imports nothing of reflexarc; bpf, actuators and simulations (the testbed
    included: it runs the controller through its command line) never the controller."""
    for layer, banned in (("core", ("reflexarc.",)), ("bpf", ("reflexarc.controller",)),
                          ("actuators", ("reflexarc.controller",)), ("simulations", ("reflexarc.controller",))):
        for path in (CORE.parent / layer).rglob("*.py"):
            tree = ast.parse(path.read_text())
            names = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
            names += [node.module for node in ast.walk(tree)
                      if isinstance(node, ast.ImportFrom) and node.module and not node.level]
            if layer == "core":
                assert not any(n == "reflexarc" or n.startswith(banned) for n in names), path
            else:
                assert not any(n.startswith(banned) for n in names), (path, names)
