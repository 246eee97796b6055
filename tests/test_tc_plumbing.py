"""``core/tc.py`` on a real veth in a fresh network namespace: the link_traffic
probe's filter and the DSCP marker's on one clsact egress hook, each found by
its own names and each counting the other's (and a foreign filter at its own
priority) as a reason to keep the qdisc; the root qdisc; the namespace's cookie;
a namespace that is gone. ``tc`` itself confirms what the kernel holds.
"""
from __future__ import annotations

import os
import socket

import pytest
from conftest import require_bpf
from netns import NetnsPair, sh

from reflexarc.core.tc import (TC_EGRESS, EgressFilter, Netns, NetnsGone, add_clsact, del_clsact, has_clsact,
                               netns_cookie, root_qdisc)

pytestmark = [pytest.mark.kernel, pytest.mark.netns]

PASS = b"int pass(struct __sk_buff *skb) { return -1; }"     # TC_ACT_UNSPEC: the next filter runs
PROBE = EgressFilter(3400, 0x4C54, ("link_traffic", "link_traffic+clsact"))
MARKER = EgressFilter(3420, 0xD5C, ("dscp_egress",))


@pytest.fixture
def pair():
    require_bpf()
    with NetnsPair("tc") as p:
        yield p


@pytest.fixture
def prog_fd():
    from bcc import BPF
    bpf = BPF(text=PASS)
    yield bpf.load_func(b"pass", BPF.SCHED_CLS).fd
    bpf.cleanup()


def test_two_owners_share_one_clsact_hook(pair, prog_fd):
    ns = Netns(pair.ns_a)
    ipr, cookie = ns.netlink()
    try:
        index = ipr.link_lookup(ifname=pair.if_a)[0]
        assert cookie == netns_cookie(ns.run(socket.socket)) != netns_cookie(socket.socket())
        assert not has_clsact(ipr, index) and root_qdisc(ipr, index).get_attr("TCA_KIND") == "noqueue"
        pair.run("a", "tc", "qdisc", "add", "dev", pair.if_a, "root", "handle", "1:", "htb")
        assert root_qdisc(ipr, index).get_attr("TCA_KIND") == "htb"

        add_clsact(ipr, index)
        PROBE.add(ipr, index, prog_fd, "link_traffic+clsact")
        MARKER.add(ipr, index, prog_fd, "dscp_egress")
        shown = pair.run("a", "tc", "filter", "show", "dev", pair.if_a, "egress").stdout
        assert "pref 3400 bpf" in shown and "link_traffic+clsact" in shown and "pref 3420 bpf" in shown
        assert (PROBE.find(ipr, index), MARKER.find(ipr, index)) == ("link_traffic+clsact", "dscp_egress")
        assert not PROBE.alone(ipr, index) and not MARKER.alone(ipr, index)
        MARKER.add(ipr, index, prog_fd, "dscp_egress", replace=True)
        assert [MARKER.name_of(f) for f in MARKER.at_prio(ipr, index)] == ["dscp_egress"]

        # a foreign filter at the marker's priority: at_prio lists it, find never takes it
        ipr.tc("add-filter", "bpf", index, 7, fd=prog_fd, name="foreign", parent=TC_EGRESS, prio=3420,
               direct_action=True)
        assert {f["handle"]: MARKER.name_of(f) for f in MARKER.at_prio(ipr, index)} == {0xD5C: "dscp_egress", 7: None}
        PROBE.delete(ipr, index)
        assert PROBE.find(ipr, index) is None and not PROBE.alone(ipr, index)
        assert "pref 3400" not in pair.run("a", "tc", "filter", "show", "dev", pair.if_a, "egress").stdout
        MARKER.delete(ipr, index)
        assert MARKER.find(ipr, index) is None and not MARKER.alone(ipr, index)     # the foreign one stays
        ipr.tc("del-filter", "bpf", index, 7, parent=TC_EGRESS, prio=3420)
        assert MARKER.alone(ipr, index)
        del_clsact(ipr, index)
        assert not has_clsact(ipr, index)
        assert "clsact" not in pair.run("a", "tc", "qdisc", "show", "dev", pair.if_a).stdout
    finally:
        ipr.close()


def test_a_namespace_that_is_gone():
    require_bpf()
    with pytest.raises(NetnsGone, match="does not exist"):
        Netns(f"rxtcnone{os.getpid()}")
    with NetnsPair("tcgone") as pair:
        ns = Netns(pair.ns_a)
        assert ns.alive() and ns.where() == f" in netns {pair.ns_a}"
        sh("ip", "netns", "del", pair.ns_a)
        assert not ns.alive()
        with pytest.raises(NetnsGone, match="is gone"):
            ns.netlink()
        sh("ip", "netns", "add", pair.ns_a)             # a new namespace by the same name
        assert not ns.alive()
        with pytest.raises(NetnsGone, match="was replaced"):
            ns.run(os.getpid)
