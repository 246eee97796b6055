"""pcie_aer, the light tier's PCIe AER counters polled from sysfs, and the
shipped policy that alerts on them (policies/pcie-aer-alert.yaml).

The counting and the bad-input handling run on fixture sysfs trees built here
in the kernel's format (``drivers/pci/pcie/aer.c``: ``NAME COUNT`` lines, then
``TOTAL_ERR_COR``/``TOTAL_ERR_NONFATAL``/``TOTAL_ERR_FATAL``) at
``<sys_root>/bus/pci/devices/<addr>/``: several devices, garbage content, a
file that cannot be read, a device that vanishes. One test reads this machine's
real ``/sys/bus/pci/devices``: where a device there reports AER, the probe's
totals must be the files' own; where none does (a virtual machine's virtio
devices), the probe, ``validate`` and ``explain`` must say "no AER counters on
this node" and the policy must be idle. The policy's alerts are checked in
simulated time on scenario pcie-aer-errors (the plant stands in for sysfs) and
by its policy unit tests (policies/tests/pcie-aer-alert.yaml).
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import run_cli

from reflexarc.bpf import catalog
from reflexarc.bpf.manager import ProbeManager
from reflexarc.bpf.pcie_aer import ERRORS, SKIP_REASONS, SKIPPED, PcieAer
from reflexarc.bpf.probe import OK, UNSUPPORTED, KernelFeatures, Selection
from reflexarc.controller.runtime.policy_tests import run_policy_tests
from reflexarc.controller.signals.producers import PROBE, NodeFacts, Producer
from reflexarc.controller.signals.catalogue import producers_of
from reflexarc.controller.signals.catalogue import CATALOGUE
from reflexarc.controller.runtime.simulate import run_scenario
from reflexarc.core.devices import Devices
from reflexarc.simulations import check_expectation, load_scenario

ROOT = Path(__file__).resolve().parents[1]
POLICY = ROOT / "policies" / "pcie-aer-alert.yaml"
COR = ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF")
UNCOR = ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF", "MalfTLP", "ECRC",
         "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr",
         "PoisonTLPBlocked")
NO_AER = "no AER counters on this node"


def aer_text(names: tuple[str, ...], total: str, counts: dict[str, int] | None = None) -> str:
    counts = counts or {}
    return "".join(f"{n} {counts.get(n, 0)}\n" for n in names) + f"{total} {sum(counts.values())}\n"


def device(sys_root: Path, addr: str, numa: str | None, cor: dict | None = None, nonfatal: dict | None = None,
           fatal: dict | None = None) -> Path:
    d = sys_root / "bus" / "pci" / "devices" / addr
    d.mkdir(parents=True, exist_ok=True)
    if numa is not None:
        (d / "numa_node").write_text(numa + "\n")
    (d / "aer_dev_correctable").write_text(aer_text(COR, "TOTAL_ERR_COR", cor))
    (d / "aer_dev_nonfatal").write_text(aer_text(UNCOR, "TOTAL_ERR_NONFATAL", nonfatal))
    (d / "aer_dev_fatal").write_text(aer_text(UNCOR, "TOTAL_ERR_FATAL", fatal))
    return d


@pytest.fixture
def sys_root(tmp_path: Path) -> Path:
    """A NIC (node 0) replaying TLPs, a GPU (node 1) with a completion timeout, a
    root port with no NUMA affinity, and a virtio device with no AER files."""
    root = tmp_path / "sys"
    device(root, "0000:3b:00.0", "0", cor={"Timeout": 40, "Rollover": 2, "BadTLP": 5})
    device(root, "0000:86:00.0", "1", nonfatal={"CmpltTO": 1})
    device(root, "0000:00:01.0", "-1")
    virtio = root / "bus" / "pci" / "devices" / "0000:00:04.0"
    virtio.mkdir(parents=True)
    (virtio / "numa_node").write_text("-1\n")
    return root


def totals(out: list) -> dict:
    return {(labels["dev"], labels["severity"], labels["numa_node"]): value
            for name, labels, value in out if name == ERRORS.name}


def skipped(out: list) -> dict:
    return {labels["reason"]: value for name, labels, value in out if name == SKIPPED.name}


def test_totals_per_device_and_severity_with_the_numa_node(sys_root):
    # no tracefs, no bcc: reading sysfs needs neither
    probe = PcieAer(features=KernelFeatures(tracefs=str(sys_root / "no-tracefs")), node="n1", sys_root=str(sys_root))
    status = probe.start()
    pci = sys_root / "bus" / "pci" / "devices"
    assert status.state == OK, status
    assert status.attach_points == [f"sysfs:{pci}/*/aer_dev_{{correctable,nonfatal,fatal}}"]
    assert probe.bpf is None
    out = probe.collect(100.0)
    assert totals(out) == {
        ("0000:00:01.0", "correctable", "unknown"): 0.0, ("0000:00:01.0", "nonfatal", "unknown"): 0.0,
        ("0000:00:01.0", "fatal", "unknown"): 0.0,
        ("0000:3b:00.0", "correctable", "0"): 47.0, ("0000:3b:00.0", "nonfatal", "0"): 0.0,
        ("0000:3b:00.0", "fatal", "0"): 0.0,
        ("0000:86:00.0", "correctable", "1"): 0.0, ("0000:86:00.0", "nonfatal", "1"): 1.0,
        ("0000:86:00.0", "fatal", "1"): 0.0,
    }
    assert skipped(out) == dict.fromkeys(SKIP_REASONS, 0.0)
    for name, labels, _ in out:
        assert labels["node"] == "n1" and set(labels) == set(CATALOGUE[name].labels), labels

    device(sys_root, "0000:3b:00.0", "0", cor={"Timeout": 52, "Rollover": 2, "BadTLP": 5})   # the link replays on
    assert totals(probe.collect(101.0))[("0000:3b:00.0", "correctable", "0")] == 59.0
    probe.stop()
    assert probe.collect(102.0) == []


def test_bad_content_is_counted_by_reason_and_located_never_raised(sys_root, caplog):
    """Garbage lines, a file without its total, binary junk, a file that cannot be
    read, a missing file, a NUMA node that is no number, a FIFO and an endless file
    where an attribute should be: each counted, told once with the file (and
    line), nothing blocks, and every good total still read."""
    pci = sys_root / "bus" / "pci" / "devices"
    gpu = pci / "0000:86:00.0"
    (gpu / "aer_dev_nonfatal").write_text("DLP 0\nthis is not a counter\nCmpltTO -3\nCmpltTO 1\n"
                                          "TOTAL_ERR_NONFATAL 1\n")
    (gpu / "aer_dev_correctable").write_bytes(b"\x00\xff\xfe garbage\n\x89PNG\r\n")
    (gpu / "numa_node").write_text("node one\n")
    port = pci / "0000:00:01.0"
    (port / "aer_dev_fatal").unlink()                             # a device with two of the three files
    (port / "aer_dev_nonfatal").unlink()
    (port / "aer_dev_nonfatal").mkdir()                           # a read fails (EISDIR)
    odd = device(sys_root, "0000:d8:00.0", "1")
    (odd / "aer_dev_fatal").unlink()
    os.mkfifo(odd / "aer_dev_fatal")                              # no writer: reads empty, never blocks
    (odd / "aer_dev_nonfatal").write_text("CmpltTO 1\n" * 10_000)   # 100 kB: no sysfs attribute
    probe = PcieAer(node="n1", sys_root=str(sys_root))
    probe.start()
    with caplog.at_level(logging.WARNING, logger="reflexarc.probes.pcie_aer"):
        out = probe.collect(100.0)
        again = probe.collect(101.0)
    got = totals(out)
    assert got[("0000:86:00.0", "nonfatal", "unknown")] == 1.0                  # the good lines still count
    assert ("0000:86:00.0", "correctable", "unknown") not in got                 # no total, no sample
    assert got[("0000:00:01.0", "correctable", "unknown")] == 0.0
    assert not {k for k in got if k[0] == "0000:00:01.0" and k[1] != "correctable"}
    assert got[("0000:3b:00.0", "correctable", "0")] == 47.0                     # the other devices go on
    assert got[("0000:d8:00.0", "correctable", "1")] == 0.0
    assert not {k for k in got if k[0] == "0000:d8:00.0" and k[1] != "correctable"}
    assert skipped(out) == {"vanished": 0.0, "unreadable": 1.0, "malformed": 6.0, "no-total": 2.0, "missing": 1.0}
    assert skipped(again) == {"vanished": 0.0, "unreadable": 2.0, "malformed": 12.0, "no-total": 4.0,
                              "missing": 2.0}                                    # counted at every read
    told = [r.getMessage() for r in caplog.records]
    assert len(told) == 8, told                                  # each (file, reason) once: its first line
    assert any(m.startswith(f"{gpu}/aer_dev_nonfatal:2: malformed: 'this is not a counter'") for m in told), told
    assert any(m.startswith(f"{gpu}/aer_dev_correctable: no-total: no TOTAL_ERR_COR line") for m in told), told
    assert any(m.startswith(f"{gpu}/numa_node:1: malformed: 'node one' is not a NUMA node") for m in told), told
    assert any(m.startswith(f"{port}/aer_dev_nonfatal: unreadable: Is a directory") for m in told), told
    assert any(m.startswith(f"{port}/aer_dev_fatal: missing") for m in told), told
    assert any(m.startswith(f"{odd}/aer_dev_fatal: no-total: no TOTAL_ERR_FATAL line") for m in told), told
    assert any(m.startswith(f"{odd}/aer_dev_nonfatal: malformed: over 65536 bytes") for m in told), told


def test_a_vanished_device_stops_its_series_and_is_counted_once(sys_root):
    probe = PcieAer(node="n1", sys_root=str(sys_root))
    probe.start()
    probe.collect(100.0)
    shutil.rmtree(sys_root / "bus" / "pci" / "devices" / "0000:86:00.0")        # hot unplug
    out = probe.collect(101.0)
    assert {dev for dev, _, _ in totals(out)} == {"0000:3b:00.0", "0000:00:01.0"}
    assert skipped(out)["vanished"] == 1.0
    assert skipped(probe.collect(102.0))["vanished"] == 1.0                      # once, not every interval
    device(sys_root, "0000:86:00.0", "1", nonfatal={"CmpltTO": 1})               # back (rescan)
    assert totals(probe.collect(103.0))[("0000:86:00.0", "nonfatal", "1")] == 1.0


def test_no_aer_file_is_unsupported_with_the_reason(tmp_path):
    root = tmp_path / "sys"
    (root / "bus" / "pci" / "devices" / "0000:00:04.0").mkdir(parents=True)     # virtio: no aer_* files
    probe = PcieAer(sys_root=str(root))
    want = f"{NO_AER} (no aer_dev_* file in {root}/bus/pci/devices/*)"
    for status in (probe.capability(), probe.start()):
        assert status.state == UNSUPPORTED and status.reason == want
    assert probe.collect(1.0) == []
    assert Devices(sys_root=str(root)).missing("pcie_aer") == want
    assert PcieAer(sys_root=str(tmp_path / "no-sys")).start().reason.startswith(NO_AER)


def test_the_light_tier_polls_them_from_the_managers_sys_root(sys_root):
    assert catalog.entry("pcie_aer").tier == catalog.LIGHT
    assert "pcie_aer" in catalog.names(catalog.LIGHT)
    mgr = ProbeManager(Selection(job="llama"), probes=["pcie_aer"], sys_root=str(sys_root), node="n1")
    assert "// probe: pcie_aer\n// no BPF program" in mgr.dump_bpf()
    try:
        assert mgr.start()["pcie_aer"].state == OK
        got = totals(mgr.collect(100.0))
    finally:
        mgr.stop()
    assert got[("0000:3b:00.0", "correctable", "0")] == 47.0


def rx(*args: str) -> subprocess.CompletedProcess:
    """The command line, with an alert receiver (none is contacted: validate and explain send nothing)."""
    return run_cli("--webhook-url", "http://127.0.0.1:9/alerts", *args)


def test_validate_and_explain_follow_the_sys_root(tmp_path, sys_root):
    """With AER counters the policy can run; without, it is idle and both say why."""
    assert producers_of(ERRORS.name) == (Producer(PROBE, "pcie_aer", device="pcie_aer"),)
    ready = rx("--sys-root", str(sys_root), "validate", "--node", str(POLICY))
    assert ready.returncode == 0 and "note:" not in ready.stdout and "warning:" not in ready.stdout, ready.stdout
    text = " ".join(rx("--sys-root", str(sys_root), "explain", "--node", str(POLICY)).stdout.split())
    assert "from probe pcie_aer (light tier, always on): can run here" in text, text
    assert "readiness here: nothing keeps it from working on this node." in text, text

    bare = tmp_path / "bare"
    (bare / "bus" / "pci" / "devices" / "0000:00:04.0").mkdir(parents=True)
    idle = rx("--sys-root", str(bare), "validate", "--node", str(POLICY))
    assert idle.returncode == 0, idle.stdout + idle.stderr
    assert (f"note: policy pcie-aer-alert requires pcie_aer: idle on this node: {NO_AER} (no aer_dev_* file in "
            f"{bare}/bus/pci/devices/*)") in idle.stdout, idle.stdout
    text = " ".join(rx("--sys-root", str(bare), "explain", "--node", str(POLICY)).stdout.split())
    assert "It needs a PCIe device reporting AER counters (requires: pcie_aer): on a node without one it is idle" \
        in text, text
    assert f"from probe pcie_aer (light tier, always on): not here: {NO_AER}" in text, text
    assert "for one device and NUMA node (by: dev, numa_node" in text, text
    assert 'the increase of pcie_aer_errors_total{severity=~"correctable|nonfatal"} over 5 m is above 0' in text


def test_this_machine_s_pci_devices():
    """The real /sys: a device reporting AER gives its files' totals; with none
    (virtio), the probe is unsupported and the policy idle, saying so."""
    pci = Path("/sys/bus/pci/devices")
    assert pci.is_dir(), "missing capability: /sys/bus/pci/devices (sysfs with a PCI bus)"
    aer = Devices().aer_devices()
    probe = PcieAer(node="n1")
    status = probe.start()
    validate = rx("validate", "--node", str(POLICY))
    explain = " ".join(rx("explain", "--node", str(POLICY)).stdout.split())
    assert validate.returncode == 0, validate.stdout + validate.stderr
    if aer:
        assert status.state == OK, status
        got = totals(probe.collect(1.0))
        for dev in aer:
            for filename, severity, total in (("aer_dev_correctable", "correctable", "TOTAL_ERR_COR"),
                                              ("aer_dev_nonfatal", "nonfatal", "TOTAL_ERR_NONFATAL"),
                                              ("aer_dev_fatal", "fatal", "TOTAL_ERR_FATAL")):
                if (dev / filename).exists():
                    line = next(x for x in (dev / filename).read_text().splitlines() if x.startswith(total))
                    value = [v for (d, s, _), v in got.items() if d == dev.name and s == severity]
                    assert value and value[0] <= int(line.split()[1]), (dev, severity)   # counts only grow
        assert "note:" not in validate.stdout, validate.stdout
        assert NodeFacts().missing("pcie_aer") is None
    else:
        want = f"{NO_AER} (no aer_dev_* file in {pci}/*)"
        assert status.state == UNSUPPORTED and status.reason == want, status
        assert probe.collect(1.0) == []
        assert f"note: policy pcie-aer-alert requires pcie_aer: idle on this node: {want}" in validate.stdout, \
            validate.stdout
        assert f"from probe pcie_aer (light tier, always on): not here: {want}" in explain, explain
        assert f"idle on this node: {want}" in explain, explain


@pytest.mark.parametrize("mode", ["alert-only", "enforce", "dry-run"])
def test_the_policy_alerts_each_device_once_with_its_numa_node_in_simulated_time(mode):
    """Scenario pcie-aer-errors: a NIC's correctable errors from 3 min, a GPU's
    non-fatal ones from 7 min, a quiet root port; the plant stands in for sysfs."""
    sc = load_scenario("pcie-aer-errors")
    result = run_scenario(sc, mode=mode)
    assert check_expectation(sc.expect[mode], result.actions(), result.plant) == []
    raised = [(a["ts"], a["target"]) for a in result.actions() if a["outcome"] in ("notified", "planned")]
    assert raised == [(180.0, "dev=0000:3b:00.0,numa_node=0"), (428.0, "dev=0000:86:00.0,numa_node=1")]


def test_the_policy_unit_tests_pass():
    assert run_policy_tests([str(ROOT / "policies" / "tests" / "pcie-aer-alert.yaml")]) == 0
