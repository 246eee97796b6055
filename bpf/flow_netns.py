"""Which network namespace a TCP flow lives in, for the flows a tracepoint
reports by address only (``tcp:tcp_probe`` and ``tcp:tcp_retransmit_skb`` carry
no namespace, and their socket pointer says nothing a program may read without
kernel struct layouts).

Each namespace's own socket table (``/proc/PID/net/tcp`` and ``tcp6`` of one
process inside it) lists its flows as ``local -> remote``; a flow is placed in
the namespace whose table holds it. The label is the namespace's name under
``/run/netns``, "" for the controller's own namespace, or ``net:[INODE]`` for an
unnamed one (a container's). A flow found in no table (its socket closed) keeps
the namespace it had; one never seen is ``unknown``. The same four-tuple in two
namespaces (loopback flows on equal ports, say) is ``ambiguous``: the
tracepoints cannot tell them apart.

Example::

    where = FlowNetns()
    where.of("10.77.0.2:29500->10.77.0.3:41234")     # "rxtb42r0"
    where.of("127.0.0.1:631->127.0.0.1:52000")        # ""

Overhead: a refresh reads one ``ns/net`` link per process and the TCP tables of
each namespace (about 2 ms for 300 processes and a few hundred sockets); it runs
only when a flow is not yet known, at most once per ``min_interval`` seconds.
"""
from __future__ import annotations

import ipaddress
import os
import time
from pathlib import Path

UNKNOWN, AMBIGUOUS = "unknown", "ambiguous"


def _endpoint(text: str, v6: bool) -> str:
    """``0100007F:1F90`` -> ``127.0.0.1:8080`` (the table prints each 32-bit
    word of the address in host byte order); IPv4-mapped IPv6 prints as IPv4."""
    addr_hex, port_hex = text.split(":")
    raw = bytes.fromhex(addr_hex)
    addr = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    port = int(port_hex, 16)
    if not v6:
        return f"{ipaddress.IPv4Address(addr)}:{port}"
    ip = ipaddress.IPv6Address(addr)
    if ip.ipv4_mapped is not None:
        return f"{ip.ipv4_mapped}:{port}"
    return f"[{ip}]:{port}"


def read_flows(path: Path, v6: bool) -> set[str]:
    """The ``local->remote`` flows of one socket table, listening sockets left out."""
    flows = set()
    try:
        lines = path.read_text().splitlines()[1:]
    except OSError:
        return flows
    for line in lines:
        fields = line.split()
        if len(fields) < 4 or fields[3] == "0A":          # TCP_LISTEN
            continue
        try:
            flows.add(f"{_endpoint(fields[1], v6)}->{_endpoint(fields[2], v6)}")
        except ValueError:
            continue
    return flows


class FlowNetns:
    def __init__(self, procfs: str = "/proc", netns_dir: str = "/run/netns", min_interval: float = 1.0,
                 clock=time.monotonic) -> None:
        self.procfs, self.netns_dir = Path(procfs), Path(netns_dir)
        self.min_interval, self._clock = min_interval, clock
        self._where: dict[str, str] = {}
        self._last = float("-inf")

    def of(self, flow: str) -> str:
        """The namespace label of ``flow`` (``local->remote``, as the probe prints it)."""
        if flow not in self._where and self._clock() - self._last >= self.min_interval:
            self.refresh()
        return self._where.get(flow, UNKNOWN)

    def forget(self, keep: set[str]) -> None:
        """Drop what is known of flows no longer reported."""
        for flow in self._where.keys() - keep:
            del self._where[flow]

    def refresh(self) -> None:
        self._last = self._clock()
        found: dict[str, str] = {}
        for label, pid in self._namespaces().items():
            net = self.procfs / str(pid) / "net"
            for flow in read_flows(net / "tcp", False) | read_flows(net / "tcp6", True):
                found[flow] = AMBIGUOUS if flow in found and found[flow] != label else label
        self._where.update(found)

    def _namespaces(self) -> dict[str, int]:
        """One live process per network namespace, by the namespace's label."""
        names = {}
        try:
            for entry in os.scandir(self.netns_dir):
                try:
                    names[os.stat(entry.path).st_ino] = entry.name
                except OSError:
                    continue
        except OSError:
            pass
        try:
            own = os.stat(self.procfs / "self" / "ns" / "net").st_ino
        except OSError:
            own = None
        out: dict[int, int] = {}
        for entry in os.scandir(self.procfs):
            if not entry.name.isdigit():
                continue
            try:
                ino = os.stat(f"{entry.path}/ns/net").st_ino
            except OSError:
                continue
            out.setdefault(ino, int(entry.name))
        return {("" if ino == own else names.get(ino, f"net:[{ino}]")): pid for ino, pid in out.items()}
