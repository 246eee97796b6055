"""A BPF classifier on tc's clsact egress hook, in whichever network namespace
its interface lives: entering the namespace (``Netns``), a netlink socket made
inside it with its netns cookie, the clsact qdisc, and one cls_bpf filter in
direct-action mode known by its priority, handle and name (``EgressFilter``).
The link_traffic probe (``bpf/link_traffic.py``, priority 3400) and the DSCP
actuator (``actuators/dscp.py``, 3420) attach through it; each keeps its own
rules of ownership (who created the qdisc) and of errors. Nothing here loads a
program: the caller hands over its fd. pyroute2 is imported only to open a
netlink socket; the other functions take the caller's ``IPRoute``.

A namespace is "" (this process's own), a name under /run/netns, or a path such
as /proc/PID/ns/net. Work in another namespace runs in a short-lived thread that
joined it with setns(2); setns changes only the calling thread, so the caller's
other threads stay where they are. A ``Netns`` holds no reference that would
keep a deleted namespace alive.

Example::

    ns = Netns("job-ns")                      # NetnsGone when there is no such namespace
    ipr, cookie = ns.netlink()                # pyroute2 IPRoute inside job-ns, its netns cookie
    index = ipr.link_lookup(ifname="eth0")[0]
    marker = EgressFilter(prio=3420, handle=0xD5C, names=("dscp_egress",))
    if not has_clsact(ipr, index):
        add_clsact(ipr, index)
    marker.add(ipr, index, prog_fd, "dscp_egress")
    marker.find(ipr, index)                   # "dscp_egress"
    marker.delete(ipr, index)
    if marker.alone(ipr, index):              # nothing else hangs on the qdisc
        del_clsact(ipr, index)
    ipr.close()

Overhead: a call in another namespace costs one thread and one setns (~0.2 ms
here); opening a netlink socket with ``netlink`` ~0.8 ms in any namespace; each
query or change of a hook is one netlink request (``alone``: a filter dump per
hook).
"""
from __future__ import annotations

import ctypes as ct
import errno
import functools
import os
import socket
import threading
from dataclasses import dataclass

TC_EGRESS, TC_INGRESS, TC_H_ROOT = 0xFFFFFFF3, 0xFFFFFFF2, 0xFFFFFFFF
CLONE_NEWNET = 0x40000000
SO_NETNS_COOKIE = 71


# --- network namespaces --------------------------------------------------------------

@functools.cache
def _setns():
    libc = ct.CDLL(None, use_errno=True)
    libc.setns.argtypes = [ct.c_int, ct.c_int]
    return libc.setns


class NetnsGone(OSError):
    """The network namespace does not exist (any more)."""


def netns_cookie(sock: socket.socket) -> int:
    """The cookie of the network namespace ``sock`` was made in."""
    return int.from_bytes(sock.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8), "little")


class Netns:
    """The namespace a selection names: "" (this process's own), a name under
    /run/netns, or a path (/proc/PID/ns/net). ``run`` calls a function inside it."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.path = "" if not spec else spec if "/" in spec else f"/run/netns/{spec}"
        try:
            self.inode = os.stat(self.path).st_ino if self.path else 0
        except FileNotFoundError:
            raise NetnsGone(errno.ENOENT, f"network namespace '{spec}' does not exist") from None

    def where(self) -> str:
        return f" in netns {self.spec}" if self.spec else ""

    def alive(self) -> bool:
        """Still the namespace it was when opened (its name or process still there)."""
        if not self.path:
            return True
        try:
            return os.stat(self.path).st_ino == self.inode
        except OSError:
            return False

    def run(self, fn, *args):
        """``fn(*args)`` in a new thread that joined this namespace (here, for
        ""): the thread ends with the call, the caller's namespace never changes."""
        if not self.path:
            return fn(*args)
        result: dict = {}

        def body() -> None:
            try:
                try:
                    fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    raise NetnsGone(errno.ENOENT, f"network namespace '{self.spec}' is gone") from None
                try:
                    if os.fstat(fd).st_ino != self.inode:
                        raise NetnsGone(errno.ENOENT, f"network namespace '{self.spec}' was replaced")
                    if _setns()(fd, CLONE_NEWNET) != 0:
                        err = ct.get_errno()
                        raise OSError(err, f"setns({self.path}): {os.strerror(err)}")
                finally:
                    os.close(fd)
                result["value"] = fn(*args)
            except BaseException as exc:    # handed to the caller
                result["error"] = exc

        thread = threading.Thread(target=body, name="reflexarc-netns")
        thread.start()
        thread.join()
        if "error" in result:
            raise result["error"]
        return result["value"]

    def netlink(self):
        """(pyroute2 IPRoute, netns cookie) on a netlink socket made inside."""
        from pyroute2 import IPRoute

        def make() -> socket.socket:
            return socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, 0)

        sock = self.run(make)
        cookie = netns_cookie(sock)
        return IPRoute(fileno=sock.detach()), cookie


