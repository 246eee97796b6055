"""Loader of ``rdma_qp.bpf.c``: RDMA queue-pair post -> completion latency, the
deep tier's probe (off by default, switched on for a while by ``deep_tracing``).

Matching every post with its completion costs ~5-8 % of a core on a busy NIC,
so this probe runs only on demand. Attach points, best first:

(a) kprobes on the kernel verbs (``mlx5_ib_post_send``, ``mlx5_ib_poll_cq``,
    ``ib_post_send``): needs a kernel with kprobes and struct offsets of the
    running kernel; this probe reports why it does not use them.
(b) uprobes on a user-space verbs provider (or NCCL's copies of it) named in the
    parameters: ``uprobes=["<library>:<post symbol>", "<library>:<poll symbol>"]``,
    functions with the ``ibv_post_send(qp, wr, bad_wr)`` and
    ``ibv_poll_cq(cq, n, wc)`` signatures. Both symbols must be in the ELF.
    The BPF reads only user memory, at libibverbs ABI offsets passed as cflags.
(c) none: ``unsupported``.
Without (a) the state is ``degraded`` even when (b) works. The NIC's error and
hardware counters are not read here: the light tier polls them always
(``rdma_counters``), since they are what switches this probe on. A node with
no device under ``<sys_root>/class/infiniband`` is named in the reason: the
uprobes can attach, but no NIC's queue pairs will pass through them.

The uprobes see every process that calls the probed functions (the task
selection does not narrow them). Only successful completions of work requests
posted while the probe ran are measured; unsignalled requests never complete
and age out of an LRU map.

Signals: ``rdma_qp_completion_latency_us{qp,dev,quantile}`` (per interval, qp is
the QP number), and the tier's cost
``deep_probe_events_per_s{probe="rdma_qp"}`` (BPF program runs per second, from
the second collect on; also kept in ``events_per_s``).

Example::

    probe = RdmaQp(uprobes=["/usr/lib/x86_64-linux-gnu/libmlx5.so.1:mlx5_post_send",
                            "/usr/lib/x86_64-linux-gnu/libmlx5.so.1:mlx5_poll_cq"])
    probe.start()      # degraded (no kprobes ...), attach points: uprobe:..., uretprobe:...
    probe.collect(now) # [("rdma_qp_completion_latency_us", {"qp": "4660", "dev": "mlx5_0",
                       #   "quantile": "0.99", ...}, 412.0), ...]
    probe.stop()       # uprobes removed

Overhead: one compile on start (~1.3 s); three events per post+poll pair (post
uprobe, poll uprobe and uretprobe). A uprobe trap costs 0.14-0.32 us on bare
metal; on the 2-core test VM one event measured ~2 us with its user-memory
reads and map updates, so a proxy thread busy-polling 100 000 times a second
would pay ~0.4 core there: hence on demand, with ``deep_probe_events_per_s``
saying how many. Stop takes ~0.1 s per uprobe (the kernel's unregister waits
for a grace period), ~0.35 s in all.
"""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from reflexarc.core.signals import SignalSpec

from .loghist import SLOTS, quantiles
from .maps import drain
from .probe import DEEP_EVENTS_PER_S, DEGRADED, UNSUPPORTED, Probe, ProbeStatus, Selection

KERNEL_VERBS_SYMBOLS = ("mlx5_ib_post_send", "mlx5_ib_poll_cq", "ib_post_send")

# Offsets of the libibverbs ABI (stable since rdma-core 13) that the BPF reads.
VERBS_ABI = {
    "QP_CONTEXT_OFF": 0, "QP_NUM_OFF": 52,          # struct ibv_qp
    "CQ_CONTEXT_OFF": 0,                            # struct ibv_cq
    "CTX_DEVICE_OFF": 0,                            # struct ibv_context
    "DEV_NAME_OFF": 24,                             # struct ibv_device
    "WR_ID_OFF": 0, "WR_NEXT_OFF": 8,               # struct ibv_send_wr
    "WC_SIZE": 48, "WC_WR_ID_OFF": 0, "WC_STATUS_OFF": 8, "WC_QP_NUM_OFF": 28,  # struct ibv_wc
}


