"""PCIe Advanced Error Reporting counters, polled from sysfs: a light-tier probe
with no BPF program, always on where a PCI device reports AER.

A link that retransmits TLPs (replay timer timeouts, replay-number rollovers,
bad TLPs and DLLPs) slows every transfer over it long before anything fails;
the kernel's AER driver counts those errors per device in
``/sys/bus/pci/devices/<addr>/aer_dev_correctable``, ``aer_dev_nonfatal`` and
``aer_dev_fatal``: one ``NAME COUNT`` line per error type, then
``TOTAL_ERR_COR``, ``TOTAL_ERR_NONFATAL`` or ``TOTAL_ERR_FATAL``. Each collect
reads the three files of every device that has them and reports each total as
``pcie_aer_errors_total{dev, severity, numa_node}`` (severity ``correctable``,
``nonfatal`` or ``fatal``; ``numa_node`` from the device's ``numa_node`` file,
``unknown`` where it says -1 or cannot be read), a running count: a policy
reads its growth with ``delta``/``rate``, which take a drop for a reset.

What cannot be read is counted by reason in ``skipped`` and reported as
``pcie_aer_skipped_total{reason}``; the first time for a file and reason it is
logged with the file (and line): ``vanished`` (a file or device that was there
is gone: hot unplug, driver unbind), ``unreadable`` (any other read error),
``malformed`` (a line that is not ``NAME COUNT`` with a count of digits, or a
``numa_node`` that is not a number), ``no-total`` (a file without its
``TOTAL_`` line: no sample for that severity), ``missing`` (a device with some
AER files lacks this one). Other lines and devices go on.

Reading sysfs needs neither bcc, root nor tracefs: this probe overrides
``start``, ``capability`` and ``dump_bpf``, and ``uses_bpf = False`` tells the
node readiness checks (``controller/signals/producers.py``) so. A node where no PCI
device has AER files (a virtual machine's virtio devices, a kernel without
``CONFIG_PCIEAER``) is unsupported, "no AER counters on this node (...)", the
reason ``core.devices`` gives for ``requires: [pcie_aer]``. The sysfs root is
injectable (``takes_sys_root``), so tests use a fixture tree.

Example::

    probe = PcieAer(sys_root="/sys")
    probe.start()               # ok, attach points sysfs:/sys/bus/pci/devices/*/aer_dev_{correctable,nonfatal,fatal}
    probe.collect(now=100.0)    # [("pcie_aer_errors_total", {"node": ..., "dev": "0000:3b:00.0",
                                #    "severity": "correctable", "numa_node": "0"}, 12.0), ...,
                                #  ("pcie_aer_skipped_total", {"node": ..., "reason": "malformed"}, 0.0), ...]

Overhead: per interval, per AER device, three sysfs reads of under 1 kB and one
of ``numa_node`` (~5 us each) after a listing of the PCI devices; no kernel
program, no per-event cost.
"""
from __future__ import annotations

import errno
import logging
import os
from collections import Counter
from pathlib import Path

from reflexarc.core.devices import Devices
from reflexarc.core.input_files import read_kernel_file
from reflexarc.core.signals import SignalSpec

from .probe import OK, UNSUPPORTED, Probe, ProbeStatus, Selection

log = logging.getLogger("reflexarc.probes.pcie_aer")

ERRORS = SignalSpec("pcie_aer_errors_total", "1", ("node", "dev", "severity", "numa_node"), "counter",
                    "PCIe AER errors a device reported (correctable: replayed TLPs and the like; nonfatal, "
                    "fatal: uncorrectable), from sysfs")
SKIPPED = SignalSpec("pcie_aer_skipped_total", "1", ("node", "reason"), "counter",
                     "AER counter files or lines the pcie_aer poller could not use, by reason")

# file -> (severity label, its total line)
SEVERITIES = {"aer_dev_correctable": ("correctable", "TOTAL_ERR_COR"),
              "aer_dev_nonfatal": ("nonfatal", "TOTAL_ERR_NONFATAL"),
              "aer_dev_fatal": ("fatal", "TOTAL_ERR_FATAL")}
SKIP_REASONS = ("vanished", "unreadable", "malformed", "no-total", "missing")
UNKNOWN_NODE = "unknown"
FILES_GLOB = "aer_dev_{correctable,nonfatal,fatal}"
MAX_READ = 1 << 16            # a sysfs attribute is at most a page; more is not an AER file


