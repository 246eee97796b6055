"""RDMA NIC error and hardware counters, polled from sysfs: a light-tier probe
with no BPF program, always on where an RDMA device exists.

RoCE/InfiniBand congestion, loss and link trouble show in the NIC's own
counters: the port counters of the IB performance-management agent under
``/sys/class/infiniband/<dev>/ports/<port>/counters/`` (symbol errors, link
downs, receive errors, discards) and the driver's hardware counters under
``.../hw_counters/`` (CNPs sent and handled, out-of-sequence packets,
retransmit timeouts). They are what tells a policy to switch the deep tier's
per-QP matching (``rdma_qp``) on, so they must be read without it. Each
collect reads the watched counters of every port and, from the second collect
on, reports ``rdma_hw_counter_rate{dev,port,counter}`` per second. A counter
that went down (driver reset, counter cleared) or could not be read restarts
its baseline instead of reporting a negative or made-up rate; one that
disappeared is forgotten. The signals carry no job: a NIC serves whatever runs
on the node.

``Probe.start()`` compiles and attaches a program and needs root and tracefs;
reading sysfs needs neither, so this probe overrides ``start``,
``capability`` and ``dump_bpf``, and ``uses_bpf = False`` tells the node
readiness checks (``controller/signals/producers.py``) that bcc is not needed either.
With no device under ``<sys_root>/class/infiniband`` it is unsupported: "no
RDMA device under /sys/class/infiniband". The sysfs root is injectable
(``takes_sys_root``), so tests use a fixture tree.

Example::

    probe = RdmaCounters(sys_root="/sys")
    probe.start()               # ok, attach points sysfs:/sys/class/infiniband/*/ports/*/counters, ...
    probe.collect(now=100.0)    # [] (the first collect sets the baselines)
    probe.collect(now=101.0)    # [("rdma_hw_counter_rate", {"node": ..., "dev": "mlx5_0", "port": "1",
                                #    "counter": "np_cnp_sent"}, 412.0), ...]

Overhead: per interval one small sysfs read per watched counter per port (~26
files, ~5 us each) and a directory walk; no kernel program, no per-event cost.
"""
from __future__ import annotations

from pathlib import Path

from reflexarc.core.signals import SignalSpec

from .probe import OK, UNSUPPORTED, Probe, ProbeStatus, Selection

SIGNAL = SignalSpec("rdma_hw_counter_rate", "1/s", ("node", "dev", "port", "counter"), "gauge",
                    "Rate of an RDMA NIC port error or hardware counter (link errors, cnp, retries, "
                    "out-of-sequence)")

COUNTER_DIRS = ("counters", "hw_counters")

# Error counters of the IB port (counters/, every RDMA driver) and congestion,
# loss and retransmission counters of mlx5 and most RoCE drivers (hw_counters/);
# absent files are skipped.
DEFAULT_COUNTERS = (
    "symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors", "port_rcv_remote_physical_errors",
    "port_xmit_discards", "local_link_integrity_errors", "excessive_buffer_overrun_errors",
    "port_rcv_constraint_errors", "port_xmit_constraint_errors", "VL15_dropped", "port_xmit_wait",
    "np_cnp_sent", "np_ecn_marked_roce_packets", "rp_cnp_handled", "rp_cnp_ignored",
    "out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "implied_nak_seq_err",
    "duplicate_request", "rnr_nak_retry_err", "roce_adp_retrans", "roce_slow_restart",
    "req_cqe_error", "resp_cqe_error",
)

CounterKey = tuple[str, str, str]     # (dev, port, counter)


class RdmaCounters(Probe):
    name = "rdma_counters"
    tier = "light"
    device = "rdma"                 # its signal means nothing on a node without an RDMA device
    takes_sys_root = True
    uses_bpf = False                # reads sysfs only: no bcc, root or tracefs needed
    signals = (SIGNAL,)
    fallback_order = ("sysfs polling of /sys/class/infiniband/*/ports/*/{counters,hw_counters}, "
                      "when the node has an RDMA device", "none")

    def __init__(self, selection: Selection | None = None, features=None, node: str = "",
                 sys_root: str = "/sys", counters: tuple[str, ...] = DEFAULT_COUNTERS) -> None:
        super().__init__(selection, features, node)
        self.root = Path(sys_root) / "class" / "infiniband"
        self.counters = tuple(counters)
        self._last: dict[CounterKey, tuple[float, int]] = {}

    # --- what there is to read ---------------------------------------------
    def files(self) -> dict[CounterKey, Path]:
        """Every watched counter that exists, by (dev, port, counter)."""
        found = {}
        for directory in COUNTER_DIRS:
            for counters_dir in sorted(self.root.glob(f"*/ports/*/{directory}")):
                port_dir = counters_dir.parent
                for name in self.counters:
                    path = counters_dir / name
                    if path.is_file():
                        found[(port_dir.parent.parent.name, port_dir.name, name)] = path
        return found

    def choose_attach_points(self) -> ProbeStatus:
        if not any(self.root.glob("*")):
            return ProbeStatus(UNSUPPORTED, f"no RDMA device under {self.root}")
        dirs = sorted({path.parent.name for path in self.files().values()})
        if not dirs:
            return ProbeStatus(UNSUPPORTED, f"no watched counter under {self.root}/*/ports/*/"
                                            f"{{{','.join(COUNTER_DIRS)}}}")
        return ProbeStatus(OK, "", [f"sysfs:{self.root}/*/ports/*/{d}" for d in dirs])

    # --- life cycle: no program to compile or attach ---------------------------
    def capability(self) -> ProbeStatus:
        return self.choose_attach_points()

    def start(self) -> ProbeStatus:
        self._last = {}
        self.status = self.choose_attach_points()
        return self.status

    def dump_bpf(self) -> str:
        return (f"// probe: {self.name}\n// no BPF program: polls "
                f"{self.root}/*/ports/*/{{{','.join(COUNTER_DIRS)}}} once per interval\n")

    # --- collection --------------------------------------------------------------
    def collect(self, now: float) -> list[tuple[str, dict, float]]:
        if self.status.state != OK:
            return []
        out = []
        values = {key: value for key, value in ((k, _read(p)) for k, p in self.files().items())
                  if value is not None}
        for key, value in sorted(values.items()):
            last = self._last.get(key)
            if last is not None and now > last[0] and value >= last[1]:
                dev, port, counter = key
                labels = {"node": self.node, "dev": dev, "port": port, "counter": counter}
                out.append((SIGNAL.name, labels, (value - last[1]) / (now - last[0])))
        self._last = {key: (now, value) for key, value in values.items()}
        return out


def _read(path: Path) -> int | None:
    """A counter's value; None when it vanished or does not read as a number
    (some drivers fail reads of counters the firmware does not support)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
