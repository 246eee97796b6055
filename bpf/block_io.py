"""Loader of ``block_io.bpf.c``: block request latency, count and size mix per
device.

Data loading that hits the disk with many small requests (a shuffled dataset of
small files, a too-small read-ahead) shows as a high share of sub-128 KiB
requests and a rising request latency. The kernel times each request from
``block:block_rq_issue`` to ``block:block_rq_complete`` (matched by device and
sector, since completion runs in interrupt context) into a log-linear histogram
per device, and counts request sizes in power-of-two slots.

Signals, per device (label ``dev``: the kernel name such as ``loop3`` or
``vda`` from ``/sys/dev/block/MAJ:MIN/uevent``, else ``MAJ:MIN``):
``block_rq_latency_us{dev,quantile}`` (per interval), ``block_requests_total{dev}``
(running counter), ``block_small_io_ratio{dev}`` (share of the interval's
requests smaller than ``small_io_bytes``, default 128 KiB; a power of two).

Fallback order: block_rq_issue -> block_rq_complete (ok); block_io_start ->
block_io_done, the accounting tracepoints of 6.5+ (degraded: latency includes
time queued before dispatch); neither (unsupported).

Example::

    probe = BlockIo()
    probe.start()
    ...
    probe.collect(now=time.time())   # [("block_rq_latency_us", {"dev": "vda", "quantile": "0.5", ...}, 180.0), ...]

Overhead: two tracepoint hits per block request (~10 ns each) and three hash
updates; the node's request rate is thousands per second, not millions.
Collect: two batched map reads.
"""
from __future__ import annotations

from collections import defaultdict

from reflexarc.core.signals import SignalSpec

from .loghist import SLOTS, quantiles
from .maps import RunningTotals, drain, drain_hists
from .probe import DEGRADED, OK, UNSUPPORTED, KernelFeatures, Probe, ProbeStatus, Selection

SMALL_IO_BYTES = 128 * 1024
MINOR_BITS = 20  # the kernel's dev_t: major << 20 | minor

TRACEPOINT_PAIRS = (
    ("block_rq_issue", "block_rq_complete", OK, ""),
    ("block_io_start", "block_io_done", DEGRADED,
     "accounting tracepoints only: latency includes time queued before dispatch"),
)


class BlockIo(Probe):
    name = "block_io"
    tier = "light"
    signals = (
        SignalSpec("block_rq_latency_us", "us", ("node", "dev", "quantile"), "gauge",
                   "Block request latency issue to complete, per interval quantile"),
        SignalSpec("block_requests_total", "1", ("node", "dev"), "counter", "Block requests completed"),
        SignalSpec("block_small_io_ratio", "ratio", ("node", "dev"), "gauge",
                   "Share of block requests smaller than 128 KiB"),
    )
    fallback_order = (
        "block:block_rq_issue -> block:block_rq_complete",
        "block:block_io_start -> block:block_io_done (degraded: includes queueing time)",
    )

    def __init__(self, selection: Selection | None = None, features: KernelFeatures | None = None,
                 node: str = "", small_io_bytes: int = SMALL_IO_BYTES, max_devs: int = 256,
                 max_inflight: int = 16384) -> None:
        super().__init__(selection, features, node)
        if small_io_bytes <= 0 or small_io_bytes & (small_io_bytes - 1):
            raise ValueError(f"small_io_bytes must be a power of two, got {small_io_bytes}")
        self.small_slot = small_io_bytes.bit_length() - 1   # slots below hold smaller requests
        self.max_devs = max_devs
        self.max_inflight = max_inflight
        self.requests = RunningTotals()
        self._pair: tuple[str, str] | None = None
        self._names: dict[int, str] = {}

    def cflags(self) -> list[str]:
        issue, done = self._pair or TRACEPOINT_PAIRS[0][:2]
        return [f"-DMAX_DEVS={self.max_devs}", f"-DMAX_INFLIGHT={self.max_inflight}",
                f"-DHIST_SLOTS={SLOTS}", f"-DISSUE_TP={issue}", f"-DDONE_TP={done}"]

    def choose_attach_points(self) -> ProbeStatus:
        for issue, done, state, reason in TRACEPOINT_PAIRS:
            if self.features.has_tracepoint("block", issue) and self.features.has_tracepoint("block", done):
                self._pair = (issue, done)
                return ProbeStatus(state, reason, [f"tracepoint:block:{issue}", f"tracepoint:block:{done}"])
        self._pair = None
        return ProbeStatus(UNSUPPORTED, "no block request tracepoints (block_rq_issue/complete "
                                        "or block_io_start/done)")

    def attach(self) -> None:
        issue, done = self._pair
        self.bpf.attach_tracepoint(tp=f"block:{issue}".encode(), fn_name=b"on_issue")
        self.bpf.attach_tracepoint(tp=f"block:{done}".encode(), fn_name=b"on_done")

    def device_name(self, dev: int) -> str:
        """``vda``/``loop3`` from sysfs, else ``MAJ:MIN``; cached per device."""
        name = self._names.get(dev)
        if name is None:
            majmin = f"{dev >> MINOR_BITS}:{dev & ((1 << MINOR_BITS) - 1)}"
            name = majmin
            try:
                uevent = (self.features.sysfs / "dev" / "block" / majmin / "uevent").read_text()
                for line in uevent.splitlines():
                    if line.startswith("DEVNAME="):
                        name = line.split("=", 1)[1]
            except OSError:
                pass
            self._names[dev] = name
        return name

    def collect(self, now: float) -> list[tuple[str, dict, float]]:
        if self.bpf is None:
            return []
        lat = drain_hists(self.bpf[b"lat_hist"])
        total: dict[int, int] = defaultdict(int)
        small: dict[int, int] = defaultdict(int)
        for key, n in drain(self.bpf[b"size_hist"]):
            total[key.id] += n
            if key.slot < self.small_slot:
                small[key.id] += n
        for dev, n in total.items():
            self.requests.add(dev, n)

        out: list[tuple[str, dict, float]] = []
        for dev, hist in sorted(lat.items()):
            for q, value in quantiles(hist):
                out.append(("block_rq_latency_us", self.labels(dev=self.device_name(dev), quantile=q), value))
        for dev, n in sorted(total.items()):
            out.append(("block_small_io_ratio", self.labels(dev=self.device_name(dev)), small[dev] / n))
        for dev, count in self.requests.items():
            out.append(("block_requests_total", self.labels(dev=self.device_name(dev)), count))
        return out
