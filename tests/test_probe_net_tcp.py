"""net_tcp probe on real TCP traffic between two network namespaces.

Namespace b drops ~10 % of incoming TCP packets (nftables ``numgen random``), so
the senders in namespace a retransmit. Two connections run at once, one on a
selected port and one on an unselected one. Each client, once everything it
sent is acknowledged, reports the kernel's own per-socket view from
``getsockopt(TCP_INFO)``: ``tcpi_total_retrans`` and the ``tcpi_rtt`` samples
it took while sending. The veths carry one segment per packet
(``gso_max_segs 1``), so a retransmitted skb is one retransmitted segment and
the probe's count must match the kernel's.
"""
from __future__ import annotations

import subprocess
import sys
import time

from conftest import require, require_bpf
from netns import NetnsPair

from reflexarc.bpf.net_tcp import NetTcp, format_flow, port_bitmap
from reflexarc.bpf.probe import OK, Selection
from reflexarc.controller.signals.catalogue import CATALOGUE
import pytest

pytestmark = [pytest.mark.kernel, pytest.mark.netns]

SELECTED, OTHER = 15201, 15202
SEND_S = 1.5

SERVER = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1)
print("listening", flush=True)
c, _ = s.accept()
while c.recv(1 << 16):
    pass
"""

# Sends for a while, then waits until the send queue is empty (SIOCOUTQ: unsent
# + unacknowledged bytes), sampling tcpi_rtt all along; prints "<local port>
# <tcpi_total_retrans> <5th> <50th> <95th percentile of the tcpi_rtt samples, us>"
# and waits for stdin.
CLIENT = r"""
import fcntl, socket, statistics, struct, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
c.setblocking(False)
def info():
    raw = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    rtt, = struct.unpack_from("I", raw, 68)
    total_retrans, = struct.unpack_from("I", raw, 100)
    return rtt, total_retrans
end, buf, rtts = time.monotonic() + float(sys.argv[3]), bytes(1 << 14), []
while time.monotonic() < end:
    try:
        c.send(buf)
    except BlockingIOError:
        time.sleep(0.001)
    rtts.append(info()[0])
outq = bytearray(4)
while True:
    fcntl.ioctl(c.fileno(), 0x5411, outq)   # SIOCOUTQ
    if int.from_bytes(outq, sys.byteorder) == 0:
        break
    time.sleep(0.01)
    rtts.append(info()[0])
q = statistics.quantiles(rtts, n=20)
print(c.getsockname()[1], info()[1], q[0], statistics.median(rtts), q[-1], flush=True)
sys.stdin.readline()
"""

LOSS_RULESET = """table inet rxloss {
  chain in {
    type filter hook input priority 0;
    meta l4proto tcp numgen random mod 10 0 drop
  }
}
"""


def _fake_proc(root, netns_dir, tables: dict[str, dict[int, str]], own: str) -> None:
    """A procfs with one process per namespace (``tables``: name -> {pid: tcp table
    text}), each namespace a file whose inode stands in for the namespace's."""
    netns_dir.mkdir(parents=True, exist_ok=True)
    for name, procs in tables.items():
        ns_file = netns_dir / name
        ns_file.write_text("")
        for pid, text in procs.items():
            d = root / str(pid)
            (d / "net").mkdir(parents=True)
            (d / "ns").mkdir()
            (d / "ns" / "net").symlink_to(ns_file)
            (d / "net" / "tcp").write_text(HEADER + text)
    (root / "self").symlink_to(root / str(next(iter(tables[own]))))


HEADER = "  sl  local_address rem_address   st ...\n"


def test_flow_netns_places_flows_by_socket_table(tmp_path):
    from reflexarc.bpf.flow_netns import AMBIGUOUS, UNKNOWN, FlowNetns, read_flows
    proc, runns = tmp_path / "proc", tmp_path / "netns"
    est = "   0: 0200000A:7344 0300000A:A0E2 01 0:0 0:0 0 0 0 1 0\n"     # 10.0.0.2:29508 -> 10.0.0.3:41186
    lo = "   1: 0100007F:7344 0100007F:C350 01 0:0 0:0 0 0 0 2 0\n"      # 127.0.0.1:29508 -> 127.0.0.1:50000
    listen = "   2: 00000000:7344 00000000:0000 0A 0:0 0:0 0 0 0 3 0\n"
    _fake_proc(proc, runns, {"host": {10: lo + listen}, "jobns": {20: est + lo}}, own="host")
    where = FlowNetns(str(proc), str(runns), min_interval=0.0)
    # the controller's own namespace is "", a named one its name, a tuple in both ambiguous
    assert where.of("10.0.0.2:29508->10.0.0.3:41186") == "jobns"
    assert where.of("127.0.0.1:29508->127.0.0.1:50000") == AMBIGUOUS
    assert where.of("10.9.9.9:1->10.9.9.8:2") == UNKNOWN
    assert read_flows(proc / "10" / "net" / "tcp", False) == {"127.0.0.1:29508->127.0.0.1:50000"}  # no listener
    # a flow whose socket closed keeps its namespace until it is no longer reported
    (proc / "20" / "net" / "tcp").write_text(HEADER)
    where.refresh()
    assert where.of("10.0.0.2:29508->10.0.0.3:41186") == "jobns"
    where.forget(set())
    assert where.of("10.0.0.2:29508->10.0.0.3:41186") == UNKNOWN


def test_flow_netns_reads_ipv6_and_mapped_addresses(tmp_path):
    from reflexarc.bpf.flow_netns import read_flows
    table = tmp_path / "tcp6"
    # fd99:5::1 port 29500 -> ::ffff:10.0.0.3 port 40000, as the kernel prints them (per-word host order)
    table.write_text(HEADER + "   0: 050099FD000000000000000001000000:733C "
                     "0000000000000000FFFF00000300000A:9C40 01 0:0 0:0 0 0 0 1 0\n")
    assert read_flows(table, True) == {"[fd99:5::1]:29500->10.0.0.3:40000"}