class UprobeTarget:
    """``"<library>:<symbol>"``; the library is a path or a name ldconfig knows."""

    def __init__(self, text: str) -> None:
        library, sep, symbol = str(text).rpartition(":")
        if not sep or not library or not symbol:
            raise ValueError(f"uprobe '{text}' is not '<library>:<symbol>'")
        self.library, self.symbol = library, symbol

    def __str__(self) -> str:
        return f"{self.library}:{self.symbol}"

    def resolve(self) -> str:
        """The library's path when it exists and exports the symbol as a
        function; raises ``LookupError`` saying what is missing."""
        from bcc import BPF
        path = self.library
        if "/" not in path:
            found = BPF.find_library(path.encode())
            if not found:
                raise LookupError(f"library '{path}' not found by ldconfig")
            path = found.decode()
        if not Path(path).is_file():
            raise LookupError(f"library {path} does not exist")
        try:
            hits = BPF.get_user_functions_and_addresses(path.encode(),
                                                        f"^{re.escape(self.symbol)}$".encode())
        except Exception as exc:  # bcc raises a bare Exception for a non-ELF file
            raise LookupError(f"cannot read symbols of {path}: {exc}") from exc
        if not hits:
            raise LookupError(f"symbol {self.symbol} not in {path}")
        return path


