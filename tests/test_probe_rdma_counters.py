"""rdma_counters, the light tier's RDMA NIC counters, polled from sysfs.

An RDMA NIC cannot exist here (no InfiniBand/RoCE hardware, no rxe in this
kernel), so the counters come from a fixture sysfs tree: ``fixtures/infiniband``
(a copy of the ``/sys/class/infiniband`` layout of two mlx5 ports) placed at
``<sys_root>/class/infiniband``, with a port error counter added; the test
writes new values between collects as the NIC would. What the node can
produce, and what ``explain`` says of the RDMA policy, is checked against the
same kind of fixture roots, with and without a device.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reflexarc.bpf import catalog
from reflexarc.bpf.manager import ProbeManager
from reflexarc.bpf.probe import OK, UNSUPPORTED, KernelFeatures, Selection
from reflexarc.bpf.rdma_counters import RdmaCounters
from reflexarc.controller.policy.explain import explain
from reflexarc.controller.policy.loader import load_policies
from reflexarc.controller.signals.producers import PROBE, NodeFacts, Producer
from reflexarc.controller.signals.catalogue import producers_of, why_unproduced
from reflexarc.controller.signals.catalogue import CATALOGUE
from reflexarc.core.devices import Devices

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SIGNAL = "rdma_hw_counter_rate"


@pytest.fixture
def sys_root(tmp_path: Path) -> Path:
    """A sysfs tree with two RDMA devices (mlx5_0, mlx5_1), one port each."""
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "infiniband", root / "class" / "infiniband")
    (port(root, "mlx5_0") / "counters" / "symbol_error").write_text("7\n")
    return root


def port(sys_root: Path, dev: str) -> Path:
    return sys_root / "class" / "infiniband" / dev / "ports" / "1"


def rates(out: list) -> dict:
    assert all(name == SIGNAL for name, _, _ in out), out
    return {(labels["dev"], labels["port"], labels["counter"]): value for _, labels, value in out}


def test_counters_are_read_as_rates_across_two_collects(sys_root):
    # no tracefs, no bcc: reading sysfs needs neither
    probe = RdmaCounters(features=KernelFeatures(tracefs=str(sys_root / "no-tracefs")), node="n1",
                         sys_root=str(sys_root))
    status = probe.start()
    infiniband = sys_root / "class" / "infiniband"
    assert status.state == OK, status
    assert status.attach_points == [f"sysfs:{infiniband}/*/ports/*/counters",
                                    f"sysfs:{infiniband}/*/ports/*/hw_counters"]
    assert probe.bpf is None
    assert probe.collect(100.0) == []                   # the first collect sets the baselines

    (port(sys_root, "mlx5_0") / "hw_counters" / "np_cnp_sent").write_text("1500\n")       # was 1200
    (port(sys_root, "mlx5_0") / "hw_counters" / "local_ack_timeout_err").write_text("4\n")  # was 0
    (port(sys_root, "mlx5_0") / "counters" / "symbol_error").write_text("9\n")            # was 7
    out = probe.collect(102.0)
    got = rates(out)
    assert got[("mlx5_0", "1", "np_cnp_sent")] == 150.0
    assert got[("mlx5_0", "1", "local_ack_timeout_err")] == 2.0
    assert got[("mlx5_0", "1", "symbol_error")] == 1.0                 # a port counter (counters/)
    assert got[("mlx5_0", "1", "rp_cnp_handled")] == 0.0
    assert got[("mlx5_1", "1", "packet_seq_err")] == 0.0
    assert ("mlx5_0", "1", "rx_atomic_requests") not in got             # not a watched counter
    assert ("mlx5_0", "1", "port_xmit_data") not in got                 # nor the data counter
    for _, labels, _ in out:
        assert labels["node"] == "n1" and set(labels) <= set(CATALOGUE[SIGNAL].labels), labels
    probe.stop()
    assert probe.collect(103.0) == []


def test_a_reset_or_missing_counter_restarts_its_baseline(sys_root):
    probe = RdmaCounters(node="n1", sys_root=str(sys_root))
    probe.start()
    probe.collect(100.0)
    hw = port(sys_root, "mlx5_0") / "hw_counters"
    (hw / "out_of_sequence").write_text("5\n")          # was 15: the counter was cleared
    (hw / "packet_seq_err").unlink()                    # gone (driver reload)
    (hw / "rp_cnp_handled").write_text("n/a\n")         # a read the driver refuses
    got = rates(probe.collect(101.0))
    assert not {"out_of_sequence", "packet_seq_err", "rp_cnp_handled"} & {c for d, _, c in got if d == "mlx5_0"}
    assert got[("mlx5_0", "1", "np_cnp_sent")] == 0.0   # the others go on

    (hw / "out_of_sequence").write_text("8\n")          # counts from the new baseline
    (hw / "packet_seq_err").write_text("40\n")          # back: a new baseline, no rate yet
    (hw / "rp_cnp_handled").write_text("900\n")
    got = rates(probe.collect(102.0))
    assert got[("mlx5_0", "1", "out_of_sequence")] == 3.0
    assert ("mlx5_0", "1", "packet_seq_err") not in got and ("mlx5_0", "1", "rp_cnp_handled") not in got
    (hw / "packet_seq_err").write_text("46\n")
    assert rates(probe.collect(104.0))[("mlx5_0", "1", "packet_seq_err")] == 3.0


def test_no_rdma_device_is_unsupported_with_the_reason(tmp_path):
    root = tmp_path / "sys"
    probe = RdmaCounters(sys_root=str(root))
    for status in (probe.capability(), probe.start()):
        assert status.state == UNSUPPORTED and status.reason == f"no RDMA device under {root}/class/infiniband"
    assert probe.collect(1.0) == []
    (root / "class" / "infiniband" / "mlx5_0" / "ports" / "1").mkdir(parents=True)   # a device without counters
    assert RdmaCounters(sys_root=str(root)).start().reason.startswith("no watched counter under")


def test_the_light_tier_polls_them_from_the_managers_sys_root(sys_root):
    assert catalog.entry("rdma_counters").tier == catalog.LIGHT
    mgr = ProbeManager(Selection(job="llama"), probes=["rdma_counters"], sys_root=str(sys_root), node="n1")
    assert "// probe: rdma_counters\n// no BPF program" in mgr.dump_bpf()
    try:
        assert mgr.start()["rdma_counters"].state == OK
        mgr.collect(100.0)
        (port(sys_root, "mlx5_1") / "hw_counters" / "out_of_sequence").write_text("10\n")
        got = rates(mgr.collect(101.0))
    finally:
        mgr.stop()
    assert got[("mlx5_1", "1", "out_of_sequence")] == 10.0


def node_facts(tmp_path: Path, sys_root: Path) -> NodeFacts:
    (tmp_path / "dev").mkdir(exist_ok=True)
    return NodeFacts(Devices(dev_root=str(tmp_path / "dev"), sys_root=str(sys_root)))


def test_the_node_produces_the_counters_in_the_light_tier_where_a_device_exists(tmp_path, sys_root, repo_root):
    """Only the light probe produces the counters, so the rule that switches the
    deep tier on can fire; on a node without a device, exactly that is said."""
    assert producers_of(SIGNAL) == (Producer(PROBE, "rdma_counters", device="rdma"),)
    assert str(producers_of(SIGNAL)[0]) == "probe rdma_counters (light tier, always on)"
    assert why_unproduced(SIGNAL, node_facts(tmp_path, sys_root)) is None

    bare = tmp_path / "bare-sys"
    (bare / "class" / "infiniband").mkdir(parents=True)
    assert why_unproduced(SIGNAL, node_facts(tmp_path, bare)) == (
        f"probe rdma_counters (light tier, always on): no RDMA device (nothing in {bare}/class/infiniband)")
    [policy] = [p for p in load_policies([str(repo_root / "policies")]) if p.name == "rdma-deep-tracing"]
    text = " ".join(explain([policy], node_facts(tmp_path, bare), False).split())
    assert (f"from probe rdma_counters (light tier, always on): not here: no RDMA device (nothing in "
            f"{bare}/class/infiniband)") in text
    assert "from probe rdma_qp (deep tier, on demand): not here: no RDMA device" in text
    with_device = " ".join(explain([policy], node_facts(tmp_path, sys_root), False).split())
    assert "from probe rdma_counters (light tier, always on): can run here" in with_device