def test_port_bitmap_sets_exactly_the_ranges():
    words = port_bitmap([(0, 0), (63, 65), (65535, 65535)])
    assert words[0] == 1 | (1 << 63) and words[1] == 0b11 and words[1023] == 1 << 63
    assert sum(bin(w).count("1") for w in words) == 5
    assert format_flow(bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1]), 5201,
                       bytes(15) + b"\x01", 40000) == "10.0.0.1:5201->[::1]:40000"


def test_idle_and_deselected_flows_are_dropped():
    require_bpf()
    probe = NetTcp(Selection(ports=((SELECTED, SELECTED),)), forget_after=60)
    try:
        assert probe.start().state == OK
        table = probe.bpf[b"retrans"]

        def put(sport: int, total: int) -> None:
            key = table.Key()
            key.saddr[:] = list(bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1]))
            key.daddr[:] = list(bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 2]))
            key.sport, key.dport = sport, 40000
            table[key] = table.Leaf(total)

        def totals(now: float) -> dict:
            return {l["flow"]: v for n, l, v in probe.collect(now) if n == "tcp_retransmits_total"}

        put(SELECTED, 3)
        flow = f"10.0.0.1:{SELECTED}->10.0.0.2:40000"
        assert totals(0) == {flow: 3}
        put(SELECTED, 5)
        assert totals(50) == {flow: 5}           # moved at 50
        assert totals(100) == {flow: 5}          # idle for 50 s < 60 s
        assert totals(111) == {} and len(table) == 0

        put(SELECTED, 1)
        probe.update_selection(Selection(ports=((OTHER, OTHER),)))
        assert totals(200) == {} and len(table) == 0
    finally:
        probe.stop()


def test_retransmits_and_srtt_on_selected_port_only():
    require_bpf()
    require(subprocess.run(["nft", "--version"], capture_output=True).returncode == 0, "nft (nftables)")
    with NetnsPair("tcp") as pair:
        for side, ifname in (("a", pair.if_a), ("b", pair.if_b)):
            pair.run(side, "ip", "link", "set", "dev", ifname, "gso_max_segs", "1")
        pair.run("b", "nft", "-f", "-", input=LOSS_RULESET)

        probe = NetTcp(Selection(ports=((SELECTED, SELECTED),), job="j"), node="n1")
        procs: list[subprocess.Popen] = []
        try:
            status = probe.start()
            assert status.state == OK, status
            servers = [pair.popen("b", sys.executable, "-c", SERVER, pair.addr_b, str(port),
                                  stdout=subprocess.PIPE, text=True) for port in (SELECTED, OTHER)]
            procs += servers
            for s in servers:
                assert s.stdout.readline().strip() == "listening"
            clients = [pair.popen("a", sys.executable, "-c", CLIENT, pair.addr_b, str(port), str(SEND_S),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                       for port in (SELECTED, OTHER)]
            procs += clients
            reports = [c.stdout.readline().split() for c in clients]
            out = probe.collect(time.time())
        finally:
            probe.stop()
            for p in procs:
                p.kill()
                p.wait()

    (sel_port, sel_retrans, *sel_rtt), (other_port, other_retrans, *_) = (
        (int(r[0]), int(r[1]), *map(float, r[2:])) for r in reports)
    assert sel_retrans > 0 and other_retrans > 0, "the loss rule did not cause retransmits"

    flows = {(n, labels["flow"], labels.get("quantile")): (labels, v) for n, labels, v in out}
    for (_, flow, _), (labels, _) in flows.items():
        assert str(OTHER) not in flow, f"unselected port counted: {flow}"
        assert labels["port"] == str(SELECTED) and labels["job"] == "j"

    client_flow = f"{pair.addr_a}:{sel_port}->{pair.addr_b}:{SELECTED}"
    _, counted = flows[("tcp_retransmits_total", client_flow, None)]
    # One segment per skb: the tracepoint count and the kernel's own count agree
    # (a few retransmits may fail in the driver and be retried).
    assert sel_retrans / 1.5 <= counted <= sel_retrans * 1.5, (counted, sel_retrans)

    # srtt in microseconds: the probe's median lies within the bulk (5th to 95th
    # percentile, a slot's width of slack) of the socket's own tcpi_rtt samples
    # (also srtt_us >> 3), taken while it sent and drained. The two sample the
    # same srtt differently (the probe at each segment received, the client
    # between its sends), so their medians need not agree: on a loaded host they
    # were 4x apart.
    _, p50 = flows[("tcp_srtt_us", client_flow, "0.5")]
    _, p99 = flows[("tcp_srtt_us", client_flow, "0.99")]
    lo, _, hi = sel_rtt
    assert lo / 1.25 <= p50 <= hi * 1.25, (p50, "5th, 50th, 95th:", sel_rtt)
    assert 1 <= p50 <= p99 < 1_000_000
    server_flow = f"{pair.addr_b}:{SELECTED}->{pair.addr_a}:{sel_port}"
    assert ("tcp_srtt_us", server_flow, "0.5") in flows
    # Each end is labelled with the namespace whose socket table holds it.
    assert flows[("tcp_srtt_us", client_flow, "0.5")][0]["netns"] == pair.ns_a
    assert flows[("tcp_srtt_us", server_flow, "0.5")][0]["netns"] == pair.ns_b

    for name, labels, _ in out:
        assert set(labels) <= set(CATALOGUE[name].labels), (name, labels)