class PcieAer(Probe):
    name = "pcie_aer"
    tier = "light"
    device = "pcie_aer"             # its signal means nothing on a node without AER counters
    takes_sys_root = True
    uses_bpf = False                # reads sysfs only: no bcc, root or tracefs needed
    signals = (ERRORS, SKIPPED)
    fallback_order = ("sysfs polling of /sys/bus/pci/devices/*/aer_dev_{correctable,nonfatal,fatal}, when a "
                      "device reports AER", "none")

    def __init__(self, selection: Selection | None = None, features=None, node: str = "",
                 sys_root: str = "/sys") -> None:
        super().__init__(selection, features, node)
        self.devices = Devices(sys_root=sys_root)
        self.root = self.devices.pci_root
        self.skipped: Counter[str] = Counter()
        self._told: set[tuple[str, str]] = set()     # (file, reason) already logged
        self._seen: set[str] = set()                 # devices with AER files at the last collect

    def choose_attach_points(self) -> ProbeStatus:
        why = self.devices.missing("pcie_aer")
        if why:
            return ProbeStatus(UNSUPPORTED, why)
        return ProbeStatus(OK, "", [f"sysfs:{self.root}/*/{FILES_GLOB}"])

    # --- life cycle: no program to compile or attach ---------------------------
    def capability(self) -> ProbeStatus:
        return self.choose_attach_points()

    def start(self) -> ProbeStatus:
        self._seen = set()
        self.status = self.choose_attach_points()
        return self.status

    def dump_bpf(self) -> str:
        return (f"// probe: {self.name}\n// no BPF program: polls "
                f"{self.root}/*/{FILES_GLOB} once per interval\n")

    # --- collection --------------------------------------------------------------
    def collect(self, now: float) -> list[tuple[str, dict, float]]:
        if self.status.state != OK:
            return []
        out = []
        seen = set()
        for dev in self.devices.aer_devices():
            seen.add(dev.name)
            numa = self._numa_node(dev)
            for filename, (severity, total_name) in SEVERITIES.items():
                total = self._total(dev / filename, total_name)
                if total is not None:
                    out.append((ERRORS.name, {"node": self.node, "dev": dev.name, "severity": severity,
                                              "numa_node": numa}, float(total)))
        for gone in sorted(self._seen - seen):
            self._skip("vanished", self.root / gone)
        self._seen = seen
        out += [(SKIPPED.name, {"node": self.node, "reason": reason}, float(self.skipped[reason]))
                for reason in SKIP_REASONS]
        return out

    def _skip(self, reason: str, path: Path, line: int | None = None, detail: str = "") -> None:
        self.skipped[reason] += 1
        if (str(path), reason) not in self._told:
            self._told.add((str(path), reason))
            where = f"{path}:{line}" if line else str(path)
            log.warning("%s: %s%s (counted in pcie_aer_skipped_total; told once)", where, reason,
                        f": {detail}" if detail else "")

    def _read(self, path: Path, absent: str | None) -> str | None:
        """The file's text, or None when it cannot be read: counted as ``absent``
        (not at all when None) when it does not exist, else as unreadable."""
        try:
            data = read_kernel_file(path, MAX_READ)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENODEV, errno.ENXIO):
                self._skip("unreadable", path, detail=exc.strerror or str(exc))
            elif absent is not None:
                self._skip(absent, path)
            return None
        if len(data) > MAX_READ:
            self._skip("malformed", path, detail=f"over {MAX_READ} bytes")
            return None
        return data.decode("ascii", errors="replace")

    def _total(self, path: Path, total_name: str) -> int | None:
        """The ``TOTAL_`` count of one AER file; every malformed line is counted."""
        text = self._read(path, "missing" if os.path.isdir(path.parent) else "vanished")
        if text is None:
            return None
        total = None
        for number, line in enumerate(text.splitlines(), 1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 2 or not (fields[1].isascii() and fields[1].isdigit()):
                self._skip("malformed", path, number, f"{line[:60]!r} is not 'NAME COUNT'")
            elif fields[0] == total_name:
                total = int(fields[1])
        if total is None:
            self._skip("no-total", path, detail=f"no {total_name} line")
        return total

    def _numa_node(self, dev: Path) -> str:
        """The device's NUMA node: ``unknown`` for -1 (no affinity), for no file (a
        kernel without NUMA) or for one that cannot be read."""
        text = self._read(dev / "numa_node", None)
        if text is None:
            return UNKNOWN_NODE
        value = text.strip()
        try:
            node = int(value)
        except ValueError:
            self._skip("malformed", dev / "numa_node", 1, f"{value[:60]!r} is not a NUMA node")
            return UNKNOWN_NODE
        return str(node) if node >= 0 else UNKNOWN_NODE