# --- clsact and its filters ----------------------------------------------------------

def filters(ipr, index: int, parent: int) -> list:
    """The filters on hook ``parent`` (TC_EGRESS, TC_INGRESS) of interface ``index``."""
    return [f for f in ipr.get_filters(index=index, parent=parent) if f["index"] == index]


def has_clsact(ipr, index: int) -> bool:
    return any(q["index"] == index and q.get_attr("TCA_KIND") == "clsact" for q in ipr.get_qdiscs(index=index))


def add_clsact(ipr, index: int) -> None:
    ipr.tc("add", "clsact", index)


def del_clsact(ipr, index: int) -> None:
    ipr.tc("del", "clsact", index)


def root_qdisc(ipr, index: int):
    """The root qdisc of interface ``index`` (a netlink message), or None."""
    return next((q for q in ipr.get_qdiscs(index=index) if q["index"] == index and q["parent"] == TC_H_ROOT),
                None)


@dataclass(frozen=True)
class EgressFilter:
    """One owner's cls_bpf filter on the clsact egress hook: at ``prio`` with
    ``handle``, named one of ``names`` (a name may record a fact, such as
    whether the owner created the qdisc)."""

    prio: int
    handle: int
    names: tuple[str, ...]

    def name_of(self, f) -> str | None:
        """The name of filter message ``f`` when it is this filter, else None."""
        if f["info"] >> 16 != self.prio or f["handle"] != self.handle or f.get_attr("TCA_KIND") != "bpf":
            return None
        options = f.get_attr("TCA_OPTIONS")
        name = options.get_attr("TCA_BPF_NAME") if options else None
        return name if name in self.names else None

    def at_prio(self, ipr, index: int) -> list:
        """The egress filters at this priority, the priority's own entry (handle 0) left out."""
        return [f for f in filters(ipr, index, TC_EGRESS) if f["info"] >> 16 == self.prio and f["handle"]]

    def find(self, ipr, index: int) -> str | None:
        """The name of this filter on the egress of ``index``, or None when it is not there."""
        for f in filters(ipr, index, TC_EGRESS):
            name = self.name_of(f)
            if name is not None:
                return name
        return None

    def add(self, ipr, index: int, prog_fd: int, name: str, replace: bool = False) -> None:
        ipr.tc("replace-filter" if replace else "add-filter", "bpf", index, self.handle, fd=prog_fd, name=name,
               parent=TC_EGRESS, prio=self.prio, direct_action=True)

    def delete(self, ipr, index: int) -> None:
        ipr.tc("del-filter", "bpf", index, self.handle, parent=TC_EGRESS, prio=self.prio)

    def alone(self, ipr, index: int) -> bool:
        """No filter but this one (and its priority's own entry, handle 0) on
        either clsact hook of ``index``: nothing else needs the qdisc."""
        return not any(self.name_of(f) is None and not (f["info"] >> 16 == self.prio and f["handle"] == 0)
                       for parent in (TC_INGRESS, TC_EGRESS) for f in filters(ipr, index, parent))
