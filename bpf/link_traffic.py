"""Loader of ``link_traffic.bpf.c``: egress traffic and utilisation of network
interfaces, split per training job into each job's own traffic and what
competes with it, plus the backlog and drops of each interface's root qdisc; a
congestion signal that tells "the job saturates its link" from "something else
crowds it out".

The interfaces are ``Selection.interfaces`` inside ``Selection.netns`` (a name
under /run/netns, a path such as /proc/PID/ns/net, or "" for this process's
own namespace). A packet is a job's when its socket belongs to one of the
job's cgroup v2 ids or to a descendant of one. The jobs are, first, a policy's
explicit cgroup (``Selection.traffic_cgroup_ids``: one job, labelled
``Selection.job``), else the jobs discovery found (``Selection.job_cgroups``:
(name, cgroup ids) each, labelled with the name). Each job gets a slot
(1..``max_jobs``) that the program's cgroup map points at; a job keeps its slot
while it lasts; the slot of a job that went away is freed at the next collect,
once its counts were read, and a new job that takes it starts from a baseline
of its running totals, inheriting nothing. A change of jobs or cgroups is a map
update; a change of interfaces attaches or detaches one program instance;
neither recompiles.

Attach levels, best first (``fallback_order``; ``level=`` starts lower):

1. ``tcx``: a tcx egress BPF link per interface (``BPF_LINK_CREATE`` with
   ``BPF_TCX_EGRESS``, kernel >= 6.6), made through the bpf() syscall with
   ctypes (Debian's libbpf 1.1 predates tcx), ahead of the other tcx programs.
   The kernel detaches a link when its last fd closes, so a controller that
   dies leaves nothing attached. Supported when ``BPF_PROG_QUERY`` knows
   ``BPF_TCX_EGRESS``.
2. ``clsact``: a cls_bpf filter in direct-action mode on the clsact egress
   hook (``core/tc.py``), at ``FILTER_PRIO`` 3400 / ``FILTER_HANDLE`` 0x4c54 /
   ``FILTER_NAME``, ahead of the DSCP marker (3420) and tc's automatic
   priorities. Used when tcx is missing or refused. The filter is removed on
   ``stop()``; one left by a killed process is found and removed at the next
   start. Its name records whether this probe created the clsact qdisc
   (``FILTER_NAME_OWNS_QDISC``), so the qdisc is removed only by the probe
   that created it, even after a restart, and only when no other filter hangs
   on it.
3. ``counters``: no BPF; ``traffic="all"`` from the interface's netlink
   ``tx_bytes``/``tx_packets``; the status is degraded and says why (also
   when not root or when the program fails to load).

Work in another namespace (the tcx link, whose ifindex the kernel resolves in
the caller's namespace, the netlink socket, the ethtool ioctl) runs in a
short-lived thread that joined it with setns(2) (``core/tc.py``); setns changes
only the calling thread, so the controller's other threads stay where they are.
The probe holds no reference that would keep a deleted namespace alive for
longer than one collect interval.

Signals, each with ``node``, ``iface`` and ``netns`` (the selection's string)::

    link_tx_bytes_total{job,traffic}     counter: bytes since the probe began watching
                                         (a job's: since the job appeared)
    link_tx_packets_total{job,traffic}   counter: packets (GSO segments) likewise
    link_utilization_pct{job,traffic}    gauge: bits over the last collect interval
                                         / link speed * 100, from a series' second collect on
    qdisc_backlog_bytes                  gauge: bytes queued in the root qdisc
    qdisc_drops_total                    counter: the root qdisc's own drop counter

Per interface: ``traffic="all"`` once (everything sent), and for each job
``traffic="job"`` (the job's packets) and ``traffic="other"`` (everything
else on the interface, other jobs' traffic included), both with ``job``.
``all`` carries no ``job`` beside discovered jobs; with an explicit cgroup all
three carry ``Selection.job`` when it is set, as does ``all`` with no job at
all (then it is the only series). A job that goes away leaves no series; its
bytes stay in ``all`` and in the others' ``other``. The qdisc signals carry no
``job`` and come only from a root qdisc that queues (not ``noqueue``).

Bytes are what enters the device's egress path with the link-layer header
(``skb->len``, what the device's own ``tx_bytes`` counts; a GSO packet counts
its headers once), before the qdisc: what the senders offer, including what
the qdisc then drops, so above 100 % the demand exceeds the link
(``qdisc_drops_total`` shows what it cost).

Link speed: the speed declared in ``Selection.link_speeds`` (bits/s) first,
else ``/sys/class/net/<iface>/speed`` for this process's own namespace, else
the ethtool ioctl (``ETHTOOL_GLINKSETTINGS``, then ``ETHTOOL_GSET``) on a socket
made inside the target namespace. A veth reports 10000 Mb/s whatever shapes it,
so declare the speed of a shaped or virtual bottleneck. With no speed known
the probe emits bytes but no utilisation, and its status says so. Speeds are
read when an interface is attached (start, selection change).

Example::

    probe = LinkTraffic(Selection(interfaces=("eth0",), netns="job-ns", traffic_cgroup_ids=(4242,),
                                  link_speeds=(("eth0", 200_000_000),), job="llama"))
    probe.start()                  # ok, attach_points ["tcx:egress:eth0@job-ns"]
    probe.collect(now=time.time())
    probe.collect(now=time.time() + 1)
    # [("link_tx_bytes_total", {"node": ..., "job": "llama", "iface": "eth0",
    #   "netns": "job-ns", "traffic": "job"}, 1.2e7), ...,
    #  ("link_utilization_pct", {..., "traffic": "other"}, 31.0), ...]
    probe.update_selection(Selection(interfaces=("eth0",), netns="job-ns",
                                     job_cgroups=(("llama", (4242,)), ("bert", (4343, 4344)))))
    probe.collect(time.time() + 2)  # a map update; per interface:
    # link_tx_bytes_total{node, iface="eth0", netns="job-ns", traffic="all"}
    # link_tx_bytes_total{node, job="bert", iface="eth0", netns="job-ns", traffic="job"}
    # link_tx_bytes_total{node, job="bert", ..., traffic="other"}  (llama's included)
    # link_tx_bytes_total{node, job="llama", ..., traffic="job"}, {..., traffic="other"}
    probe.stop()                   # links closed, filters and owned qdiscs removed

Overhead: start costs one compile (~0.2 s; this program is small) and, per
interface, one link create or two to four netlink requests (a namespace switch
~0.3 ms). Per packet (one run per skb, so a 64 KiB GSO packet is one run),
measured here on Linux 6.18 in a 2-core VM: ~0.07 us with BPF_PROG_TEST_RUN on
a 64-byte frame without a socket (0.105 us against 0.034 us for an empty
program; the per-CPU hash update is ~0.024 us of it); ~0.15-0.24 us on real
veth traffic from sockets two cgroup levels deep, job or not (bpf_stats
run_time_ns: 0.21-0.23 us per 64-byte UDP packet, ~0.30 us per TCP skb, minus
the 0.06 us an empty program shows the same way). A bulk TCP stream over the
veth ran at 19.2 Gb/s without the probe and 18.7 / 19.9 Gb/s with it (two
rounds): no difference beyond the noise. Collect: one walk of the per-CPU map
(one key per interface and job slot, plus one for no job's), one qdisc dump per
interface, and with ``counters`` one link dump per interface. A change of jobs:
a few map updates, and one more walk when a slot is handed out.
"""
from __future__ import annotations

