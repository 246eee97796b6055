"""Loader of ``gpu_submit.bpf.c``: NVIDIA driver submissions per process.

Every NVIDIA user-space driver call that submits work is an ``ioctl`` whose type
byte is ``'F'`` (0x46). The probe counts those ioctls of selected processes on
``syscalls:sys_enter_ioctl`` and keeps, in the kernel, a histogram of the gap
between consecutive submissions of each process. A GPU starved by its input
pipeline shows a falling rate and a widening gap long before utilisation
counters (sampled every second or so) move.

Signals: ``gpu_submit_rate_hz{pid}`` and ``gpu_submit_gap_us{pid,quantile}``;
the probe manager adds the job, rank and pod of each pid.

Whose submissions: the node's training processes (``Selection.trainers``, which
the probe manager fills from job discovery at every refresh), plus any pids or
cgroup ids a policy selector names explicitly. The selection's thread names are
not used: they name DataLoader workers, which feed the GPU but do not submit
to it. ``update_selection`` rewrites the selection maps without recompiling;
an empty selection (no training process found, nothing named) watches every
process (only GPU clients issue 'F' ioctls).

Example::

    probe = GpuSubmit(Selection(trainers=(4242,)))
    probe.start()
    probe.collect(now=time.time())          # opens the first interval
    ...
    for name, labels, value in probe.collect(now=time.time()):
        ...
    probe.update_selection(Selection(trainers=(4242, 4300)))   # a second job started

On a node without an NVIDIA GPU (no ``/dev/nvidia<N>``) there is nothing to
observe, and the probe attaches nothing: status unsupported, with the reason
(a syscall tracepoint is not free, see below).

Overhead: one tracepoint hit per ioctl on the node (~10 ns of BPF and a type
test); an 'F' ioctl adds the selection look-up (a pid hash, plus a cgroup id
hash when cgroups are named), a selected one three hash operations more. Any
syscall tracepoint also sends every syscall through the kernel's traced entry
path (a small fixed cost per syscall, shared with the other syscall probes).
Collect: two batched map reads.
"""
from __future__ import annotations

from reflexarc.core.devices import Devices
from reflexarc.core.signals import SignalSpec

from .loghist import SLOTS, quantiles
from .maps import drain, drain_hists, sync_selection
from .probe import OK, UNSUPPORTED, Probe, ProbeStatus, Selection

NVIDIA_IOCTL_TYPE = 0x46  # 'F'
MAX_SELECTED = 1024


def submitters(selection: Selection) -> Selection:
    """The part of ``selection`` whose GPU submissions count: the training
    processes and the explicitly named pids, by tgid, and the named cgroups."""
    return Selection(pids=tuple(sorted({*selection.trainers, *selection.pids})),
                     cgroup_ids=selection.cgroup_ids)


class GpuSubmit(Probe):
    name = "gpu_submit"
    tier = "light"
    device = "gpu"                  # its signals mean nothing on a node without an NVIDIA GPU
    takes_dev_root = True           # the constructor takes ``dev_root=``, where the GPU device nodes are
    signals = (
        SignalSpec("gpu_submit_rate_hz", "1/s", ("node", "job", "rank", "pod", "pid"), "gauge",
                   "NVIDIA driver ioctl submissions per second"),
        SignalSpec("gpu_submit_gap_us", "us", ("node", "job", "rank", "pod", "pid", "quantile"), "gauge",
                   "Gap between consecutive submissions, per interval quantile"),
    )
    fallback_order = ("tracepoint syscalls:sys_enter_ioctl, when the node has an NVIDIA GPU", "none")

    def __init__(self, selection: Selection | None = None, features=None, node: str = "",
                 max_pids: int = 4096, dev_root: str = "/dev") -> None:
        super().__init__(selection, features, node)
        self.max_pids = max_pids
        self.devices = Devices(dev_root=dev_root)
        self._last_collect: float | None = None

    def cflags(self) -> list[str]:
        return [f"-DIOCTL_TYPE={NVIDIA_IOCTL_TYPE:#x}", f"-DMAX_PIDS={self.max_pids}",
                f"-DMAX_SELECTED={MAX_SELECTED}", f"-DHIST_SLOTS={SLOTS}"]

    def choose_attach_points(self) -> ProbeStatus:
        no_gpu = self.devices.missing(self.device)
        if no_gpu:
            return ProbeStatus(UNSUPPORTED, f"{no_gpu}: nothing to observe, nothing attached")
        if self.features.has_tracepoint("syscalls", "sys_enter_ioctl"):
            return ProbeStatus(OK, "", ["tracepoint:syscalls:sys_enter_ioctl"])
        return ProbeStatus(UNSUPPORTED, "no syscalls:sys_enter_ioctl tracepoint "
                                        "(kernel built without CONFIG_FTRACE_SYSCALLS)")

    def attach(self) -> None:
        # TRACEPOINT_PROBE attached when the program loaded; install the
        # selection and drop whatever was counted before it applied.
        self.update_selection(self.selection)
        self.bpf[b"submits"].clear()
        self.bpf[b"gap_hist"].clear()
        self._last_collect = None

    def update_selection(self, selection: Selection) -> None:
        self.selection = selection
        if self.bpf is not None:
            sync_selection(self.bpf, submitters(selection))

    def collect(self, now: float) -> list[tuple[str, dict, float]]:
        if self.bpf is None:
            return []
        counts = dict(drain(self.bpf[b"submits"]))
        hists = drain_hists(self.bpf[b"gap_hist"])
        interval = None if self._last_collect is None else now - self._last_collect
        self._last_collect = now

        out: list[tuple[str, dict, float]] = []
        if interval and interval > 0:
            for pid, n in sorted(counts.items()):
                out.append(("gpu_submit_rate_hz", self.labels(pid=pid), n / interval))
        for pid, hist in sorted(hists.items()):
            for q, value in quantiles(hist):
                out.append(("gpu_submit_gap_us", self.labels(pid=pid, quantile=q), value))
        return out

