"""The irq_affinity actuator against this machine's real IRQs: the NIC's MSI-X
vectors (a virtio NIC here: its ``virtioN`` sits below the PCI function that
holds ``msi_irqs``) are moved through the executor and its journal, read back,
moved behind the controller's back (drift), and reverted; every
``/proc/irq/N/smp_affinity_list`` must then read exactly as before. A managed
IRQ (the kernel spreads a block device's queue vectors and makes their file
read-only) is left out and named. Fixture trees cover a NIC without MSI
(found by name in ``/proc/interrupts``) and an IRQ number reused by another
device. Every test that moves a real IRQ puts it back in a ``finally``."""
from __future__ import annotations

import contextlib
import os
import re
import stat
from pathlib import Path

import pytest
from conftest import require, require_root

from reflexarc.actuators.base import PermanentActuatorError, Registry, Target
from reflexarc.actuators.irq_affinity import IrqAffinityActuator
from reflexarc.actuators.specs import SPECS
from reflexarc.controller.engine.clock import SimClock
from reflexarc.controller.engine.executor import Executor
from reflexarc.controller.engine.journal import Journal
from reflexarc.core.cpus import format_cpulist, parse_cpulist

PROC_IRQ = Path("/proc/irq")


def mask(irq: int) -> str:
    return (PROC_IRQ / str(irq) / "smp_affinity_list").read_text().strip()


def writable(irq: int) -> bool:
    return bool((PROC_IRQ / str(irq) / "smp_affinity_list").stat().st_mode & stat.S_IWUSR)


@contextlib.contextmanager
def put_back(irqs: list[int]):
    """Whatever the test does, each IRQ ends as it started."""
    originals = {irq: mask(irq) for irq in irqs}
    try:
        yield originals
    finally:
        for irq, text in originals.items():
            if writable(irq) and mask(irq) != text:
                (PROC_IRQ / str(irq) / "smp_affinity_list").write_text(text)


def pci_function(device: Path) -> Path:
    """The PCI device at or above ``device`` (a virtio device's parent)."""
    return next(d for d in (device, *device.parents) if (d / "subsystem").resolve().name == "pci")


def real_nic() -> str:
    """An interface of this machine with a PCI device holding MSI vectors."""
    for iface in sorted(os.listdir("/sys/class/net")):
        device = Path("/sys/class/net", iface, "device")
        if device.exists() and (pci_function(device.resolve()) / "msi_irqs").is_dir():
            return iface
    require(False, "a network interface with MSI/MSI-X IRQs")


def other_cpu(irqs: list[int]) -> list[int]:
    """One online CPU that differs from every IRQ's mask now."""
    online = parse_cpulist(Path("/sys/devices/system/cpu/online").read_text().strip())
    require(len(online) >= 2, "at least two CPUs")
    return [next(c for c in reversed(online) if any(mask(i) != str(c) for i in irqs))]


def executor(tmp_path, act) -> tuple[Executor, Journal]:
    registry = Registry()
    registry.register(SPECS["irq_affinity"], lambda: act)
    journal = Journal(tmp_path / "journal.jsonl")
    return Executor(registry, journal, SimClock()), journal


@pytest.mark.kernel
def test_the_nics_real_irqs_move_read_back_drift_and_come_back_exactly(tmp_path):
    require_root()
    iface = real_nic()
    act = IrqAffinityActuator()
    target = Target({"job": "llama"}, {"interfaces": [iface]})
    now = act.read_current(target)
    irqs = [e["irq"] for e in now["irqs"]]
    # The same IRQs, told independently: the /proc/interrupts lines that name the NIC's PCI function.
    address = pci_function(Path("/sys/class/net", iface, "device").resolve()).name
    named = [int(line.split(":")[0]) for line in Path("/proc/interrupts").read_text().splitlines()
             if re.search(rf"\b{re.escape(address)}\b", line)]
    assert irqs and sorted(irqs + [m["irq"] for m in now["managed"]]) == sorted(named)
    assert [e["cpus"] for e in now["irqs"]] == [parse_cpulist(mask(i)) for i in irqs]
    ex, journal = executor(tmp_path, act)
    with put_back(irqs) as originals:
        cpus = other_cpu(irqs)
        dry = ex.act("irq_affinity", target, {"cpus": cpus}, "dry-run")
        assert dry.outcome == "planned" and {i: mask(i) for i in irqs} == originals     # nothing touched
        assert f"to CPUs {format_cpulist(cpus)} (explicit list)" in dry.change.summary
        res = ex.act("irq_affinity", target, {"cpus": cpus}, "enforce", policy="p", rule="r")
        assert res.outcome == "applied", res.error
        assert [h["state"] for h in journal.get(res.journal_id).history] == ["intent", "applied"]
        assert {i: mask(i) for i in irqs} == {i: format_cpulist(cpus) for i in irqs}
        assert act.drift(res.change) is None and act.exists(res.change)
        moved = irqs[-1]                                   # someone moves one back behind our back
        (PROC_IRQ / str(moved) / "smp_affinity_list").write_text(originals[moved])
        assert ex.drifted(journal.get(res.journal_id)).startswith(f"IRQ {moved} (")
        (PROC_IRQ / str(moved) / "smp_affinity_list").write_text(format_cpulist(cpus))   # and back again
        assert ex.drifted(journal.get(res.journal_id)) is None
        back = ex.revert_entry(journal.get(res.journal_id))
        assert back.outcome == "reverted", back.error
        assert {i: mask(i) for i in irqs} == originals     # exactly as they were, text for text
        assert journal.open_entries() == []
    journal.close()