import ctypes as ct
import errno
import fcntl
import functools
import os
import platform
import socket
import struct
from dataclasses import dataclass, field

from reflexarc.core.signals import SignalSpec
from reflexarc.core.tc import EgressFilter, Netns, NetnsGone, add_clsact, del_clsact, has_clsact, root_qdisc

from .probe import DEGRADED, OK, STOPPED, UNSUPPORTED, Probe, ProbeStatus, Selection

TCX, CLSACT, COUNTERS = "tcx", "clsact", "counters"
LEVELS = (TCX, CLSACT, COUNTERS)

FILTER_PRIO = 3400                  # ahead of the DSCP marker's 3420
FILTER_HANDLE = 0x4C54
FILTER_NAME = "link_traffic"        # the clsact qdisc was there before us
FILTER_NAME_OWNS_QDISC = "link_traffic+clsact"   # we created the clsact qdisc
FILTER = EgressFilter(FILTER_PRIO, FILTER_HANDLE, (FILTER_NAME, FILTER_NAME_OWNS_QDISC))

SLOT_NONE = 0                       # struct count_key.traffic in link_traffic.bpf.c: no job's
EXPLICIT = None                     # the owner of a slot for Selection.traffic_cgroup_ids

# bpf(2), values checked against the 6.18 UAPI (BTF of /sys/kernel/btf/vmlinux)
_NR_BPF = {"x86_64": 321, "aarch64": 280}
BPF_PROG_LOAD, BPF_PROG_QUERY, BPF_LINK_CREATE, BPF_LINK_DETACH = 5, 16, 28, 34
BPF_PROG_TYPE_SCHED_CLS = 3
BPF_TCX_EGRESS = 47
BPF_F_BEFORE = 1 << 3
BPF_FUNC_GET_NETNS_COOKIE = 122

SIOCETHTOOL = 0x8946
ETHTOOL_GSET, ETHTOOL_GLINKSETTINGS = 0x1, 0x4C