class RdmaQp(Probe):
    name = "rdma_qp"
    tier = "deep"
    device = "rdma"                 # needs an RDMA device to observe
    takes_sys_root = True           # where to look for RDMA devices
    signals = (
        SignalSpec("rdma_qp_completion_latency_us", "us", ("node", "qp", "dev", "quantile"), "gauge",
                   "RDMA queue-pair post to completion latency"),
        DEEP_EVENTS_PER_S,
    )
    fallback_order = (
        "kprobes on kernel verbs (" + ", ".join(KERNEL_VERBS_SYMBOLS) + ")",
        "uprobes on user-space verbs post/poll symbols named in params",
        "none",
    )

    def __init__(self, selection: Selection | None = None, features=None, node: str = "",
                 uprobes=(), sys_root: str = "/sys", max_inflight: int = 65536,
                 max_qps: int = 1024, max_wc: int = 16, max_wr_chain: int = 8) -> None:
        super().__init__(selection, features, node)
        targets = [UprobeTarget(u) for u in (uprobes or ())]
        if targets and len(targets) != 2:
            raise ValueError("uprobes takes two '<library>:<symbol>' entries: the post "
                             f"function, then the poll function; got {len(targets)}")
        self.uprobe_targets = targets
        self.infiniband_root = Path(sys_root) / "class" / "infiniband"
        self.max_inflight, self.max_qps = max_inflight, max_qps
        self.max_wc, self.max_wr_chain = max_wc, max_wr_chain
        self.events_per_s: float | None = None
        self._paths: list[str] = []          # resolved (post, poll) libraries
        self._last_events: tuple[float, int] | None = None

    def cflags(self) -> list[str]:
        flags = [f"-DMAX_INFLIGHT={self.max_inflight}", f"-DMAX_QPS={self.max_qps}",
                 f"-DMAX_WC={self.max_wc}", f"-DMAX_WR_CHAIN={self.max_wr_chain}",
                 f"-DHIST_SLOTS={SLOTS}"]
        return flags + [f"-D{k}={v}" for k, v in VERBS_ABI.items()]

    # --- attach-point choice ------------------------------------------------
    def _kernel_verbs_reason(self) -> str:
        """Why (a) is not used (this probe always reports one)."""
        if not self.features.has_kprobes():
            return ("kernel verbs kprobes: kernel built without kprobes "
                    f"(no {self.features.tracefs}/kprobe_events)")
        try:
            kallsyms = (self.features.procfs / "kallsyms").read_text()
        except OSError as exc:
            return f"kernel verbs kprobes: cannot read kallsyms ({exc})"
        missing = [s for s in KERNEL_VERBS_SYMBOLS if not re.search(rf"\s{s}(\s|$)", kallsyms, re.M)]
        if missing:
            return f"kernel verbs kprobes: {', '.join(missing)} not in kallsyms (mlx5_ib not loaded)"
        return ("kernel verbs kprobes: not used, matching completions needs struct ib_qp/ib_wc "
                "offsets of the running kernel and the installed headers do not give them")

    def _uprobe_reason(self) -> str | None:
        """Resolve (b); None when usable."""
        if not self.features.has_uprobes():
            return f"uprobes: kernel without uprobes (no {self.features.tracefs}/uprobe_events)"
        if not self.uprobe_targets:
            return "uprobes: no post/poll symbols given (param 'uprobes')"
        try:
            self._paths = [t.resolve() for t in self.uprobe_targets]
        except LookupError as exc:
            return f"uprobes: {exc}"
        return None

    def choose_attach_points(self) -> ProbeStatus:
        reasons = [self._kernel_verbs_reason()]
        points: list[str] = []
        self._paths = []
        uprobe_reason = self._uprobe_reason()
        if uprobe_reason:
            reasons.append(uprobe_reason)
        else:
            (post_lib, poll_lib), (post, poll) = self._paths, self.uprobe_targets
            points += [f"uprobe:{post_lib}:{post.symbol}", f"uprobe:{poll_lib}:{poll.symbol}",
                       f"uretprobe:{poll_lib}:{poll.symbol}"]
        if not any(self.infiniband_root.glob("*")):
            reasons.append(f"no RDMA device under {self.infiniband_root}")
        state = DEGRADED if points else UNSUPPORTED
        return ProbeStatus(state, "; ".join(reasons), points)

    def capability(self) -> ProbeStatus:
        """Before any session: degraded when uprobes can serve one."""
        status = super().capability()
        if status.state != UNSUPPORTED or self.uprobe_targets or not self.features.has_uprobes():
            return status
        if self.features.missing_prerequisite():
            return status
        reason = status.reason.replace("uprobes: no post/poll symbols given (param 'uprobes')",
                                       "uprobes: ready for the verbs/NCCL post and poll symbols a policy names")
        return ProbeStatus(DEGRADED, reason, ["uprobe+uretprobe on demand (library:symbol from the policy)"]
                           + status.attach_points)

    # --- life cycle ------------------------------------------------------------
    def start(self) -> ProbeStatus:
        self._last_events = None
        self.events_per_s = None
        return super().start()

    def attach(self) -> None:
        (post_lib, poll_lib), (post, poll) = [p.encode() for p in self._paths], self.uprobe_targets
        try:
            self.bpf.attach_uprobe(name=post_lib, sym=post.symbol.encode(), fn_name=b"on_post")
            self.bpf.attach_uprobe(name=poll_lib, sym=poll.symbol.encode(), fn_name=b"on_poll")
            self.bpf.attach_uretprobe(name=poll_lib, sym=poll.symbol.encode(), fn_name=b"on_poll_return")
        except Exception:
            self.bpf.cleanup()
            self.bpf = None
            raise

    # --- collection --------------------------------------------------------------
    def collect(self, now: float) -> list[tuple[str, dict, float]]:
        if self.bpf is None:
            return []
        return self._latency() + self._events(now)

    def _labels(self, **extra) -> dict:
        """Node plus ``extra``: the RDMA signals carry no job label (a NIC and its
        QPs serve whatever runs on the node)."""
        return {"node": self.node, **{k: str(v) for k, v in extra.items()}}

    def _latency(self) -> list[tuple[str, dict, float]]:
        devs = {(k.context, k.tgid): bytes(v.name).split(b"\0")[0].decode(errors="replace")
                for k, v in self.bpf[b"ctx_name"].items()}
        hists: dict[tuple[str, int], dict[int, int]] = defaultdict(lambda: defaultdict(int))
        for k, n in drain(self.bpf[b"lat_hist"]):
            dev = devs.get((k.context, k.tgid), "")
            hists[(dev, k.qp_num)][k.slot] += n
        out = []
        for (dev, qp), hist in sorted(hists.items()):
            for q, value in quantiles(hist):
                out.append(("rdma_qp_completion_latency_us",
                            self._labels(qp=qp, dev=dev, quantile=q), value))
        return out

    def _events(self, now: float) -> list[tuple[str, dict, float]]:
        total = int(self.bpf[b"events"].sum(0).value)
        last, self._last_events = self._last_events, (now, total)
        if last is None or now <= last[0]:
            return []
        self.events_per_s = (total - last[1]) / (now - last[0])
        return [("deep_probe_events_per_s", self._labels(probe=self.name), self.events_per_s)]
