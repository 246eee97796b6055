"""The dscp actuator against real interfaces: a veth between two namespaces, the
classifier on the egress of side a, frames captured in side b."""
from __future__ import annotations

import json
import os
import re
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import require, require_bpf, require_root
from netns import NetnsPair, sh

from reflexarc.actuators.base import Change, PermanentActuatorError, Registry, Target
from reflexarc.actuators.dscp import FILTER_PRIO, DscpActuator
from reflexarc.actuators.specs import SPECS
from reflexarc.controller.engine.clock import WallClock
from reflexarc.controller.engine.executor import Executor
from reflexarc.controller.engine.journal import Journal
from reflexarc.controller.policy.loader import load_policies
from reflexarc.core.cgroups import cgroup2_root
from reflexarc.core.outcomes import Outcome

pytestmark = [pytest.mark.kernel, pytest.mark.netns]

ETH_P_ALL = 0x0003
ECT0 = 0x02          # ECN bits the senders set; marking must keep them


@pytest.fixture
def pair():
    require_bpf()
    with NetnsPair("d") as p:
        yield p


def remove_pins(root: Path) -> None:
    for leftover in sorted(root.rglob("*"), reverse=True) if root.exists() else ():
        leftover.rmdir() if leftover.is_dir() else leftover.unlink()
    if root.exists():
        root.rmdir()


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """(state_dir, pin_dir) shared by every instance in this module, as on one node."""
    pin_root = Path(f"/sys/fs/bpf/rxtest-dscp-{os.getpid()}")
    yield str(tmp_path_factory.mktemp("dscp-state")), str(pin_root / "dscp")
    remove_pins(pin_root)


@pytest.fixture(scope="module")
def shared():
    """One instance for the module, so the C compiles once."""
    return {}


@pytest.fixture
def act(dirs, shared):
    require_bpf()
    if "act" not in shared:
        shared["act"] = DscpActuator(pin_dir=dirs[1])
    yield shared["act"]
    leftover = Path(dirs[1]).exists()
    if leftover:                  # start the next test from scratch
        shared.pop("act").close()
        remove_pins(Path(dirs[1]))
    assert not leftover, "pins left behind after every change was reverted"


def netns_socket(ns: str, family: int, kind: int, proto: int = 0) -> socket.socket:
    from pyroute2 import netns
    return netns.create_socket(ns, family, kind, proto, flags=0)