NO_INTERFACES = "no interfaces selected (a policy's selector.interfaces)"
_LABELS = ("node", "job", "iface", "netns", "traffic")
_QDISC_LABELS = ("node", "iface", "netns")


# --- bpf(2) through ctypes -----------------------------------------------------------

@functools.cache
def _syscall():
    libc = ct.CDLL(None, use_errno=True)
    libc.syscall.restype = ct.c_long
    return libc.syscall


class _LinkCreateAttr(ct.Structure):
    _fields_ = [("prog_fd", ct.c_uint32), ("target_ifindex", ct.c_uint32), ("attach_type", ct.c_uint32),
                ("flags", ct.c_uint32), ("relative_fd", ct.c_uint32), ("pad", ct.c_uint32),
                ("expected_revision", ct.c_uint64)]


class _LinkDetachAttr(ct.Structure):
    _fields_ = [("link_fd", ct.c_uint32)]


class _ProgQueryAttr(ct.Structure):
    _fields_ = [("target_ifindex", ct.c_uint32), ("attach_type", ct.c_uint32), ("query_flags", ct.c_uint32),
                ("attach_flags", ct.c_uint32), ("prog_ids", ct.c_uint64), ("count", ct.c_uint32),
                ("pad", ct.c_uint32), ("prog_attach_flags", ct.c_uint64), ("link_ids", ct.c_uint64),
                ("link_attach_flags", ct.c_uint64), ("revision", ct.c_uint64)]


class _ProgLoadAttr(ct.Structure):
    _fields_ = [("prog_type", ct.c_uint32), ("insn_cnt", ct.c_uint32), ("insns", ct.c_uint64),
                ("license", ct.c_uint64)]


def _bpf(cmd: int, attr: ct.Structure) -> int:
    nr = _NR_BPF.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, f"bpf(2) number unknown on {platform.machine()}")
    ret = _syscall()(ct.c_long(nr), ct.c_long(cmd), ct.byref(attr), ct.c_uint(ct.sizeof(attr)))
    if ret < 0:
        err = ct.get_errno()
        raise OSError(err, os.strerror(err))
    return int(ret)


def tcx_attach(prog_fd: int, ifindex: int, first: bool = True) -> int:
    """A tcx egress link of ``prog_fd`` on ``ifindex`` of the calling thread's
    namespace, first in the chain (or last); returns the link fd."""
    return _bpf(BPF_LINK_CREATE, _LinkCreateAttr(prog_fd=prog_fd, target_ifindex=ifindex,
                                                 attach_type=BPF_TCX_EGRESS,
                                                 flags=BPF_F_BEFORE if first else 0))


def tcx_detach(link_fd: int) -> None:
    """Detach the link now (even if a forked child still holds the fd), then
    close it. A link whose device is gone is detached already."""
    try:
        _bpf(BPF_LINK_DETACH, _LinkDetachAttr(link_fd=link_fd))
    except OSError:
        pass
    os.close(link_fd)


def tcx_query(ifindex: int) -> tuple[list[int], list[int]]:
    """(program ids, link ids) on the tcx egress hook of ``ifindex`` of the
    calling thread's namespace, in run order."""
    prog_ids, link_ids = (ct.c_uint32 * 64)(), (ct.c_uint32 * 64)()
    attr = _ProgQueryAttr(target_ifindex=ifindex, attach_type=BPF_TCX_EGRESS, count=64,
                          prog_ids=ct.addressof(prog_ids), link_ids=ct.addressof(link_ids))
    _bpf(BPF_PROG_QUERY, attr)
    return list(prog_ids[:attr.count]), list(link_ids[:attr.count])


@functools.cache
def tcx_supported() -> bool:
    """The kernel has tcx hooks: querying one (of loopback) is not refused."""
    try:
        tcx_query(socket.if_nametoindex("lo"))
    except OSError:
        return False
    return True


@functools.cache
def tc_netns_cookie_supported() -> bool:
    """tc programs may call bpf_get_netns_cookie: a three-instruction program
    calling it loads."""
    insns = b"".join(struct.pack("<BBhi", code, 0, 0, imm) for code, imm in (
        (0x85, BPF_FUNC_GET_NETNS_COOKIE),   # call bpf_get_netns_cookie(r1 = skb)
        (0xB7, -1),                          # r0 = TC_ACT_UNSPEC
        (0x95, 0)))                          # exit
    code, license = ct.create_string_buffer(insns, len(insns)), ct.create_string_buffer(b"GPL")
    try:
        fd = _bpf(BPF_PROG_LOAD, _ProgLoadAttr(prog_type=BPF_PROG_TYPE_SCHED_CLS, insn_cnt=3,
                                               insns=ct.addressof(code), license=ct.addressof(license)))
    except OSError:
        return False
    os.close(fd)
    return True


