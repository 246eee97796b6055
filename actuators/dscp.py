"""The ``dscp`` actuator: retags a job's egress flows with a DSCP value through
one tc-BPF classifier per interface (clsact egress), so the fabric can queue
them apart (e.g. the gradient all-reduce ports as AF41, bulk checkpoint traffic
as LE).

The classifier is ``dscp.bpf.c`` beside this loader; the structs and flags of
its maps are in ``dscp.h``, mirrored here in ctypes. It hangs on the clsact
hook through ``core/tc.py``, as the link_traffic probe does. Which flows get
which DSCP lives in a pinned BPF map of rules, so a new or changed mark is a map
update (~µs), not a filter re-attach (~ms). Program and maps are pinned under
bpffs (``/sys/fs/bpf/reflexarc/dscp``: ``prog``, ``rules``, ``ifaces``,
``meta``), so marking keeps working when this process exits and a restarted
process can update or remove the rules of a change it finds in the journal.

A rule matches an interface plus, optionally, the L4 protocol, one port range
(source or destination port), one address prefix (source or destination
address) and the job's cgroup. The cgroup match uses ``bpf_skb_cgroup_id``
(the cgroup v2 id of the sending socket; on this hybrid v1/v2 host it is the
inode of the job's directory in the unified hierarchy). ``bpf_get_cgroup_classid``
is not used: it reads net_cls, which is not mounted here, and returned 0.
When rules overlap, the most recently planned one wins; reverting it uncovers
the older one again.

Parameters (``specs.py``): ``dscp`` (name such as AF41/EF/LE/CS1 or 0-63),
``interfaces`` (default: the selector's), ``netns`` (the network namespace of
the interfaces: a name in /run/netns or /proc/PID/ns/net; default: the
selector's ``netns``, else the controller's own), ``ports`` (default: the
selector's), ``protocol`` (tcp/udp/any), ``addresses`` (IPv4/IPv6 prefixes),
``match_cgroup`` (the selector's ``cgroup`` path, absolute or relative to the
cgroup2 mount) and ``class``.

The DSCP is for the fabric: switches queue by it. The host's own qdisc does not
read it (HTB picks a class by ``skb->priority`` or a filter), so ``class``
names a class of each interface's root qdisc as tc prints it (``"1:30"``) and
the rule also sets ``skb->priority`` to major<<16|minor (0x10030). Plan checks
that the class is there, as a leaf, on every interface, and otherwise fails
naming the classes that are (``eth0 in netns r0 has no class 1:30 (classes:
1:10, 1:20)``). docs/dscp.md says what a switch and the host's qdisc need.

Ownership: the filter has a fixed priority/handle (``FILTER_PRIO`` 3420, ahead
of tc's automatic 49152) and name; only that filter is ever replaced or
deleted, and it always lets the packet go on to the filters after it. Revert removes this change's
rules, then the filter once no rule on that interface remains, then the clsact
qdisc only if reflexarc created it (recorded in the Change and in the pinned
``ifaces`` map) and no other filter hangs on it. When no rule and no interface
remains, the pins are removed too, and so is their directory once empty.
Concurrent processes, whatever their ``--state-dir``, serialise on the pin
directory itself (an flock on it). Revert reads only the change's owner, namespace and
before/after states, so changes journaled while ``class`` was a numeric
``priority`` parameter still revert.

A change no longer ``exists`` once its network namespace is gone (no such
name, or a namespace by that name with another netns cookie than at plan time:
a re-created one) or every interface it marks is. The controller then closes it
as target-gone instead of reverting it, so ``exists`` also drops the change's
rules, and the interface entries nothing uses any more, from the pinned maps.

Example::

    act = DscpActuator()
    change = act.plan(Target({"job": "llama"}, {"interfaces": ["eth0"], "netns": "r0"}),
                      {"dscp": "CS1", "ports": ["443"], "protocol": "tcp", "class": "1:30"})
    # change.summary == "dscp CS1 (8) on r0:eth0 for tcp ports 443-443, qdisc class 1:30 [job=llama]"
    # change.before == {"eth0": {"clsact": False, "filter": False, "rules": []}}
    act.apply(change)
    act.exists(change)                               # False once r0 or its eth0 is gone
    act.revert(Change.from_dict(change.to_dict()))   # also from a restarted process

Only traffic through the kernel stack passes tc: RDMA verbs traffic bypasses it
(set its traffic class in the RDMA stack instead).

Overhead: one LLVM compile per process, and only when nothing is pinned yet
(~2 s, ~130 MB peak RSS); plan/apply/revert then cost a few netlink round trips
and map updates: 3-7 ms each on a veth in another namespace. ``exists``, asked
every tick while a change is active, opens one netlink socket and looks up each
interface: ~0.8 ms, in the controller's own namespace or another (a short-lived
thread joins it, ``core/tc.py``). Per packet, measured with BPF_PROG_TEST_RUN:
~0.08 µs on an interface without rules, ~0.2 µs with 1-8 rules, ~0.5 µs with 64
used slots (~6 ns per slot); a GSO skb is one run; setting ``skb->priority``
adds a store.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import ipaddress
import os
import secrets
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from reflexarc.core.cgroups import cgroup2_id, cgroup2_mounts
from reflexarc.core.dscp import dscp_name
from reflexarc.core.params import ParamError, convert
from reflexarc.core.ports import port_ranges
from reflexarc.core.tc import EgressFilter, Netns, NetnsGone, add_clsact, del_clsact, has_clsact, root_qdisc

from .base import Actuator, Change, PermanentActuatorError, Target, TemporaryActuatorError
from .specs import SPECS, class_priority, netns_ref

SOURCE = Path(__file__).with_name("dscp.bpf.c")
HEADER = SOURCE.with_name("dscp.h")       # the structs and flags below, in C
DEFAULT_PIN_DIR = "/sys/fs/bpf/reflexarc/dscp"
FILTER_PRIO = 3420          # tc priority ("pref") of our egress filter, fixed and distinctive
FILTER_HANDLE = 0xD5C
FILTER_NAME = "dscp_egress"
FILTER = EgressFilter(FILTER_PRIO, FILTER_HANDLE, (FILTER_NAME,))
PIN_NAMES = ("prog", "rules", "ifaces", "meta")   # the program first: without it a set is incomplete
IFACE_CLSACT_CREATED = 1    # dscp.h, like the RULE_* flags and the structs below

PROTOCOLS = {"any": 0, "tcp": socket.IPPROTO_TCP, "udp": socket.IPPROTO_UDP}

# bytes before the IP header in a tc egress skb, by ARPHRD link type
L3_OFFSETS = {1: 14, 772: 14,                         # ether, loopback
              65534: 0, 519: 0, 768: 0, 769: 0, 776: 0}  # none (wireguard/tun), rawip, ipip, ip6tnl, sit

RULE_SET_PRIORITY, RULE_MATCH_ADDR, RULE_MATCH_PORTS = 1, 2, 4


class _Rule(ctypes.Structure):
    """``struct rule`` of dscp.h, field for field."""
    _fields_ = [("netns", ctypes.c_uint64), ("cgroup_id", ctypes.c_uint64),
                ("owner", ctypes.c_uint64), ("seq", ctypes.c_uint64),
                ("ifindex", ctypes.c_uint32), ("priority", ctypes.c_uint32),
                ("addr", ctypes.c_uint32 * 4), ("mask", ctypes.c_uint32 * 4),
                ("port_lo", ctypes.c_uint16), ("port_hi", ctypes.c_uint16),
                ("family", ctypes.c_uint8), ("l4proto", ctypes.c_uint8),
                ("dscp", ctypes.c_uint8), ("flags", ctypes.c_uint8)]


class _IfaceKey(ctypes.Structure):
    """``struct iface_key`` of dscp.h."""
    _fields_ = [("netns", ctypes.c_uint64), ("ifindex", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


class _Iface(ctypes.Structure):
    """``struct iface`` of dscp.h."""
    _fields_ = [("l3_off", ctypes.c_uint32), ("flags", ctypes.c_uint32)]


class _Meta(ctypes.Structure):
    """``struct meta`` of dscp.h."""
    _fields_ = [("used", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


# --- libbpf: pinned objects and map access ----------------------------------------

def _libbpf() -> ctypes.CDLL:
    lib = getattr(_libbpf, "lib", None)
    if lib is None:
        lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
        lib.bpf_obj_get.argtypes = [ctypes.c_char_p]
        lib.bpf_obj_pin.argtypes = [ctypes.c_int, ctypes.c_char_p]
        lib.bpf_map_lookup_elem.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        lib.bpf_map_update_elem.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64]
        lib.bpf_map_delete_elem.argtypes = [ctypes.c_int, ctypes.c_void_p]
        lib.bpf_map_get_next_key.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        _libbpf.lib = lib
    return lib


def _bpf_error(what: str, err: int) -> Exception:
    text = f"{what}: {os.strerror(err)}"
    if err in (errno.EAGAIN, errno.EBUSY, errno.EINTR, errno.ENOMEM):
        return TemporaryActuatorError(text)
    return PermanentActuatorError(text)


def _obj_get(path: Path) -> int | None:
    fd = _libbpf().bpf_obj_get(str(path).encode())
    if fd < 0:
        if -fd == errno.ENOENT:
            return None
        raise _bpf_error(f"cannot open pinned {path}", -fd)
    return fd


def _obj_pin(fd: int, path: Path) -> None:
    ret = _libbpf().bpf_obj_pin(fd, str(path).encode())
    if ret < 0 and -ret != errno.EEXIST:
        raise _bpf_error(f"cannot pin {path}", -ret)


def _fdinfo(fd: int) -> dict:
    lines = Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


class _Map:
    """One BPF map by fd, with ctypes key/value types."""

    def __init__(self, fd: int, key_type, value_type, path: Path) -> None:
        self.fd, self.key_type, self.value_type, self.path = fd, key_type, value_type, path

    def get(self, key):
        value = self.value_type()
        ret = _libbpf().bpf_map_lookup_elem(self.fd, ctypes.byref(key), ctypes.byref(value))
        if ret < 0:
            if -ret == errno.ENOENT:
                return None
            raise _bpf_error(f"lookup in {self.path}", -ret)
        return value

    def put(self, key, value) -> None:
        ret = _libbpf().bpf_map_update_elem(self.fd, ctypes.byref(key), ctypes.byref(value), 0)
        if ret < 0:
            raise _bpf_error(f"update of {self.path}", -ret)

    def delete(self, key) -> None:
        ret = _libbpf().bpf_map_delete_elem(self.fd, ctypes.byref(key))
        if ret < 0 and -ret != errno.ENOENT:
            raise _bpf_error(f"delete from {self.path}", -ret)

    def keys(self) -> list:
        out, cur, nxt = [], None, self.key_type()
        while _libbpf().bpf_map_get_next_key(self.fd, ctypes.byref(cur) if cur is not None else None,
                                             ctypes.byref(nxt)) == 0:
            out.append(nxt)
            cur, nxt = nxt, self.key_type()
        return out


@dataclass
class _Pinned:
    """The pinned program and maps, opened for one operation."""

    prog_fd: int | None
    rules: _Map
    ifaces: _Map
    meta: _Map
    created: bool = False      # the maps are new: filters found on interfaces are stale

    def close(self) -> None:
        for fd in (self.prog_fd, self.rules.fd, self.ifaces.fd, self.meta.fd):
            if fd is not None:
                os.close(fd)

    def slots(self) -> list[tuple[int, _Rule]]:
        used = self.meta.get(ctypes.c_uint32(0)).used
        out = []
        for i in range(used):
            rule = self.rules.get(ctypes.c_uint32(i))
            if rule is not None and rule.ifindex:
                out.append((i, rule))
        return out

    def write_rules(self, new: list[_Rule]) -> None:
        """Fill free slots, then raise the high-water mark so the program sees them."""
        meta = self.meta.get(ctypes.c_uint32(0))
        taken = {i for i, _ in self.slots()}
        capacity = int(_fdinfo(self.rules.fd)["max_entries"])
        free = [i for i in range(capacity) if i not in taken][:len(new)]
        if len(free) < len(new):
            raise PermanentActuatorError(f"DSCP rule table full ({len(taken)} of {capacity} slots used)")
        for slot, rule in zip(free, new):
            self.rules.put(ctypes.c_uint32(slot), rule)
        meta.used = max([meta.used, *(s + 1 for s in free)])
        self.meta.put(ctypes.c_uint32(0), meta)

    def drop_owner(self, owner: int) -> None:
        """Free the slots of one change, then lower the high-water mark."""
        kept = []
        for i, rule in self.slots():
            if rule.owner == owner:
                self.rules.put(ctypes.c_uint32(i), _Rule())
            else:
                kept.append(i)
        self.meta.put(ctypes.c_uint32(0), _Meta(used=max(kept) + 1 if kept else 0))


# --- netlink ---------------------------------------------------------------------

def _netlink_error(what: str, exc: Exception) -> Exception:
    code = getattr(exc, "code", None) or getattr(exc, "errno", None)
    text = f"{what}: {exc}"
    if code in (errno.EBUSY, errno.EAGAIN, errno.EINTR, errno.ENOBUFS):
        return TemporaryActuatorError(text)
    return PermanentActuatorError(text)


class _Link:
    """Netlink access to the interfaces of one network namespace (``core/tc.py``);
    ``NetnsGone`` when there is no such namespace."""

    def __init__(self, netns: str) -> None:
        self.netns = Netns(netns)
        self.ipr, self._cookie = self.netns.netlink()

    def close(self) -> None:
        self.ipr.close()

    def where(self) -> str:
        return self.netns.where()

    def cookie(self) -> int:
        return self._cookie

    def ifindex(self, name: str) -> int | None:
        found = self.ipr.link_lookup(ifname=name)
        return found[0] if found else None

    def indexes(self) -> set[int]:
        return {link["index"] for link in self.ipr.get_links()}

    def l3_offset(self, index: int, name: str) -> int:
        kind = self.ipr.get_links(index)[0]["ifi_type"]
        if kind not in L3_OFFSETS:
            raise PermanentActuatorError(f"interface {name}{self.where()} has link type {kind}: "
                                         "DSCP marking supports Ethernet, loopback and L3 tunnels")
        return L3_OFFSETS[kind]

    def check_class(self, index: int, name: str, cls: str) -> None:
        """PermanentActuatorError unless ``cls`` is a leaf class of the root qdisc of ``index``."""
        try:
            root = root_qdisc(self.ipr, index)
            found = [c for c in self.ipr.get_classes(index=index) if c["index"] == index]
        except Exception as exc:
            raise _netlink_error(f"cannot list the qdiscs and classes of {name}{self.where()}", exc) from exc
        if root is None:
            raise PermanentActuatorError(f"{name}{self.where()} has no root qdisc, so no class {cls}")
        kind, major = root.get_attr("TCA_KIND"), root["handle"] >> 16
        parents = {c["handle"]: c["parent"] for c in found if c["handle"] >> 16 == major}
        if not parents:
            raise PermanentActuatorError(f"{name}{self.where()} has qdisc {kind}, which has no classes")
        handle = class_priority(cls)
        if handle not in parents:
            raise PermanentActuatorError(f"{name}{self.where()} has no class {cls} "
                                         f"(classes: {', '.join(map(_class_text, sorted(parents)))})")
        children = sorted(h for h, parent in parents.items() if parent == handle)
        if children:
            raise PermanentActuatorError(
                f"class {cls} of {name}{self.where()} has classes under it "
                f"({', '.join(map(_class_text, children))}); {kind} queues packets only in leaf classes")

    def has_clsact(self, index: int) -> bool:
        return has_clsact(self.ipr, index)

    def _call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(self.ipr, *args, **kwargs)
        except Exception as exc:
            raise _netlink_error(f"{what}{self.where()}", exc) from exc

    def has_our_filter(self, index: int, name: str = "") -> bool:
        """True when our filter is on egress; raises when another filter holds our priority."""
        for f in self._call(f"cannot list filters of ifindex {index}", FILTER.at_prio, index):
            if FILTER.name_of(f) is not None:
                return True
            raise PermanentActuatorError(f"egress of {name or index}{self.where()} has a foreign filter "
                                         f"at priority {FILTER_PRIO}, the one reserved for DSCP marking")
        return False

    def filter_alone(self, index: int) -> bool:
        """No other filter than ours on either clsact hook."""
        return self._call(f"cannot list filters of ifindex {index}", FILTER.alone, index)

    def add_clsact(self, index: int) -> None:
        self._call(f"cannot add clsact to ifindex {index}", add_clsact, index)

    def del_clsact(self, index: int) -> None:
        self._call(f"cannot delete clsact of ifindex {index}", del_clsact, index)

    def set_filter(self, index: int, prog_fd: int, replace: bool) -> None:
        self._call(f"cannot attach the DSCP filter to ifindex {index}", FILTER.add, index, prog_fd, FILTER_NAME,
                   replace=replace)

    def del_filter(self, index: int) -> None:
        self._call(f"cannot delete the DSCP filter of ifindex {index}", FILTER.delete, index)


# --- rules <-> JSON ------------------------------------------------------------------

def _class_text(handle: int) -> str:
    """A class handle (or skb->priority) as tc prints it: ``0x10030`` -> ``"1:30"``."""
    return f"{handle >> 16:x}:{handle & 0xFFFF:x}"


def _rule_key(rule: dict) -> tuple:
    return (rule["protocol"], tuple(rule["ports"] or ()), rule["address"], rule["cgroup_id"])


def _rule_json(r: _Rule) -> dict:
    address = None
    if r.flags & RULE_MATCH_ADDR:
        size = 4 if r.family == 4 else 16
        raw = b"".join(w.to_bytes(4, "little") for w in r.addr)[:size]  # inverse of _words
        prefix = sum(bin(w).count("1") for w in r.mask)
        address = str(ipaddress.ip_network((raw, prefix)))
    return {"owner": f"{r.owner:016x}", "seq": r.seq, "dscp": r.dscp,
            "protocol": next(k for k, v in PROTOCOLS.items() if v == r.l4proto),
            "ports": [r.port_lo, r.port_hi] if r.flags & RULE_MATCH_PORTS else None,
            "address": address, "cgroup_id": r.cgroup_id or None,
            "class": _class_text(r.priority) if r.flags & RULE_SET_PRIORITY else None}


def _words(raw: bytes) -> list[int]:
    """Network-order bytes as the u32 words the program compares (loaded little-endian)."""
    return [int.from_bytes(raw[i:i + 4], "little") for i in range(0, len(raw), 4)]


def _rule_struct(rule: dict, netns: int, ifindex: int) -> _Rule:
    r = _Rule(netns=netns, ifindex=ifindex, owner=int(rule["owner"], 16), seq=rule["seq"],
              dscp=rule["dscp"], l4proto=PROTOCOLS[rule["protocol"]], cgroup_id=rule["cgroup_id"] or 0)
    if rule["ports"]:
        r.port_lo, r.port_hi = rule["ports"]
        r.flags |= RULE_MATCH_PORTS
    if rule["address"]:
        net = ipaddress.ip_network(rule["address"])
        r.family = net.version
        for i, w in enumerate(_words(net.network_address.packed)):
            r.addr[i] = w
        for i, w in enumerate(_words(net.netmask.packed)):
            r.mask[i] = w
        r.flags |= RULE_MATCH_ADDR
    if rule["class"] is not None:
        r.priority = class_priority(rule["class"])
        r.flags |= RULE_SET_PRIORITY
    return r


class DscpActuator(Actuator):
    spec = SPECS["dscp"]

    def __init__(self, pin_dir: str = DEFAULT_PIN_DIR, max_rules: int = 64) -> None:
        self.pin_dir = Path(pin_dir)
        self.max_rules = max_rules
        self._bpf = None           # the compiled module, kept to re-pin without recompiling

    # --- the C program --------------------------------------------------------
    def cflags(self) -> list[str]:
        return [f"-I{SOURCE.parent}", f"-DMAX_RULES={self.max_rules}", f"-DRULE_SIZE={ctypes.sizeof(_Rule)}",
                *(f'-DPIN_{name.upper()}="{self.pin_dir / name}"' for name in ("rules", "ifaces", "meta"))]

    def dump_bpf(self) -> str:
        """The C as the compiler sees it: the cflags, then the source with dscp.h in place."""
        flags = "\n".join(f"// cflag: {f}" for f in self.cflags())
        source = SOURCE.read_text().replace(f'#include "{HEADER.name}"\n', HEADER.read_text())
        return f"// actuator: dscp (loader actuators/dscp.py)\n{flags}\n{source}"

    def prepare(self) -> None:
        """Compile the classifier now (~1 s of LLVM) rather than during the first
        retag. Compiling pins the maps; unless changes already use them, the pins
        are removed again at once, and the first apply re-pins this module. Pins a
        crash left behind are settled first (see ``_settle``)."""
        if self._bpf is not None:
            return
        with self._locked():
            pinned = self._settle()
            if pinned is not None:          # in use: the program is pinned, nothing to compile
                pinned.close()
                return
            pinned = self._load()
            try:
                self._unpin_if_idle(pinned)
            finally:
                pinned.close()

    def _settle(self) -> _Pinned | None:
        """Under the lock: the pins as a complete set in use, or None when none are
        left. A crash can leave a complete set that holds nothing (killed before
        ``prepare`` unpinned it) or an incomplete one (killed between pinning the
        maps and the program, or while unpinning): one that holds no rule and no
        interface is removed; one still in use gets its program re-pinned."""
        present = [name for name in PIN_NAMES if (self.pin_dir / name).exists()]
        if not present:
            return None
        if len(present) == len(PIN_NAMES):
            pinned = self._open_pins()
            if pinned is not None and (pinned.slots() or pinned.ifaces.keys()):
                return pinned
            if pinned is not None:
                pinned.close()
        elif self._maps_in_use(present):
            return self._load()
        for name in present:
            (self.pin_dir / name).unlink(missing_ok=True)
        self._remove_if_empty()
        return None

    def _maps_in_use(self, present: list[str]) -> bool:
        """Whether the pinned maps among ``present`` hold a rule or an interface entry."""
        for name, key_type, value_type in (("rules", ctypes.c_uint32, _Rule), ("ifaces", _IfaceKey, _Iface)):
            fd = _obj_get(self.pin_dir / name) if name in present else None
            if fd is None:
                continue
            table = _Map(fd, key_type, value_type, self.pin_dir / name)
            try:
                if name == "ifaces" and table.keys():
                    return True
                if name == "rules" and any(
                        (rule := table.get(ctypes.c_uint32(i))) is not None and rule.ifindex
                        for i in range(int(_fdinfo(fd)["max_entries"]))):
                    return True
            finally:
                os.close(fd)
        return False

    def _open_pins(self) -> _Pinned | None:
        fds = {name: _obj_get(self.pin_dir / name) for name in PIN_NAMES}
        if any(fd is None for fd in fds.values()):
            for fd in fds.values():
                if fd is not None:
                    os.close(fd)
            return None
        info = _fdinfo(fds["rules"])
        if int(info["value_size"]) != ctypes.sizeof(_Rule) or int(info["max_entries"]) != self.max_rules:
            for fd in fds.values():
                os.close(fd)
            raise PermanentActuatorError(
                f"pinned {self.pin_dir / 'rules'} has value_size {info['value_size']}, max_entries "
                f"{info['max_entries']}; this build expects {ctypes.sizeof(_Rule)}, {self.max_rules}: "
                f"revert its changes and remove {self.pin_dir}")
        return _Pinned(fds["prog"], _Map(fds["rules"], ctypes.c_uint32, _Rule, self.pin_dir / "rules"),
                       _Map(fds["ifaces"], _IfaceKey, _Iface, self.pin_dir / "ifaces"),
                       _Map(fds["meta"], ctypes.c_uint32, _Meta, self.pin_dir / "meta"))

    def _load(self) -> _Pinned:
        """Open the pins, creating them (compile, or re-pin this process's module) when absent."""
        pinned = self._open_pins()
        if pinned is not None:
            return pinned
        self.pin_dir.mkdir(parents=True, exist_ok=True)
        stale = [name for name in PIN_NAMES if (self.pin_dir / name).exists()]
        if self._bpf is None or stale:
            # BPF_TABLE_PINNED reuses maps still pinned and pins the ones it creates;
            # a prog pin left alone would still point at the maps that are gone
            (self.pin_dir / "prog").unlink(missing_ok=True)
            from bcc import BPF
            if self._bpf is not None:
                self._bpf.cleanup()
            try:
                self._bpf = BPF(src_file=str(SOURCE).encode(), cflags=self.cflags())
                prog = self._bpf.load_func(FILTER_NAME.encode(), BPF.SCHED_CLS)
            except Exception as exc:
                raise PermanentActuatorError(f"cannot compile/load {SOURCE.name}: {exc}") from exc
        else:
            prog = self._bpf.funcs[FILTER_NAME.encode()]
            for name in ("rules", "ifaces", "meta"):
                _obj_pin(self._bpf[name.encode()].map_fd, self.pin_dir / name)
        _obj_pin(prog.fd, self.pin_dir / "prog")
        pinned = self._open_pins()
        pinned.created = True
        return pinned

    def _unpin_if_idle(self, pinned: _Pinned) -> None:
        if pinned.slots() or pinned.ifaces.keys():
            return
        for name in PIN_NAMES:
            (self.pin_dir / name).unlink(missing_ok=True)
        self._remove_if_empty()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """One holder of the pins at a time, across controllers whatever their
        state directory: the lock is the pin directory itself (flock on its fd).
        A directory another holder removed meanwhile is made again and locked
        afresh. No empty pin directory is left behind, also after a crash
        between making it and pinning."""
        while True:
            self.pin_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.pin_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    current = os.stat(self.pin_dir).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    current = False
                if not current:
                    continue
                try:
                    yield
                finally:
                    self._remove_if_empty()
                return
            finally:
                os.close(fd)

    def _remove_if_empty(self) -> None:
        for directory in (self.pin_dir, self.pin_dir.parent):
            try:
                directory.rmdir()          # only succeeds when empty
            except OSError:
                break

    @contextmanager
    def _link(self, netns: str) -> Iterator[_Link]:
        try:
            link = _Link(netns)
        except NetnsGone:
            raise PermanentActuatorError(f"network namespace '{netns}' does not exist") from None
        try:
            yield link
        finally:
            link.close()

    # --- reading ------------------------------------------------------------------
    def _state(self, link: _Link, pinned: _Pinned | None, names: list[str]) -> dict:
        cookie = link.cookie()
        slots = pinned.slots() if pinned else []
        out = {}
        for name in names:
            index = link.ifindex(name)
            if index is None:
                raise PermanentActuatorError(f"interface {name} not found{link.where()}")
            rules = [_rule_json(r) for _, r in slots if r.netns == cookie and r.ifindex == index]
            out[name] = {"clsact": link.has_clsact(index), "filter": link.has_our_filter(index, name),
                         "rules": sorted(rules, key=lambda r: (r["seq"], r["owner"], str(_rule_key(r))))}
        return out

    def _read(self, netns: str, names: list[str]) -> dict:
        pinned = self._open_pins()
        try:
            with self._link(netns) as link:
                return self._state(link, pinned, names)
        finally:
            if pinned:
                pinned.close()

    def read_current(self, target: Target, params: dict | None = None) -> dict:
        """{interface: {"clsact", "filter", "rules"}} for the selector's interfaces."""
        sel = target.selector
        return self._read(str(sel.get("netns") or ""), [str(i) for i in sel.get("interfaces") or ()])

    # --- planning -----------------------------------------------------------------
    def _normalize(self, target: Target, params: dict) -> dict:
        sel = target.selector
        params = self.checked(params)
        try:
            interfaces = params.get("interfaces") or convert(self.spec.param("interfaces"), sel.get("interfaces"))
            ports = params.get("ports") or port_ranges(sel.get("ports"))
            netns = params.get("netns") or (netns_ref(sel["netns"]) if sel.get("netns") else "")
        except (ParamError, ValueError) as exc:
            raise PermanentActuatorError(f"selector: {exc}") from None
        if not interfaces:
            raise PermanentActuatorError("dscp needs interfaces (params.interfaces or the selector's)")
        cgroup_id = None
        if params.get("match_cgroup"):
            if not sel.get("cgroup"):
                raise PermanentActuatorError("match_cgroup needs the selector's cgroup")
            roots = cgroup2_mounts()
            if not roots:
                raise PermanentActuatorError("no cgroup2 hierarchy is mounted: cannot match a job's cgroup")
            cgroup_id = cgroup2_id(str(sel["cgroup"]))
            if cgroup_id is None:
                raise PermanentActuatorError(f"cgroup '{sel['cgroup']}' not found in the cgroup2 hierarchy "
                                             f"({', '.join(map(str, roots))})")
        return {"dscp": params["dscp"], "interfaces": interfaces, "netns": netns,
                "protocol": params.get("protocol") or "tcp", "ports": [list(r) for r in ports],
                "addresses": params.get("addresses") or [], "class": params.get("class"),
                "match_cgroup": cgroup_id is not None, "cgroup_id": cgroup_id}

    def plan(self, target: Target, params: dict) -> Change:
        p = self._normalize(target, params)
        p["owner"], p["seq"] = f"{secrets.randbits(64) | 1:016x}", time.time_ns()
        pinned = self._open_pins()
        try:
            with self._link(p["netns"]) as link:
                before = self._state(link, pinned, p["interfaces"])
                if p["class"]:
                    for name in p["interfaces"]:
                        link.check_class(link.ifindex(name), name, p["class"])
                p["netns_cookie"] = link.cookie()
            used = len(pinned.slots()) if pinned else 0
        finally:
            if pinned:
                pinned.close()
        wanted = [{"owner": p["owner"], "seq": p["seq"], "dscp": p["dscp"], "protocol": p["protocol"],
                   "ports": ports, "address": address, "cgroup_id": p["cgroup_id"], "class": p["class"]}
                  for ports in p["ports"] or [None] for address in p["addresses"] or [None]]
        after, added = {}, 0
        for name, state in before.items():
            new = [w for w in wanted if not self._in_effect(w, state)]
            if not new:
                after[name] = state
                continue
            added += len(new)
            after[name] = {"clsact": True, "filter": True, "rules": state["rules"] + new}
        if used + added > self.max_rules:
            raise PermanentActuatorError(f"DSCP rule table full: {used} of {self.max_rules} used, "
                                         f"{added} more needed")
        name = dscp_name(p["dscp"])
        what = " ".join(filter(None, (
            p["protocol"], "ports " + ",".join(f"{lo}-{hi}" for lo, hi in p["ports"]) if p["ports"] else "",
            ",".join(p["addresses"]), f"cgroup {p['cgroup_id']}" if p["cgroup_id"] else "")))
        where = ",".join(f"{p['netns']}:{i}" if p["netns"] else i for i in p["interfaces"])
        queue = f", qdisc class {p['class']}" if p["class"] else ""
        summary = f"dscp {name} ({p['dscp']}) on {where} for {what}{queue} [{target.key()}]"
        return Change("dscp", target, p, before, after, summary if added else f"{summary}: already in effect")

    @staticmethod
    def _in_effect(wanted: dict, state: dict) -> bool:
        """The newest rule with the same match already sets the same marks."""
        same = [r for r in state["rules"] if _rule_key(r) == _rule_key(wanted)]
        newest = max(same, key=lambda r: r["seq"], default=None)
        return bool(state["filter"] and newest and newest["dscp"] == wanted["dscp"]
                    and newest["class"] == wanted["class"])

    # --- writing ------------------------------------------------------------------
    def apply(self, change: Change) -> None:
        p = change.params
        owner = int(p["owner"], 16)
        if change.noop:
            return
        with self._locked():
            pinned = self._load()
            try:
                with self._link(p["netns"]) as link:
                    cookie = link.cookie()
                    if cookie != p["netns_cookie"]:
                        raise PermanentActuatorError(f"network namespace '{p['netns']}' was re-created "
                                                     "since the change was planned")
                    mine = {(r.ifindex, r.netns, str(_rule_key(_rule_json(r))))
                            for _, r in pinned.slots() if r.owner == owner}
                    for name, state in change.after.items():
                        new = [r for r in state["rules"] if r["owner"] == p["owner"]]
                        if new:
                            self._attach(link, pinned, cookie, name)
                            index = link.ifindex(name)
                            pinned.write_rules([_rule_struct(r, cookie, index) for r in new
                                                if (index, cookie, str(_rule_key(r))) not in mine])
            finally:
                pinned.close()

    def _attach(self, link: _Link, pinned: _Pinned, cookie: int, name: str) -> None:
        index = link.ifindex(name)
        if index is None:
            raise PermanentActuatorError(f"interface {name} not found{link.where()}")
        key = _IfaceKey(netns=cookie, ifindex=index)
        entry = pinned.ifaces.get(key) or _Iface()
        entry.l3_off = link.l3_offset(index, name)
        pinned.ifaces.put(key, entry)
        if not link.has_clsact(index):
            link.add_clsact(index)
            entry.flags |= IFACE_CLSACT_CREATED
            pinned.ifaces.put(key, entry)
        present = link.has_our_filter(index, name)
        if not present or pinned.created:
            link.set_filter(index, pinned.prog_fd, replace=present)

    def revert(self, change: Change) -> None:
        p = change.params
        with self._locked():
            pinned = self._settle()
            try:
                link = self._namespace(p)
                if link is None:        # its interfaces, filters and qdiscs went with it
                    if pinned:
                        self._release(pinned, p, keep=set())
                    return
                try:
                    if pinned:
                        pinned.drop_owner(int(p["owner"], 16))
                    self._detach_all(link, pinned, change)
                finally:
                    link.close()
                if pinned:
                    self._unpin_if_idle(pinned)
            finally:
                if pinned:
                    pinned.close()

    def drift(self, change: Change) -> str | None:
        """An interface of the change whose filter, or one of whose rules of this
        change, is gone."""
        p = change.params
        ours = {name: {str(_rule_key(r)) for r in state["rules"] if r["owner"] == p["owner"]}
                for name, state in change.after.items()}
        ours = {name: keys for name, keys in ours.items() if keys}
        if not ours:
            return None
        now = self._read(p["netns"], list(ours))
        for name, keys in ours.items():
            state = now.get(name) or {}
            if not state.get("filter"):
                return f"the DSCP filter on {name} is gone"
            have = {str(_rule_key(r)) for r in state.get("rules", []) if r["owner"] == p["owner"]}
            if keys - have:
                return f"{len(keys - have)} of this change's DSCP rules on {name} are gone"
        return None

    def exists(self, change: Change) -> bool:
        """False when the change's network namespace is gone, or all of its
        interfaces are; the change's rules then leave the pinned maps, since the
        controller closes it as target-gone instead of reverting it."""
        p = change.params
        link = self._namespace(p)
        keep: set[int] = set()
        if link is not None:
            try:
                if any(link.ifindex(name) is not None for name in change.before):
                    return True
                keep = link.indexes()
            finally:
                link.close()
        owner = int(p["owner"], 16)
        with self._locked():
            pinned = self._settle()
            if pinned:
                try:
                    if any(r.owner == owner for _, r in pinned.slots()):   # applied, not only planned
                        self._release(pinned, p, keep)
                finally:
                    pinned.close()
        return False

    def _namespace(self, p: dict) -> _Link | None:
        """The change's network namespace, or None when it is gone: no such name or
        path, or a namespace by that name that is not the one planned in."""
        try:
            link = _Link(p["netns"])
        except NetnsGone:
            return None
        if link.cookie() != p["netns_cookie"]:
            link.close()
            return None
        return link

    def _release(self, pinned: _Pinned, p: dict, keep: set) -> None:
        """Drop the rules of change ``p`` and the entries of its namespace's
        interfaces that are gone (not in ``keep``), then the pins if nothing is left."""
        pinned.drop_owner(int(p["owner"], 16))
        self._forget(pinned, p["netns_cookie"], keep)
        self._unpin_if_idle(pinned)

    def _detach_all(self, link: _Link, pinned: _Pinned | None, change: Change) -> None:
        cookie = link.cookie()
        slots = pinned.slots() if pinned else []
        for name, before in change.before.items():
            if change.after.get(name) == before:
                continue
            index = link.ifindex(name)
            if index is None:
                continue
            remaining = any(r.netns == cookie and r.ifindex == index for _, r in slots)
            keep_filter = remaining or (before["filter"] and not before["rules"])
            if not keep_filter and link.has_our_filter(index, name):
                link.del_filter(index)
            key = _IfaceKey(netns=cookie, ifindex=index)
            entry = pinned.ifaces.get(key) if pinned else None
            created = (entry is not None and entry.flags & IFACE_CLSACT_CREATED) or not before["clsact"]
            if pinned and not keep_filter:
                pinned.ifaces.delete(key)
            if (created and link.has_clsact(index) and not link.has_our_filter(index, name)
                    and link.filter_alone(index)):
                link.del_clsact(index)
        if pinned:
            self._forget(pinned, cookie, keep=link.indexes())

    @staticmethod
    def _forget(pinned: _Pinned, cookie: int, keep: set) -> None:
        """Drop interface entries of one netns whose interface is gone and holds no rule."""
        ruled = {(r.netns, r.ifindex) for _, r in pinned.slots()}
        for key in pinned.ifaces.keys():
            if key.netns == cookie and key.ifindex not in keep and (key.netns, key.ifindex) not in ruled:
                pinned.ifaces.delete(key)

    def close(self) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None
