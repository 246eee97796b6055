"""Two real network namespaces joined by a veth pair, for tests that cross a network.

Example::

    with NetnsPair() as pair:
        pair.run("a", "ping", "-c1", pair.addr_b)

Addresses are 10.99.X.1/2 and fd99:X::1/2 inside namespaces the test creates; no
traffic leaves them. Names carry the pid so concurrent runs do not collide.
"""
from __future__ import annotations

import itertools
import os
import subprocess

_seq = itertools.count()


def sh(*argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True, **kw)


class NetnsPair:
    def __init__(self, tag: str = "t") -> None:
        n = next(_seq)
        uid = f"{os.getpid() % 10000}{n}"
        self.ns_a, self.ns_b = f"rxa{tag}{uid}", f"rxb{tag}{uid}"
        self.if_a, self.if_b = f"rxa{uid}", f"rxb{uid}"
        octet = (os.getpid() + n) % 200 + 20
        self.addr_a, self.addr_b = f"10.99.{octet}.1", f"10.99.{octet}.2"
        self.addr6_a, self.addr6_b = f"fd99:{octet}::1", f"fd99:{octet}::2"

    def __enter__(self) -> "NetnsPair":
        sh("ip", "netns", "add", self.ns_a)
        sh("ip", "netns", "add", self.ns_b)
        sh("ip", "link", "add", self.if_a, "netns", self.ns_a, "type", "veth",
           "peer", "name", self.if_b, "netns", self.ns_b)
        for ns, ifname, a4, a6 in ((self.ns_a, self.if_a, self.addr_a, self.addr6_a),
                                   (self.ns_b, self.if_b, self.addr_b, self.addr6_b)):
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "addr", "add", f"{a4}/24", "dev", ifname)
            sh("ip", "-n", ns, "addr", "add", f"{a6}/64", "dev", ifname, "nodad")
            sh("ip", "-n", ns, "link", "set", ifname, "up")
        return self

    def run(self, side: str, *argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        ns = self.ns_a if side == "a" else self.ns_b
        return sh("ip", "netns", "exec", ns, *argv, check=check, **kw)

    def popen(self, side: str, *argv: str, **kw) -> subprocess.Popen:
        ns = self.ns_a if side == "a" else self.ns_b
        return subprocess.Popen(["ip", "netns", "exec", ns, *argv], **kw)

    def __exit__(self, *exc) -> None:
        for ns in (self.ns_a, self.ns_b):
            sh("ip", "netns", "del", ns, check=False)