# --- link speed ----------------------------------------------------------------------

class _Ifreq(ct.Structure):
    _fields_ = [("name", ct.c_char * 16), ("data", ct.c_void_p), ("pad", ct.c_char * 16)]


class _LinkSettings(ct.Structure):
    """struct ethtool_link_settings, then room for the link mode masks."""
    _fields_ = [("cmd", ct.c_uint32), ("speed", ct.c_uint32), ("fields", ct.c_uint8 * 7),
                ("nwords", ct.c_int8), ("more", ct.c_uint8 * 4), ("reserved", ct.c_uint32 * 7),
                ("masks", ct.c_uint32 * (3 * 127))]


class _EthtoolCmd(ct.Structure):
    """struct ethtool_cmd (ETHTOOL_GSET)."""
    _fields_ = [("cmd", ct.c_uint32), ("supported", ct.c_uint32), ("advertising", ct.c_uint32),
                ("speed", ct.c_uint16), ("fields", ct.c_uint8 * 6), ("maxtxpkt", ct.c_uint32),
                ("maxrxpkt", ct.c_uint32), ("speed_hi", ct.c_uint16), ("mdix", ct.c_uint8 * 2),
                ("lp_advertising", ct.c_uint32), ("reserved", ct.c_uint32 * 2)]


def _ethtool(sock: socket.socket, iface: str, data: ct.Structure) -> None:
    req = _Ifreq(name=iface.encode()[:15], data=ct.addressof(data))
    fcntl.ioctl(sock.fileno(), SIOCETHTOOL, bytearray(req))