@pytest.mark.kernel
def test_reflexarc_act_plans_enforces_journals_and_rolls_back(tmp_path, cli):
    require_root()
    iface = real_nic()
    irqs = [e["irq"] for e in IrqAffinityActuator().read_current(Target(selector={"interfaces": [iface]}))["irqs"]]
    base = ["--state-dir", str(tmp_path), "act", "irq_affinity"]
    with put_back(irqs) as originals:
        cpus = format_cpulist(other_cpu(irqs))
        dry = cli(*base, f"interfaces={iface}", f"cpus={cpus}", check=0).stdout
        assert dry.startswith(f"planned: irq_affinity: move {len(irqs)} IRQ") and f"of {iface} (" in dry
        assert {i: mask(i) for i in irqs} == originals
        applied = cli(*base, f"cpus={cpus}", "--interface", iface, "--mode", "enforce", check=0).stdout
        assert applied.startswith("applied: irq_affinity: ") and {i: mask(i) for i in irqs} == {i: cpus for i in irqs}
        jid = applied.split("journal id ")[1].split(":")[0]
        assert cli("--state-dir", str(tmp_path), "journal", "--check", check=0).stdout.strip().endswith("0 drifted")
        cli("--state-dir", str(tmp_path), "rollback", jid, check=0)
        assert {i: mask(i) for i in irqs} == originals


@pytest.mark.kernel
def test_a_managed_irq_is_left_out_and_named_and_the_others_come_back(tmp_path):
    """A fixture interface whose device is a real PCI function with a managed IRQ
    (a virtio block device here: its request queue's vector)."""
    require_root()
    managed = [int(irq) for irq in sorted(os.listdir(PROC_IRQ)) if irq.isdigit() and not writable(int(irq))]
    owner = next((d for d in sorted(Path("/sys/bus/pci/devices").iterdir()) if (d / "msi_irqs").is_dir()
                  and {int(i) for i in os.listdir(d / "msi_irqs")} & set(managed)), None)
    require(owner is not None, "a PCI device with a managed (read-only) IRQ")
    vectors = sorted(int(i) for i in os.listdir(owner / "msi_irqs"))
    with pytest.raises(OSError):                           # the kernel refuses it indeed
        (PROC_IRQ / str(next(i for i in vectors if i in managed)) / "smp_affinity_list").write_text(
            mask(next(i for i in vectors if i in managed)))
    sys_root = tmp_path / "sys"
    (sys_root / "class" / "net" / "fake0").mkdir(parents=True)
    (sys_root / "class" / "net" / "fake0" / "device").symlink_to(owner.resolve())
    act = IrqAffinityActuator(sys_root=str(sys_root))
    target = Target(selector={"interfaces": ["fake0"]})
    movable = [i for i in vectors if i not in managed]
    if not movable:
        with pytest.raises(PermanentActuatorError, match="no IRQ of fake0 can be moved; left"):
            act.plan(target, {"cpus": [0]})
        return
    with put_back(vectors) as originals:
        change = act.plan(target, {"cpus": other_cpu(movable)})
        assert [e["irq"] for e in change.before["irqs"]] == movable
        assert [m["irq"] for m in change.before["managed"]] == [i for i in vectors if i in managed]
        for irq in change.before["managed"]:
            assert f"left {irq['irq']} ({irq['actions']}) alone: the kernel manages its affinity" in change.summary
        act.apply(change)
        assert act.drift(change) is None
        act.revert(change)
        assert {i: mask(i) for i in vectors} == originals


