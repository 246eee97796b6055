"""RDMA NIC hardware counters, polled from sysfs, as per-second rates.

The last fallback of the ``rdma_qp`` deep probe, and usable alone: RoCE
congestion and loss show in the HCA's own counters under
``/sys/class/infiniband/<dev>/ports/<port>/hw_counters/`` (CNPs sent and
handled, out-of-sequence packets, retransmit timeouts). The poller reads the
wanted counters of every port, and from the second poll on reports
``rdma_hw_counter_rate{dev,port,counter}``. A counter that went down (driver
reset, counter cleared) restarts its baseline instead of reporting a negative
rate. The sysfs root is injectable so tests use a fixture tree.

Example::

    poller = RdmaCounterPoller("/sys/class/infiniband")
    poller.available()            # False on a node without an RDMA device
    poller.poll(now=100.0)        # [] (first poll sets the baseline)
    poller.poll(now=101.0)        # [("rdma_hw_counter_rate",
                                  #   {"dev": "mlx5_0", "port": "1", "counter": "np_cnp_sent"}, 412.0), ...]

Overhead: one small sysfs read per counter per port per poll (~14 files per
port, ~5 us each).
"""
from __future__ import annotations

from pathlib import Path

from reflexarc.core.signals import SignalSpec

SIGNAL = SignalSpec("rdma_hw_counter_rate", "1/s", ("node", "dev", "port", "counter"), "gauge",
                    "Rate of an RDMA hardware counter (cnp, retries, out-of-sequence)")

# Congestion (ECN/CNP), loss and retransmission counters of mlx5 and most RoCE
# drivers; absent files are skipped.
DEFAULT_COUNTERS = (
    "np_cnp_sent", "np_ecn_marked_roce_packets", "rp_cnp_handled", "rp_cnp_ignored",
    "out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "implied_nak_seq_err",
    "duplicate_request", "rnr_nak_retry_err", "roce_adp_retrans", "roce_slow_restart",
    "req_cqe_error", "resp_cqe_error",
)


class RdmaCounterPoller:
    def __init__(self, root: str = "/sys/class/infiniband",
                 counters: tuple[str, ...] = DEFAULT_COUNTERS) -> None:
        self.root = Path(root)
        self.counters = tuple(counters)
        self._last: dict[tuple[str, str, str], tuple[float, int]] = {}

    def files(self) -> list[tuple[str, str, str, Path]]:
        """``(dev, port, counter, path)`` for every wanted counter that exists."""
        found = []
        for counters_dir in sorted(self.root.glob("*/ports/*/hw_counters")):
            port_dir = counters_dir.parent
            dev = port_dir.parent.parent.name
            for name in self.counters:
                path = counters_dir / name
                if path.is_file():
                    found.append((dev, port_dir.name, name, path))
        return found

    def available(self) -> bool:
        return bool(self.files())

    def why_unavailable(self) -> str:
        if not self.root.is_dir():
            return f"no RDMA device ({self.root} does not exist)"
        return f"no hw_counters under {self.root}/*/ports/*"

    def poll(self, now: float) -> list[tuple[str, dict, float]]:
        out = []
        seen = set()
        for dev, port, name, path in self.files():
            try:
                value = int(path.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            key = (dev, port, name)
            seen.add(key)
            last = self._last.get(key)
            self._last[key] = (now, value)
            if last is None or now <= last[0] or value < last[1]:
                continue
            out.append((SIGNAL.name, {"dev": dev, "port": port, "counter": name},
                        (value - last[1]) / (now - last[0])))
        for gone in self._last.keys() - seen:
            del self._last[gone]
        return out