class Capture:
    """Frames arriving at side b, parsed down to (family, proto, sport, dport, ds byte)."""

    def __init__(self, pair: NetnsPair) -> None:
        self.sock = netns_socket(pair.ns_b, socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.bind((pair.if_b, 0))
        self.sock.settimeout(0.2)

    def close(self) -> None:
        self.sock.close()

    @staticmethod
    def parse(frame: bytes):
        ethertype = struct.unpack("!H", frame[12:14])[0]
        ip = frame[14:]
        if ethertype == 0x0800:
            ihl = (ip[0] & 0x0F) * 4
            words = struct.unpack(f"!{ihl // 2}H", ip[:ihl])
            total = sum(words)
            while total >> 16:
                total = (total & 0xFFFF) + (total >> 16)
            assert total == 0xFFFF, "IPv4 header checksum is wrong after the rewrite"
            family, proto, ds, l4 = 4, ip[9], ip[1], ip[ihl:]
        elif ethertype == 0x86DD:
            family, proto, ds, l4 = 6, ip[6], ((ip[0] & 0x0F) << 4) | (ip[1] >> 4), ip[40:]
        else:
            return None
        if proto not in (socket.IPPROTO_TCP, socket.IPPROTO_UDP):
            return None
        sport, dport = struct.unpack("!HH", l4[:4])
        return family, proto, sport, dport, ds

    def ds_of(self, family: int, proto: int, dport: int, seconds: float = 5.0) -> int:
        """The DS byte of the first captured frame of that flow."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                frame = self.sock.recv(65535)
            except socket.timeout:
                continue
            seen = self.parse(frame)
            if seen and seen[:2] == (family, proto) and seen[3] == dport:
                return seen[4]
        raise AssertionError(f"no IPv{family} proto {proto} frame to port {dport} arrived")


def send_udp(pair: NetnsPair, family: int, dport: int, sport: int = 0, tos: int = ECT0) -> int:
    """One datagram a -> b; returns the TOS/traffic class the receiver got (IP_RECVTOS)."""
    dst = pair.addr_b if family == 4 else pair.addr6_b
    af = socket.AF_INET if family == 4 else socket.AF_INET6
    rx = netns_socket(pair.ns_b, af, socket.SOCK_DGRAM)
    tx = netns_socket(pair.ns_a, af, socket.SOCK_DGRAM)
    try:
        rx.bind((dst, dport))
        rx.settimeout(5)
        if family == 4:
            rx.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
            tx.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
        else:
            rx.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVTCLASS, 1)
            tx.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tos)
        if sport:
            tx.bind(("", sport))
        tx.sendto(b"reflexarc", (dst, dport))
        data, ancillary, _, _ = rx.recvmsg(64, 64)
        assert data == b"reflexarc"
        (_, _, value), = ancillary
        return value[0]
    finally:
        rx.close()
        tx.close()


def send_tcp(pair: NetnsPair, family: int, dport: int) -> None:
    dst = pair.addr_b if family == 4 else pair.addr6_b
    af = socket.AF_INET if family == 4 else socket.AF_INET6
    server = netns_socket(pair.ns_b, af, socket.SOCK_STREAM)
    client = netns_socket(pair.ns_a, af, socket.SOCK_STREAM)
    try:
        server.bind((dst, dport))
        server.listen(1)
        client.settimeout(5)
        client.connect((dst, dport))
        client.sendall(b"reflexarc" * 100)
        conn, _ = server.accept()
        conn.close()
    finally:
        client.close()
        server.close()


def tc_state(pair: NetnsPair, ifname: str) -> str:
    run = lambda *argv: pair.run("a", "tc", *argv).stdout
    return (run("qdisc", "show", "dev", ifname) + run("filter", "show", "dev", ifname, "egress")
            + run("filter", "show", "dev", ifname, "ingress"))


def target(pair: NetnsPair, **selector) -> Target:
    return Target({"job": "llama"}, {"interfaces": [pair.if_a], "netns": pair.ns_a, **selector})


def test_marks_matching_udp_flows_ipv4_and_ipv6_keeping_ecn(pair, act):
    t = target(pair)
    assert act.read_current(t) == {pair.if_a: {"clsact": False, "filter": False, "rules": []}}
    change = act.plan(t, {"dscp": "AF41", "ports": ["5000-5010"], "protocol": "udp"})
    assert change.before == {pair.if_a: {"clsact": False, "filter": False, "rules": []}}
    assert tc_state(pair, pair.if_a).count("clsact") == 0, "plan must not write"
    act.apply(change)
    try:
        assert act.read_current(t) == change.after
        cap = Capture(pair)
        try:
            for family in (4, 6):
                assert send_udp(pair, family, 5005) == (34 << 2) | ECT0
                assert cap.ds_of(family, socket.IPPROTO_UDP, 5005) == (34 << 2) | ECT0
                assert send_udp(pair, family, 5010, tos=0x01) == (34 << 2) | 0x01
                assert send_udp(pair, family, 6000, tos=(8 << 2) | ECT0) == (8 << 2) | ECT0, "unmatched"
                assert send_udp(pair, family, 6001, sport=5001) == (34 << 2) | ECT0, "source port matches too"
        finally:
            cap.close()
        act.apply(change)           # idempotent: no second rule, no second filter
        assert act.read_current(t) == change.after
        assert act.plan(t, {"dscp": "AF41", "ports": ["5000-5010"], "protocol": "udp"}).noop
    finally:
        act.revert(change)
    act.revert(change)              # idempotent
    assert act.read_current(t) == change.before
    assert send_udp(pair, 4, 5005) == ECT0


def test_prepare_compiles_ahead_and_leaves_nothing_pinned(pair, dirs):
    """The controller prepares an enforcing policy's actuators at start: the
    classifier is compiled then, no pin is left, and the first retag reuses it."""
    act = DscpActuator(pin_dir=dirs[1])
    try:
        act.prepare()
        compiled = act._bpf
        assert compiled is not None and not Path(dirs[1]).exists(), "prepare must change nothing"
        change = act.plan(target(pair), {"dscp": "EF", "ports": [5000], "protocol": "udp"})
        act.apply(change)
        assert act._bpf is compiled, "the first apply recompiled"
        assert send_udp(pair, 4, 5000) >> 2 == 46
        act.revert(change)
        assert not Path(dirs[1]).exists()
    finally:
        act.close()


@pytest.mark.parametrize("left", ["complete", "maps-only", "rules-only"])
def test_pins_a_crash_left_are_settled_by_the_next_start(pair, dirs, left):
    """Killed before ``prepare`` unpinned (a complete set holding nothing), between
    pinning the maps and the program, or while unpinning (maps without a
    program): the next controller's ``prepare`` removes what holds nothing, and a
    set still in use gets its program back, so its change can be reverted."""
    crashed = DscpActuator(pin_dir=dirs[1])
    try:
        with crashed._locked():
            crashed._load().close()                     # what a kill right after pinning leaves
        pins = Path(dirs[1])
        if left != "complete":
            (pins / "prog").unlink()
        if left == "rules-only":
            (pins / "ifaces").unlink()
            (pins / "meta").unlink()
    finally:
        crashed.close()
    restarted = DscpActuator(pin_dir=dirs[1])
    try:
        restarted.prepare()
        assert not Path(dirs[1]).exists(), f"left: {sorted(p.name for p in Path(dirs[1]).iterdir())}"
    finally:
        restarted.close()


def test_a_change_whose_program_pin_a_crash_removed_still_reverts(pair, dirs):
    """The program's pin lost while its rules and filter are live: revert re-pins
    the program from the maps still pinned, drops the rules and leaves nothing."""
    first = DscpActuator(pin_dir=dirs[1])
    snapshot = tc_state(pair, pair.if_a)
    try:
        change = first.plan(target(pair), {"dscp": "EF", "ports": [5000], "protocol": "udp"})
        first.apply(change)
    finally:
        first.close()
    (Path(dirs[1]) / "prog").unlink()
    restarted = DscpActuator(pin_dir=dirs[1])
    try:
        assert send_udp(pair, 4, 5000) >> 2 == 46, "the filter still marks: the kernel holds the program"
        restarted.revert(change)
        assert tc_state(pair, pair.if_a) == snapshot
        assert send_udp(pair, 4, 5000) == ECT0
        assert not Path(dirs[1]).exists()
    finally:
        restarted.close()


def test_marks_tcp_by_port_and_not_udp(pair, act):
    change = act.plan(target(pair), {"dscp": "EF", "ports": [29500], "protocol": "tcp"})
    act.apply(change)
    try:
        cap = Capture(pair)
        try:
            send_tcp(pair, 4, 29500)
            assert cap.ds_of(4, socket.IPPROTO_TCP, 29500) >> 2 == 46
            send_tcp(pair, 6, 29500)
            assert cap.ds_of(6, socket.IPPROTO_TCP, 29500) >> 2 == 46
            send_tcp(pair, 4, 29501)
            assert cap.ds_of(4, socket.IPPROTO_TCP, 29501) >> 2 == 0
        finally:
            cap.close()
        assert send_udp(pair, 4, 29500) == ECT0, "protocol tcp must not mark udp"
    finally:
        act.revert(change)


def test_address_prefixes_match_source_or_destination(pair, act):
    change = act.plan(target(pair), {"dscp": "CS3", "protocol": "any",
                                     "addresses": [f"{pair.addr6_b}/128", "192.0.2.0/24"]})
    act.apply(change)
    try:
        assert send_udp(pair, 6, 7000) == (24 << 2) | ECT0
        assert send_udp(pair, 4, 7000) == ECT0
    finally:
        act.revert(change)


def test_retag_is_a_map_update_and_revert_uncovers_the_older_mark(pair, act):
    t = target(pair)
    first = act.plan(t, {"dscp": "EF", "ports": ["5000-5010"], "protocol": "udp"})
    act.apply(first)
    try:
        filters = pair.run("a", "tc", "filter", "show", "dev", pair.if_a, "egress").stdout
        prog_id = re.search(r"\bid (\d+)", filters).group(1)
        second = act.plan(t, {"dscp": "AF11", "ports": ["5000-5010"], "protocol": "udp"})
        assert second.before == first.after and not second.noop
        act.apply(second)
        try:
            assert pair.run("a", "tc", "filter", "show", "dev", pair.if_a, "egress").stdout == filters, \
                f"the filter (prog id {prog_id}) must stay as it was"
            assert send_udp(pair, 4, 5003) == (10 << 2) | ECT0
        finally:
            act.revert(second)
        assert send_udp(pair, 4, 5003) == (46 << 2) | ECT0
        assert act.read_current(t) == first.after
    finally:
        act.revert(first)
    assert act.read_current(t) == first.before


def test_stacked_changes_revert_in_any_order(pair, act):
    t = target(pair)
    snapshot = tc_state(pair, pair.if_a)
    first = act.plan(t, {"dscp": "AF41", "ports": ["5000"], "protocol": "udp"})
    act.apply(first)
    second = act.plan(t, {"dscp": "CS1", "ports": ["6000"], "protocol": "udp"})
    assert second.before[pair.if_a]["clsact"] and second.before[pair.if_a]["filter"]
    act.apply(second)
    try:
        act.revert(first)           # the one that created clsact and filter goes first
        assert send_udp(pair, 4, 6000) == (8 << 2) | ECT0, "the other change must keep working"
        assert send_udp(pair, 4, 5000) == ECT0
    finally:
        act.revert(first)
        act.revert(second)
    assert tc_state(pair, pair.if_a) == snapshot


@pytest.mark.parametrize("clsact_before", [False, True])
def test_revert_restores_tc_state_and_spares_foreign_filters(pair, act, clsact_before):
    ifname = pair.if_a
    if clsact_before:
        pair.run("a", "tc", "qdisc", "add", "dev", ifname, "clsact")
        pair.run("a", "tc", "filter", "add", "dev", ifname, "egress", "prio", "100", "protocol", "ip",
                 "u32", "match", "ip", "dst", "192.0.2.1/32", "classid", "1:1")
        pair.run("a", "tc", "filter", "add", "dev", ifname, "egress", "prio", "20000", "bpf",
                 "bytecode", "1,6 0 0 0,", "classid", "1:2")
        pair.run("a", "tc", "filter", "add", "dev", ifname, "ingress", "prio", "7", "protocol", "ip",
                 "u32", "match", "ip", "src", "192.0.2.1/32", "classid", "1:3")
    snapshot = tc_state(pair, ifname)
    change = act.plan(target(pair), {"dscp": "AF21", "ports": ["5000"], "protocol": "udp"})
    assert change.before[ifname]["clsact"] is clsact_before
    act.apply(change)
    try:
        applied = tc_state(pair, ifname)
        assert f"pref {FILTER_PRIO} bpf" in applied
        if clsact_before:
            assert "pref 100 u32" in applied and "pref 20000 bpf" in applied and "pref 7 u32" in applied
        assert send_udp(pair, 4, 5000) == (18 << 2) | ECT0
    finally:
        act.revert(change)
    assert tc_state(pair, ifname) == snapshot


def test_restarted_process_reverts_from_the_serialized_change(pair, act, dirs):
    t = target(pair)
    snapshot = tc_state(pair, pair.if_a)
    change = act.plan(t, {"dscp": "CS5", "ports": ["5000-5001"], "protocol": "udp"})
    journaled = json.dumps(change.to_dict())
    act.apply(change)
    restarted = DscpActuator(pin_dir=dirs[1])
    try:
        assert send_udp(pair, 4, 5000) == (40 << 2) | ECT0
        assert restarted.read_current(t) == change.after
    finally:
        restarted.revert(Change.from_dict(json.loads(journaled)))
    assert tc_state(pair, pair.if_a) == snapshot
    assert send_udp(pair, 4, 5000) == ECT0


def test_half_applied_change_is_reverted(pair, act):
    extra = f"rxd{os.getpid() % 10000}x"
    pair.run("a", "ip", "link", "add", extra, "type", "veth", "peer", "name", extra + "p")
    snapshot = tc_state(pair, pair.if_a)
    t = Target({"job": "llama"}, {"interfaces": [pair.if_a, extra], "netns": pair.ns_a})
    change = act.plan(t, {"dscp": "EF", "ports": ["5000"], "protocol": "udp"})
    pair.run("a", "ip", "link", "del", extra)
    with pytest.raises(PermanentActuatorError, match=extra):
        act.apply(change)
    act.revert(change)
    assert tc_state(pair, pair.if_a) == snapshot
    assert act.read_current(target(pair)) == {pair.if_a: {"clsact": False, "filter": False, "rules": []}}


def test_revert_after_the_namespace_is_gone(pair, act):
    change = act.plan(target(pair), {"dscp": "EF", "ports": ["5000"], "protocol": "udp"})
    act.apply(change)
    sh("ip", "netns", "del", pair.ns_a)
    act.revert(change)       # the rule and interface entry go; the fixture checks the pins went too


def add_htb(pair: NetnsPair) -> None:
    """Side a's root qdisc: HTB 1: with leaf classes 1:10 and 1:20 (the default)."""
    pair.run("a", "tc", "qdisc", "add", "dev", pair.if_a, "root", "handle", "1:", "htb", "default", "20")
    for minor in ("10", "20"):
        pair.run("a", "tc", "class", "add", "dev", pair.if_a, "parent", "1:", "classid", f"1:{minor}",
                 "htb", "rate", "100mbit")


def class_counters(pair: NetnsPair) -> dict[str, tuple[int, int]]:
    """(bytes, packets) sent per HTB class of side a's interface, from ``tc -s class show``."""
    stats = pair.run("a", "tc", "-s", "class", "show", "dev", pair.if_a).stdout
    found = re.findall(r"class htb (\S+) .*\n\s*Sent (\d+) bytes (\d+) pkt", stats)
    return {cls: (int(sent), int(pkts)) for cls, sent, pkts in found}


def grown(before: dict, after: dict, cls: str) -> tuple[int, int]:
    return after[cls][0] - before[cls][0], after[cls][1] - before[cls][1]


def test_class_queues_the_flows_in_that_htb_class(pair, act):
    add_htb(pair)
    t = target(pair)
    change = act.plan(t, {"dscp": "CS1", "ports": ["5000"], "protocol": "udp", "class": "1:10"})
    assert change.params["class"] == "1:10" and "priority" not in change.params
    assert [r["class"] for r in change.after[pair.if_a]["rules"]] == ["1:10"]
    assert change.summary == (f"dscp CS1 (8) on {pair.ns_a}:{pair.if_a} for udp ports 5000-5000, "
                              f"qdisc class 1:10 [job=llama]")
    act.apply(change)
    try:
        assert act.read_current(t) == change.after, "the rule in the map sets skb->priority 0x10010"
        before = class_counters(pair)
        for _ in range(5):
            assert send_udp(pair, 4, 5000) == (8 << 2) | ECT0
        assert send_udp(pair, 6, 5000) == (8 << 2) | ECT0
        assert send_udp(pair, 4, 6000) == ECT0, "unmatched"
        after = class_counters(pair)
        frame = 14 + 20 + 8 + len(b"reflexarc")
        sent, packets = grown(before, after, "1:10")
        assert packets == 6 and sent >= 5 * frame, (before, after)
        assert grown(before, after, "1:20")[0] >= frame, "the unmatched datagram takes the default class"
    finally:
        act.revert(change)
    before = class_counters(pair)
    send_udp(pair, 4, 5000)
    assert grown(before, class_counters(pair), "1:10") == (0, 0), "after revert, port 5000 is not steered"


def test_a_missing_class_fails_the_plan_naming_the_classes_there(pair, act, dirs):
    t = target(pair)
    where = f"{pair.if_a} in netns {pair.ns_a}"
    plan = lambda cls: act.plan(t, {"dscp": "CS1", "ports": ["5000"], "protocol": "udp", "class": cls})
    with pytest.raises(PermanentActuatorError, match=re.escape(f"{where} has qdisc noqueue, which has no classes")):
        plan("1:30")
    add_htb(pair)
    for classid, parent in (("1:1", "1:"), ("1:31", "1:1")):
        pair.run("a", "tc", "class", "add", "dev", pair.if_a, "parent", parent, "classid", classid,
                 "htb", "rate", "10mbit")
    with pytest.raises(PermanentActuatorError,
                       match=re.escape(f"{where} has no class 1:30 (classes: 1:1, 1:10, 1:20, 1:31)")):
        plan("1:30")
    with pytest.raises(PermanentActuatorError, match=re.escape(
            f"class 1:1 of {where} has classes under it (1:31); htb queues packets only in leaf classes")):
        plan("1:1")
    with pytest.raises(PermanentActuatorError, match="parameter 'class' of 'dscp': '1:3z' is not a tc class id"):
        plan("1:3z")
    assert plan("01:010").params["class"] == "1:10", "written as tc prints it"
    assert not Path(dirs[1]).exists(), "a failed plan writes nothing"


def policy_for(tmp_path: Path, pair: NetnsPair):
    """A policy whose selector names side a's namespace and interface, as a file would."""
    path = tmp_path / "demote.yaml"
    path.write_text(f"""\
policies:
  - name: demote-bulk
    mode: enforce
    selector: {{match: {{job: llama}}, interfaces: [{pair.if_a}], netns: {pair.ns_a}}}
    rules:
      - name: congested
        when: {{signal: tcp_retransmits_total, agg: rate, window: 10s, op: ">", threshold: 50}}
        actions:
          - actuator: dscp
            params: {{dscp: CS1, ports: ["5000"], protocol: udp}}
        rollback: {{on: [clear]}}
""")
    (policy,) = load_policies([str(path)])
    return policy


def executor(act: DscpActuator, state: Path) -> tuple[Executor, Journal]:
    registry = Registry()
    registry.register(SPECS["dscp"], lambda: act)
    journal = Journal(state / "journal.jsonl", WallClock())
    return Executor(registry, journal, WallClock()), journal


def test_selector_netns_reaches_the_plan_the_journal_and_its_listing(pair, act, tmp_path, cli):
    policy = policy_for(tmp_path, pair)
    rule = policy.rules[0]
    assert policy.selector.netns == pair.ns_a
    # as the lifecycle makes a target: the selector as a dict, plus where it comes from
    t = Target({"job": "llama"}, {**policy.selector.to_dict(), "policy": policy.name, "rule": rule.name})
    ex, journal = executor(act, tmp_path)
    res = ex.act("dscp", t, rule.actions[0].params, "enforce", policy=policy.name, rule=rule.name)
    try:
        assert res.outcome is Outcome.APPLIED, res.error
        assert res.change.params["netns"] == pair.ns_a
        assert f" on {pair.ns_a}:{pair.if_a} for udp ports 5000-5000 " in res.change.summary
        assert send_udp(pair, 4, 5000) == (8 << 2) | ECT0
        assert f"{pair.ns_a}:{pair.if_a}" in journal.get(res.journal_id).change["summary"]
        journal.close()
        listing = cli("--state-dir", str(tmp_path), "journal", timeout=60, check=0).stdout
        assert f"demote-bulk/congested  dscp CS1 (8) on {pair.ns_a}:{pair.if_a} " in listing, listing
        journal = Journal(tmp_path / "journal.jsonl", WallClock())
        ex.journal = journal
    finally:
        assert ex.revert(res.change, res.journal_id, "enforce").outcome is Outcome.REVERTED
        journal.close()
    elsewhere = Target({}, {**t.selector, "netns": pair.ns_b})
    assert act.plan(elsewhere, {"dscp": "CS1", "netns": pair.ns_a}).params["netns"] == pair.ns_a, \
        "a netns parameter overrides the selector's"
    with pytest.raises(PermanentActuatorError, match=f"{pair.if_a} not found in netns {pair.ns_b}"):
        act.plan(elsewhere, {"dscp": "CS1"})


@pytest.mark.parametrize("gone", ["interface", "netns", "netns re-created"])
def test_a_gone_target_closes_the_change_and_its_rules_leave_the_pins(pair, act, dirs, tmp_path, gone):
    ex, journal = executor(act, tmp_path)
    with NetnsPair("g") as other:
        kept = act.plan(target(other), {"dscp": "AF41", "ports": ["5000"], "protocol": "udp"})
        act.apply(kept)
        try:
            res = ex.act("dscp", target(pair), {"dscp": "EF", "ports": ["5000"], "protocol": "udp"}, "enforce")
            assert res.outcome is Outcome.APPLIED and act.exists(res.change)
            if gone == "interface":
                pair.run("a", "ip", "link", "del", pair.if_a)
            else:
                sh("ip", "netns", "del", pair.ns_a)
            if gone == "netns re-created":    # same names, another namespace: not the change's
                sh("ip", "netns", "add", pair.ns_a)
                sh("ip", "-n", pair.ns_a, "link", "add", pair.if_a, "type", "veth", "peer", "name", pair.if_a + "p")
            assert ex.revert(res.change, res.journal_id, "enforce").outcome is Outcome.TARGET_GONE
            assert journal.get(res.journal_id).state == Outcome.TARGET_GONE
            assert not act.exists(res.change)
            assert act.read_current(target(other)) == kept.after, "the other change keeps its rules"
            if gone == "netns re-created":
                assert act.read_current(target(pair)) == {pair.if_a: {"clsact": False, "filter": False, "rules": []}}
        finally:
            act.revert(kept)
            journal.close()
    assert not Path(dirs[1]).exists(), "no rule and no interface entry of the gone change was left pinned"


def test_a_change_journaled_with_a_numeric_priority_still_reverts(pair, act, dirs):
    add_htb(pair)
    snapshot = tc_state(pair, pair.if_a)
    # the kernel holds what the code before 'class' wrote: a rule with skb->priority 0x10010
    change = act.plan(target(pair), {"dscp": "AF31", "ports": ["5000"], "protocol": "udp", "class": "1:10"})
    act.apply(change)
    p, ifname = change.params, pair.if_a
    rule = {"owner": p["owner"], "seq": p["seq"], "dscp": 26, "protocol": "udp", "ports": [5000, 5000],
            "address": None, "cgroup_id": None, "priority": 0x10010}
    journaled = json.dumps({   # that code's journal record
        "actuator": "dscp", "target": {"labels": {"job": "llama"}, "selector": {"interfaces": [ifname],
                                                                                "netns": pair.ns_a}},
        "params": {"dscp": 26, "interfaces": [ifname], "netns": pair.ns_a, "protocol": "udp",
                   "ports": [[5000, 5000]], "addresses": [], "priority": 0x10010, "match_cgroup": False,
                   "cgroup_id": None, "owner": p["owner"], "seq": p["seq"], "netns_cookie": p["netns_cookie"]},
        "before": {ifname: {"clsact": False, "filter": False, "rules": []}},
        "after": {ifname: {"clsact": True, "filter": True, "rules": [rule]}},
        "summary": f"dscp AF31 (26) for udp ports 5000-5000 on {ifname} [job=llama]"})
    before = class_counters(pair)
    assert send_udp(pair, 4, 5000) == (26 << 2) | ECT0
    assert grown(before, class_counters(pair), "1:10")[1] == 1
    restarted = DscpActuator(pin_dir=dirs[1])
    record = Change.from_dict(json.loads(journaled))
    assert restarted.exists(record)
    restarted.revert(record)
    assert tc_state(pair, ifname) == snapshot
    assert act.read_current(target(pair)) == {ifname: {"clsact": False, "filter": False, "rules": []}}


SENDER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 2)
s.sendto(b"reflexarc", (sys.argv[1], int(sys.argv[2])))
"""


def test_match_cgroup_marks_only_the_jobs_sockets(pair, act):
    root = cgroup2_root()
    require(root is not None, "a mounted cgroup2 hierarchy")
    job = root / f"rxdscp{os.getpid()}"
    job.mkdir()
    try:
        change = act.plan(target(pair, cgroup=f"/{job.name}"),
                          {"dscp": "AF42", "ports": ["5000-5001"], "protocol": "udp", "match_cgroup": True})
        assert change.params["cgroup_id"] == job.stat().st_ino
        act.apply(change)
        try:
            def join_job():
                (job / "cgroup.procs").write_text(str(os.getpid()))
            cap = Capture(pair)
            try:
                for port, preexec in ((5000, join_job), (5001, None)):
                    subprocess.run(["ip", "netns", "exec", pair.ns_a, sys.executable, "-c", SENDER,
                                    pair.addr_b, str(port)], check=True, preexec_fn=preexec, timeout=60)
                assert cap.ds_of(4, socket.IPPROTO_UDP, 5000) == (36 << 2) | ECT0
                assert cap.ds_of(4, socket.IPPROTO_UDP, 5001) == ECT0
            finally:
                cap.close()
        finally:
            act.revert(change)
    finally:
        job.rmdir()


def test_bad_requests_are_permanent_and_plan_writes_nothing(pair, act, dirs):
    t = target(pair)
    for params, words in (({"dscp": "AF99"}, "bad DSCP"), ({"dscp": "EF", "ports": ["9-1"]}, "port range"),
                          ({"dscp": "EF", "protocol": "sctp"}, "protocol"),
                          ({"dscp": "EF", "interfaces": ["nosuchif0"]}, "nosuchif0"),
                          ({"dscp": "EF", "match_cgroup": True}, "cgroup"),
                          ({"dscp": "EF", "netns": f"rxnone{os.getpid()}"}, "does not exist"),
                          ({"dscp": "EF", "netns": "a/b"}, "parameter 'netns' of 'dscp': 'a/b' is not a network "
                                                           "namespace: use a name in /run/netns"),
                          ({"dscp": "EF", "addresses": ["10.0.0.0/8", "10.0.0.300/8"]},
                           "parameter 'addresses' of 'dscp': '10.0.0.300/8' is not an IPv4 or IPv6 prefix"),
                          ({"dscp": "EF", "class": "1:0"}, "'1:0' is not a tc class id"),
                          ({"dscp": "EF", "priority": 0x10030}, "has no parameter 'priority'")):
        with pytest.raises(PermanentActuatorError, match=words):
            act.plan(t, params)
    with pytest.raises(PermanentActuatorError, match="selector: 'a/b' is not a network namespace"):
        act.plan(Target({}, {"interfaces": [pair.if_a], "netns": "a/b"}), {"dscp": "EF"})
    act.plan(t, {"dscp": "EF"})
    assert not Path(dirs[1]).exists()
    assert "clsact" not in tc_state(pair, pair.if_a)


def test_dump_bpf_shows_cflags_and_source(tmp_path):
    text = DscpActuator(pin_dir="/sys/fs/bpf/x/dscp", max_rules=128).dump_bpf()
    assert "// cflag: -DMAX_RULES=128" in text
    assert '-DPIN_RULES="/sys/fs/bpf/x/dscp/rules"' in text
    assert "int dscp_egress(struct __sk_buff *skb)" in text and "actuators/dscp.py" in text
    assert "struct rule {" in text and '#include "dscp.h"' not in text     # the header in its place


def test_pins_are_locked_across_state_dirs_and_no_empty_directory_is_left(tmp_path):
    """Two controllers with different --state-dir share the pins, so they share
    one lock: the pin directory itself. A directory a crash left empty (made, not
    yet pinned) is gone after the next locked step."""
    import fcntl
    require_root()
    require(Path("/sys/fs/bpf").is_dir(), "bpffs mounted at /sys/fs/bpf")
    pin_dir = Path(f"/sys/fs/bpf/rxlock{os.getpid()}/dscp")
    first, second = DscpActuator(pin_dir=str(pin_dir)), DscpActuator(pin_dir=str(pin_dir))
    try:
        pin_dir.mkdir(parents=True)                 # what a crash after mkdir leaves
        with first._locked():
            fd = os.open(pin_dir, os.O_RDONLY | os.O_DIRECTORY)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held = False
                except BlockingIOError:
                    held = True
            finally:
                os.close(fd)
            assert held, "the pin directory is not locked while a step holds it"
        assert not pin_dir.exists() and not pin_dir.parent.exists(), "an empty pin directory was left"
        with second._locked():                      # and the next holder makes it again
            assert pin_dir.is_dir()
        assert not pin_dir.parent.exists()
    finally:
        for d in (pin_dir, pin_dir.parent):
            if d.exists():
                d.rmdir()


def test_drift_names_a_filter_removed_behind_the_actuators_back(pair, act):
    t = target(pair)
    change = act.plan(t, {"dscp": "CS1", "ports": ["443"], "protocol": "tcp"})
    act.apply(change)
    try:
        assert act.drift(change) is None
        pair.run("a", "tc", "filter", "del", "dev", pair.if_a, "egress")
        assert act.drift(change) == f"the DSCP filter on {pair.if_a} is gone"
    finally:
        act.revert(change)