def ethtool_speed(iface: str) -> int | None:
    """Link speed in bits/s from the ethtool ioctl, on a socket of the calling
    thread's namespace; None when the driver does not know it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        speed = None
        try:
            ls = _LinkSettings(cmd=ETHTOOL_GLINKSETTINGS)
            _ethtool(sock, iface, ls)               # handshake: the kernel answers -nwords
            if ls.nwords < 0:
                ls = _LinkSettings(cmd=ETHTOOL_GLINKSETTINGS, nwords=-ls.nwords)
                _ethtool(sock, iface, ls)
                speed = ls.speed
        except OSError:
            pass
        if speed is None:
            try:
                cmd = _EthtoolCmd(cmd=ETHTOOL_GSET)
                _ethtool(sock, iface, cmd)
                speed = cmd.speed | cmd.speed_hi << 16
            except OSError:
                return None
    if not speed or speed > 0x7FFFFFFF:           # 0 or SPEED_UNKNOWN
        return None
    return speed * 1_000_000


# --- the probe -----------------------------------------------------------------------

@dataclass
class _Watch:
    """One attached interface."""
    iface: str
    ifindex: int
    level: str
    link_fd: int | None = None          # tcx
    owns_qdisc: bool = False            # clsact: we created the clsact qdisc
    base: tuple[int, int] = (0, 0)      # counters: tx bytes, packets when watching began
    speed: int | None = None            # bits/s
    speed_source: str = ""              # declared, sysfs, ethtool
    last: tuple[float, dict[tuple, int]] | None = None   # (collect time, bytes by (traffic, job))
    notes: list[str] = field(default_factory=list)


def _describe(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


class LinkTraffic(Probe):
    name = "link_traffic"
    tier = "light"
    signals = (
        SignalSpec("link_utilization_pct", "%", _LABELS, "gauge",
                   "Egress bits of an interface over the last interval as a share of its link speed, "
                   "by traffic (job, other, all) and job"),
        SignalSpec("link_tx_bytes_total", "bytes", _LABELS, "counter",
                   "Bytes sent out of an interface since the probe began watching it, by traffic and job"),
        SignalSpec("link_tx_packets_total", "1", _LABELS, "counter",
                   "Packets (GSO segments) sent out of an interface since the probe began watching it, "
                   "by traffic and job"),
        SignalSpec("qdisc_backlog_bytes", "bytes", _QDISC_LABELS, "gauge",
                   "Bytes queued in an interface's root qdisc"),
        SignalSpec("qdisc_drops_total", "1", _QDISC_LABELS, "counter",
                   "Packets dropped by an interface's root qdisc (the qdisc's own counter)"),
    )
    fallback_order = (
        "tcx egress BPF link per interface (BPF_LINK_CREATE, BPF_TCX_EGRESS; kernel >= 6.6)",
        f"clsact egress cls_bpf filter per interface (prio {FILTER_PRIO}, handle {FILTER_HANDLE:#x})",
        "netlink interface counters, no BPF: traffic=all only",
    )

    def __init__(self, selection: Selection | None = None, features=None, node: str = "",
                 level: str = TCX, max_level: int = 16, max_selected: int = 256,
                 max_interfaces: int = 64, max_jobs: int = 32) -> None:
        """``level``: the best attach level to try (tcx, clsact or counters);
        ``max_level``: the deepest cgroup ancestor level the program tests;
        ``max_selected``: cgroup ids; ``max_interfaces``: interfaces at once;
        ``max_jobs``: job slots (at most ``max_selected``), which size the
        per-CPU counts map (``max_interfaces`` x (``max_jobs`` + 1) keys)."""
        super().__init__(selection, features, node)
        if level not in LEVELS:
            raise ValueError(f"level {level!r} is not one of {', '.join(LEVELS)}")
        self.level = level
        self.max_level = max_level
        self.max_selected = max_selected
        self.max_interfaces = max_interfaces
        self.max_jobs = max(1, min(max_jobs, max_selected))
        self._planned = level           # what choose_attach_points found possible
        self._level = level             # what start() could load: the level of new interfaces
        self._with_cookie = False
        self._netns: Netns | None = None
        self._ipr = None
        self._cookie = 0
        self._prog_fd = -1
        self._watches: dict[str, _Watch] = {}
        self._notes: list[str] = []     # probe-wide reasons
        self._missing: list[str] = []   # selected interfaces not found
        self._reset_slots()

    # --- planning -------------------------------------------------------------------
    def cflags(self) -> list[str]:
        return [f"-DMAX_LEVEL={self.max_level}", f"-DMAX_SELECTED={self.max_selected}",
                f"-DMAX_KEYS={(self.max_jobs + 1) * self.max_interfaces}",
                f"-DWITH_NETNS_COOKIE={int(self._with_cookie)}"]

    def _plan(self) -> tuple[str, list[str]]:
        level, notes = self.level, []
        if level != TCX:
            notes.append(f"attach level limited to {level}")
        if level != COUNTERS and os.geteuid() != 0:
            level = COUNTERS
            notes.append("not running as root")
        if level == TCX and not tcx_supported():
            level = CLSACT
            notes.append("the kernel has no tcx egress hook (BPF_TCX_EGRESS, >= 6.6): clsact filters")
        if level == COUNTERS:
            notes.append("netlink counters only: traffic=all, no job/other split")
        return level, notes

    def choose_attach_points(self) -> ProbeStatus:
        """What this kernel allows, whether or not interfaces are selected yet
        (``start()`` needs some)."""
        sel = self.selection
        self._planned, notes = self._plan()
        self._with_cookie = self._planned != COUNTERS and tc_netns_cookie_supported()
        if not sel.interfaces:
            notes.append(NO_INTERFACES)
        at = f"@{sel.netns}" if sel.netns else ""
        points = [f"{self._planned}:egress:{iface}{at}" for iface in sel.interfaces]
        return ProbeStatus(DEGRADED if self._planned == COUNTERS else OK, "; ".join(notes), points)

    def capability(self) -> ProbeStatus:
        return self.choose_attach_points()

    # --- lifecycle ------------------------------------------------------------------
    def start(self) -> ProbeStatus:
        status = self.choose_attach_points()
        if not self.selection.interfaces:
            self.status = ProbeStatus(UNSUPPORTED, NO_INTERFACES)
            return self.status
        self._notes = [status.reason] if status.reason else []
        self._level = self._planned
        self._reset_slots()
        if self._level != COUNTERS:
            try:
                from bcc import BPF
                self.bpf = self.compile()
                self._prog_fd = self.bpf.load_func(self.name.encode(), BPF.SCHED_CLS).fd
            except Exception as exc:     # no bcc, no headers, verifier refusal
                self.bpf = None
                self._level = COUNTERS
                self._notes.append(f"BPF program not loaded ({type(exc).__name__}: {_describe(exc)}): "
                                   "netlink counters only, traffic=all")
        try:
            self.attach()
        except NetnsGone as exc:
            self.stop()
            self.status = ProbeStatus(UNSUPPORTED, str(exc))
            return self.status
        self.status = self._status()
        return self.status

    def attach(self) -> None:
        self._netns = Netns(self.selection.netns)
        self._ipr, self._cookie = self._netns.netlink()
        self._sync_cgroups()
        self._watch_selected()

    def stop(self) -> None:
        for watch in list(self._watches.values()):
            self._unwatch(watch)
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None
        self._netns = None
        super().stop()
        self._prog_fd = -1

    def update_selection(self, selection: Selection) -> None:
        old, self.selection = self.selection, selection
        if self._ipr is None:
            return
        jobs_changed = self._owners(selection) != self._owners(old)
        if jobs_changed:
            self._sync_cgroups()
        if selection.netns != old.netns:
            for watch in list(self._watches.values()):
                self._unwatch(watch)
            self._ipr.close()
            self._ipr = None
            try:
                self.attach()
            except NetnsGone as exc:
                self.stop()
                self.status = ProbeStatus(UNSUPPORTED, str(exc))
                return
        elif (selection.interfaces, selection.link_speeds) != (old.interfaces, old.link_speeds):
            for iface in set(self._watches) - set(selection.interfaces):
                self._unwatch(self._watches[iface])
            self._watch_selected()
        elif not jobs_changed:
            return
        self.status = self._status()

    # --- selection in the kernel ------------------------------------------------------
    @staticmethod
    def _owners(selection: Selection) -> dict:
        """Whose traffic gets a slot: the policy's explicit cgroups (owner
        EXPLICIT, labelled with ``Selection.job``) when there are some, else
        every discovered job with cgroups, by name; owner -> cgroup v2 ids."""
        if selection.traffic_cgroup_ids:
            return {EXPLICIT: tuple(dict.fromkeys(int(c) for c in selection.traffic_cgroup_ids))}
        owners: dict = {}
        for name, ids in selection.job_cgroups:
            ids = tuple(dict.fromkeys(int(c) for c in ids if int(c) > 0))
            if name and ids:
                owners.setdefault(name, ids)
        return owners

    def _reset_slots(self) -> None:
        self._slots: dict = {}                         # owner -> slot (1..max_jobs)
        self._retiring: dict[int, object] = {}         # slot -> owner gone since the last collect
        self._base: dict[tuple[int, int], tuple[int, int]] = {}   # (ifindex, slot) -> totals at assignment
        self._unslotted: list[str] = []                # owners that got no slot

    def _sync_cgroups(self) -> None:
        """Give each owner a slot and write sel_cgroup (cgroup id -> slot) to
        match. Owners keep their slot while they last; one that is gone keeps
        it until the next collect has read its counts (``_retiring``), and a slot
        handed to a new owner gets a baseline of its running totals now, so the
        new owner inherits nothing."""
        if self.bpf is None:
            return
        wanted = self._owners(self.selection)
        for owner, slot in list(self._slots.items()):
            if owner not in wanted:
                del self._slots[owner]
                self._retiring[slot] = owner
        comeback = {owner: slot for slot, owner in self._retiring.items() if owner in wanted}
        fresh: list[int] = []
        ids: dict[int, int] = {}
        self._unslotted = []
        # owners that had a slot first, so a newcomer never takes one that is held
        order = sorted(wanted, key=lambda o: o not in self._slots and o not in comeback)
        for owner in order:
            new = [c for c in wanted[owner] if c not in ids]
            slot = self._slots.get(owner) or comeback.get(owner)
            if slot is None:
                used = set(self._slots.values()) | set(self._retiring)
                slot = next((s for s in range(1, self.max_jobs + 1) if s not in used), None)
            if slot is None or len(ids) + len(new) > self.max_selected:
                self._unslotted.append("the explicit cgroups" if owner is EXPLICIT else owner)
                if self._slots.pop(owner, None) is not None or comeback.pop(owner, None) is not None:
                    self._retiring[slot] = owner
                continue
            if owner in comeback:
                del self._retiring[slot]
            elif owner not in self._slots:
                fresh.append(slot)
            self._slots[owner] = slot
            ids.update((c, slot) for c in new)
        if fresh:
            totals = self._kernel_totals()
            for key in [k for k in self._base if k[1] in fresh]:
                del self._base[key]
            self._base.update((k, v) for k, v in totals.items() if k[1] in fresh)
        table, count = self.bpf[b"sel_cgroup"], self.bpf[b"sel_count"]
        present = {k.value: v.value for k, v in table.items()}
        for cg, slot in ids.items():
            if present.get(cg) != slot:
                table[table.Key(cg)] = table.Leaf(slot)
        count[count.Key(0)] = count.Leaf(len(ids))
        for cg in set(present) - set(ids):
            del table[table.Key(cg)]

    # --- interfaces -------------------------------------------------------------------
    def _watch_selected(self) -> None:
        self._missing = []
        for iface in self.selection.interfaces:
            watch = self._watches.get(iface)
            if watch is None:
                found = self._ipr.link_lookup(ifname=iface)
                if not found:
                    self._missing.append(iface)
                    continue
                if len(self._watches) >= self.max_interfaces:
                    self._missing.append(f"{iface} (more than max_interfaces={self.max_interfaces})")
                    continue
                watch = self._watch(iface, found[0])
                self._watches[iface] = watch
            watch.speed, watch.speed_source = self._speed(iface)

    def _watch(self, iface: str, ifindex: int) -> _Watch:
        watch = _Watch(iface, ifindex, self._level)
        owned = self._remove_stale_filter(watch) if self._level != COUNTERS else False
        if watch.level == TCX:
            try:
                watch.link_fd = self._netns.run(tcx_attach, self._prog_fd, ifindex)
            except OSError as exc:
                watch.notes.append(f"tcx attach failed ({_describe(exc)}): clsact")
                watch.level = CLSACT
        if watch.level == CLSACT:
            try:
                self._add_filter(watch, owned)
            except Exception as exc:     # netlink refusals come in several types
                watch.notes.append(f"clsact filter not added ({_describe(exc)}): counters only, traffic=all")
                watch.level = COUNTERS
        elif owned:
            self._drop_qdisc_if_idle(watch)
        if watch.level == COUNTERS:
            watch.base = self._link_counters(ifindex)
        return watch

    def _unwatch(self, watch: _Watch) -> None:
        del self._watches[watch.iface]
        if watch.link_fd is not None:
            tcx_detach(watch.link_fd)
            watch.link_fd = None
        if watch.level == CLSACT:
            try:
                FILTER.delete(self._ipr, watch.ifindex)
                if watch.owns_qdisc:
                    self._drop_qdisc_if_idle(watch)
            except Exception:            # the interface went away, and its filters with it
                pass
        if self.bpf is not None:
            table = self.bpf[b"counts"]
            for key in [k for k in table.keys() if k.ifindex == watch.ifindex]:
                del table[key]
        for key in [k for k in self._base if k[0] == watch.ifindex]:
            del self._base[key]

    # --- clsact -------------------------------------------------------------------------
    def _remove_stale_filter(self, watch: _Watch) -> bool:
        """Delete a filter of ours left by a process that was killed; returns
        whether its name says that process had created the clsact qdisc."""
        if not has_clsact(self._ipr, watch.ifindex):
            return False
        name = FILTER.find(self._ipr, watch.ifindex)
        if name is None:
            return False
        FILTER.delete(self._ipr, watch.ifindex)
        watch.notes.append("removed a stale filter left by an earlier run")
        return name == FILTER_NAME_OWNS_QDISC

    def _add_filter(self, watch: _Watch, owned: bool) -> None:
        if not has_clsact(self._ipr, watch.ifindex):
            add_clsact(self._ipr, watch.ifindex)
            owned = True
        watch.owns_qdisc = owned
        FILTER.add(self._ipr, watch.ifindex, self._prog_fd, FILTER_NAME_OWNS_QDISC if owned else FILTER_NAME)

    def _drop_qdisc_if_idle(self, watch: _Watch) -> None:
        """Remove the clsact qdisc we created once no filter hangs on it."""
        if FILTER.alone(self._ipr, watch.ifindex) and has_clsact(self._ipr, watch.ifindex):
            del_clsact(self._ipr, watch.ifindex)

    # --- link speed and counters ----------------------------------------------------------
    def _speed(self, iface: str) -> tuple[int | None, str]:
        declared = dict(self.selection.link_speeds).get(iface)
        if declared:
            return int(declared), "declared"
        if not self._netns.path:
            try:
                mbps = int((self.features.sysfs / "class" / "net" / iface / "speed").read_text())
                if mbps > 0:
                    return mbps * 1_000_000, "sysfs"
            except (OSError, ValueError):
                pass
        speed = self._netns.run(ethtool_speed, iface)
        return (speed, "ethtool") if speed else (None, "")

    def _link_counters(self, ifindex: int) -> tuple[int, int]:
        stats = self._ipr.get_links(ifindex)[0].get_attr("IFLA_STATS64")
        return int(stats["tx_bytes"]), int(stats["tx_packets"])

    def link_speed(self, iface: str) -> tuple[int | None, str]:
        """(bits/s or None, where it came from: declared, sysfs, ethtool) of a watched interface."""
        watch = self._watches.get(iface)
        return (watch.speed, watch.speed_source) if watch else (None, "")

    # --- status ------------------------------------------------------------------------
    def _status(self) -> ProbeStatus:
        notes = list(self._notes)
        where = self._netns.where() if self._netns else ""
        if self._missing:
            notes.append(f"not found{where}: {', '.join(self._missing)}")
        degraded = bool(self._missing)
        if self._unslotted:
            notes.append(f"no job slot (max_jobs={self.max_jobs}, max_selected={self.max_selected} cgroup ids) "
                         f"for {', '.join(self._unslotted)}: their traffic counts as other")
            degraded = True
        for w in self._watches.values():
            notes.extend(f"{w.iface}: {n}" for n in w.notes)
            if w.speed is None:
                notes.append(f"{w.iface}: link speed unknown (declare it in the policy's selector.link_speeds): "
                             "bytes but no utilisation")
                degraded = True
            degraded |= w.level == COUNTERS
        if not self._watches:
            return ProbeStatus(UNSUPPORTED, "; ".join(notes) or NO_INTERFACES)
        at = f"@{self.selection.netns}" if self.selection.netns else ""
        points = [f"{w.level}:egress:{w.iface}{at}" for w in self._watches.values()]
        return ProbeStatus(DEGRADED if degraded else OK, "; ".join(notes), points)

    # --- collection ----------------------------------------------------------------------
    def _kernel_totals(self) -> dict[tuple[int, int], tuple[int, int]]:
        """(ifindex, traffic) -> (bytes, packets), summed over the CPUs."""
        out = {}
        if self.bpf is None:
            return out
        for key, per_cpu in self.bpf[b"counts"].items():
            if key.netns == (self._cookie if self._with_cookie else 0):
                out[(key.ifindex, key.traffic)] = (sum(v.bytes for v in per_cpu), sum(v.packets for v in per_cpu))
        return out

    def collect(self, now: float) -> list[tuple[str, dict, float]]:
        if self._ipr is None or self.status.state in (STOPPED, UNSUPPORTED):
            return []
        if not self._netns.alive():
            reason = f"network namespace '{self.selection.netns}' is gone"
            self.stop()
            self.status = ProbeStatus(UNSUPPORTED, reason)
            return []
        kernel = self._kernel_totals()
        out: list[tuple[str, dict, float]] = []
        for w in self._watches.values():
            series: dict[tuple, tuple[dict, tuple[int, int]]] = {}   # (traffic, job) -> (labels, totals)
            if w.level == COUNTERS:
                try:
                    tx = self._link_counters(w.ifindex)
                except Exception:        # the interface is gone; its entry stays until deselected
                    continue
                series[("all", EXPLICIT)] = (self._labels(w, "all", EXPLICIT),
                                             (tx[0] - w.base[0], tx[1] - w.base[1]))
            else:
                mine = {slot: t for (index, slot), t in kernel.items() if index == w.ifindex}
                every = (sum(b for b, _ in mine.values()), sum(p for _, p in mine.values()))
                series[("all", EXPLICIT)] = (self._labels(w, "all", EXPLICIT), every)
                for owner, slot in self._slots.items():
                    got, base = mine.get(slot, (0, 0)), self._base.get((w.ifindex, slot), (0, 0))
                    job = (got[0] - base[0], got[1] - base[1])
                    series[("job", owner)] = (self._labels(w, "job", owner), job)
                    series[("other", owner)] = (self._labels(w, "other", owner),
                                                (every[0] - job[0], every[1] - job[1]))
            for key, (labels, (nbytes, packets)) in series.items():
                out.append(("link_tx_bytes_total", labels, float(nbytes)))
                out.append(("link_tx_packets_total", labels, float(packets)))
                if w.last and w.speed and now > w.last[0] and key in w.last[1]:
                    bits = 8 * (nbytes - w.last[1][key])
                    out.append(("link_utilization_pct", labels, 100.0 * bits / (now - w.last[0]) / w.speed))
            w.last = (now, {key: b for key, (_, (b, _)) in series.items()})
            out.extend(self._qdisc(w))
        if self._retiring:
            # the counts of the jobs that went away are read (they stay in "all" and the
            # others' "other"): their slots are free for new jobs, from a new baseline
            self._retiring.clear()
            if self._unslotted:
                self._sync_cgroups()
                self.status = self._status()
        return out

    def _labels(self, w: _Watch, traffic: str, owner) -> dict:
        """``job`` is the discovered job's name; with an explicit cgroup (or no
        split) the selection's ``job`` as today, and none on ``all`` beside
        discovered jobs."""
        if owner is EXPLICIT and (self.selection.traffic_cgroup_ids or not self._slots):
            return self.labels(iface=w.iface, netns=self.selection.netns, traffic=traffic)
        labels = {"node": self.node}
        if owner is not EXPLICIT:
            labels["job"] = str(owner)
        labels.update(iface=w.iface, netns=self.selection.netns, traffic=traffic)
        return labels

    def _qdisc(self, w: _Watch) -> list[tuple[str, dict, float]]:
        try:
            q = root_qdisc(self._ipr, w.ifindex)
        except Exception:                # the interface is gone
            return []
        stats = q.get_attr("TCA_STATS2") if q is not None else None
        queue = stats.get_attr("TCA_STATS_QUEUE") if stats else None
        if queue is None or q.get_attr("TCA_KIND") == "noqueue":
            return []
        labels = {"node": self.node, "iface": w.iface, "netns": self.selection.netns}
        return [("qdisc_backlog_bytes", labels, float(queue["backlog"])),
                ("qdisc_drops_total", labels, float(queue["drops"]))]