def fixture_tree(tmp_path) -> tuple[Path, Path]:
    """A NIC eth9 without MSI (its virtio7 device has no msi_irqs): its IRQs are
    the /proc/interrupts lines naming eth9 or virtio7; eth90's is another NIC's."""
    proc, sys_root = tmp_path / "proc", tmp_path / "sys"
    lines = {50: "eth9-TxRx-0", 51: "eth9-TxRx-1", 52: "eth90-TxRx-0", 53: "virtio7-input.0", 54: "virtio70-input"}
    (proc / "interrupts").parent.mkdir(parents=True)
    (proc / "interrupts").write_text("           CPU0       CPU1\n" + "".join(
        f" {irq}:  5  7  IO-APIC  {irq}-edge  {name}\n" for irq, name in lines.items()) + "NMI:  0  0  Non-maskable\n")
    for irq, name in lines.items():
        (proc / "irq" / str(irq) / name).mkdir(parents=True)
        (proc / "irq" / str(irq) / "smp_affinity_list").write_text("0-1\n")
    device = sys_root / "devices" / "virtual-bus" / "virtio7"
    device.mkdir(parents=True)
    (sys_root / "class" / "net" / "eth9").mkdir(parents=True)
    (sys_root / "class" / "net" / "eth9" / "device").symlink_to(device)
    return proc, sys_root


def test_without_msi_the_irqs_are_found_by_name_and_a_reused_number_is_never_written(tmp_path):
    proc, sys_root = fixture_tree(tmp_path)
    act = IrqAffinityActuator(proc_root=str(proc), sys_root=str(sys_root))
    assert act.interface_irqs("eth9") == [50, 51, 53]
    (proc / "irq" / "51" / "smp_affinity_list").chmod(0o444)     # the kernel manages it
    change = act.plan(Target(), {"interfaces": "eth9", "cpus": "1"})
    assert [e["irq"] for e in change.after["irqs"]] == [50, 53] and change.after["irqs"][0]["cpus"] == [1]
    assert change.before["managed"] == [{"irq": 51, "actions": "eth9-TxRx-1"}]
    act.apply(change)
    assert [(proc / "irq" / str(i) / "smp_affinity_list").read_text() for i in (50, 51, 53)] == ["1", "0-1\n", "1"]
    (proc / "irq" / "53" / "virtio7-input.0").rename(proc / "irq" / "53" / "nvme0q1")   # number given to another
    assert act.drift(change) is None and act.exists(change)
    act.revert(change)
    assert (proc / "irq" / "50" / "smp_affinity_list").read_text() == "0-1"
    assert (proc / "irq" / "53" / "smp_affinity_list").read_text() == "1"                  # not ours: untouched


@pytest.mark.parametrize("target, params, words", [
    (Target(), {"interfaces": ["lo"], "cpus": [0]}, "lo has no device of its own"),
    (Target(), {"interfaces": ["nosuch0"], "cpus": [0]}, "no network interface 'nosuch0'"),
    (Target(), {"cpus": [0]}, "needs interfaces (params.interfaces or the selector's)"),
    (Target(selector={"interfaces": ["lo"]}), {"node": 0, "cpus": [0]}, "exactly one of node, cpus, locality"),
    (Target(selector={"interfaces": ["lo"]}), {"locality": True}, "no training process"),
    (Target(selector={"interfaces": ["lo"]}), {"node": 7}, "NUMA node 7"),
])
def test_refusals_say_why(target, params, words):
    with pytest.raises(PermanentActuatorError, match=re.escape(words)):
        IrqAffinityActuator().plan(target, params)


@pytest.mark.kernel
def test_locality_is_the_node_of_the_training_process_memory():
    require_root()
    require(sorted(os.listdir("/sys/devices/system/node")).count("node1") == 0, "a machine of one NUMA node")
    iface = real_nic()
    change = IrqAffinityActuator().plan(Target({"trainer": str(os.getpid())}, {"interfaces": [iface]}),
                                        {"locality": True})
    assert f"holding 100% of the memory of training process {os.getpid()}" in change.summary   # one node here
    assert all(e["cpus"] == parse_cpulist(Path("/sys/devices/system/node/node0/cpulist").read_text().strip())
               for e in change.after["irqs"])
