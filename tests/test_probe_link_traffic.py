"""link_traffic probe on real interfaces: a veth between two fresh network
namespaces, the probe on the egress of side a, TCP and UDP traffic from real
processes.

The job is a cgroup v2 directory made for the test; its sender runs in a child
directory of it (so the program's ancestor walk is what selects it), the
competing sender outside it. Each sender pushes a known number of bytes, and
waits until the receiver has read them all, so everything it sent has left
side a. The probe's per-traffic totals must match the byte counts (plus
headers), their sum the veth's own ``tx_bytes``, and the utilisation the
declared speed. Every attach level is exercised (``level=``): tcx links, the
clsact filter (with the stale filter of a killed process and qdisc ownership)
and the netlink counters. A second SCHED_CLS program that rewrites the IPv4 TOS
runs after the counter, as a later tcx link and as a clsact filter like the
DSCP marker's, and must still mark. Namespaces and the cgroup carry this
run's pid (``lt<pid>`` in their names).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import require, require_bpf
from netns import NetnsPair, sh

from reflexarc.bpf.link_traffic import (CLSACT, COUNTERS, FILTER_HANDLE, FILTER_NAME, FILTER_NAME_OWNS_QDISC,
                                        FILTER_PRIO, TCX, LinkTraffic, ethtool_speed, tcx_attach, tcx_detach,
                                        tcx_query, tcx_supported)
from reflexarc.bpf.probe import DEGRADED, OK, STOPPED, UNSUPPORTED, Selection
from reflexarc.core.tc import Netns
from reflexarc.core.cgroups import cgroup2_root

pytestmark = [pytest.mark.kernel, pytest.mark.netns]

TAG = f"lt{os.getpid() % 10000}"
JOB_BYTES, OTHER_BYTES = 12 << 20, 5 << 20
PORT = 15401
EF = 0xB8

SERVER = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(8)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    n = 0
    while True:
        b = c.recv(1 << 20)
        if not b:
            break
        n += len(b)
    c.close()
    print(n, flush=True)
"""

# Sends argv[3] bytes (or, with argv[4], for argv[4] seconds), then waits for the
# receiver to close: by then every byte has left this side. Prints the kernel's
# own count of what the socket sent, retransmits included (TCP_INFO
# tcpi_bytes_sent), and of its segments (tcpi_segs_out).
SENDER = r"""
import socket, struct, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
left, buf = int(sys.argv[3]), bytes(1 << 16)
end = time.monotonic() + float(sys.argv[4]) if len(sys.argv) > 4 else None
print("sending", flush=True)
while (left > 0) if end is None else (time.monotonic() < end):
    n = c.send(buf[:left] if end is None else buf)
    left -= n
c.shutdown(socket.SHUT_WR)
c.recv(1)
info = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
print(struct.unpack_from("Q", info, 200)[0], struct.unpack_from("I", info, 136)[0], flush=True)
"""
HEADERS = 14 + 20 + 20 + 40          # Ethernet, IPv4, TCP and at most 40 bytes of options

MARKER = r"""
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
int mark(struct __sk_buff *skb)
{
    if (skb->protocol != bpf_htons(ETH_P_IP))
        return -1;
    u8 tos, ef = 0xb8;
    if (bpf_skb_load_bytes(skb, 15, &tos, 1) < 0)
        return -1;
    bpf_l3_csum_replace(skb, 24, bpf_htons(tos), bpf_htons(ef), 2);
    bpf_skb_store_bytes(skb, 15, &ef, 1, 0);
    return -1;
}
"""

# Starts a probe on argv[1] in netns argv[2] at level argv[3], says so, then
# waits to be killed.
HOLDER = r"""
import sys, time
from reflexarc.bpf.link_traffic import LinkTraffic
from reflexarc.bpf.probe import Selection
status = LinkTraffic(Selection(interfaces=(sys.argv[1],), netns=sys.argv[2]), level=sys.argv[3]).start()
print(status.state, " ".join(status.attach_points), flush=True)
time.sleep(120)
"""


@pytest.fixture
def pair():
    require_bpf()
    with NetnsPair(TAG) as p:
        yield p


@pytest.fixture
def job_cgroup():
    """The job's cgroup (selected by id) and a child of it where its sender runs."""
    root = cgroup2_root()
    require(root is not None, "a mounted cgroup2 hierarchy")
    job = root / f"rx{TAG}"
    worker = job / "worker"
    worker.mkdir(parents=True)
    try:
        yield job, worker
    finally:
        worker.rmdir()
        job.rmdir()


@pytest.fixture
def server(pair):
    proc = pair.popen("b", sys.executable, "-c", SERVER, pair.addr_b, str(PORT),
                      stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield proc
    proc.kill()
    proc.wait()


def sender(pair, nbytes: int, cgroup: Path | None = None, seconds: float | None = None) -> subprocess.Popen:
    """A TCP sender in side a; in ``cgroup`` when given (moved before its socket exists)."""
    argv = ["ip", "netns", "exec", pair.ns_a, sys.executable, "-c", SENDER, pair.addr_b, str(PORT), str(nbytes)]
    if seconds is not None:
        argv.append(str(seconds))
    if cgroup is not None:
        argv = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh", *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "sending"
    return proc


def finish(proc: subprocess.Popen) -> tuple[int, int]:
    """A sender's (bytes sent with retransmits, segments sent), once it is done."""
    sent, segments = map(int, proc.stdout.readline().split())
    assert proc.wait(timeout=30) == 0
    return sent, segments


def push(pair, server, job_worker: Path) -> dict[str, tuple[int, int]]:
    """JOB_BYTES from the job's sender and OTHER_BYTES from another, at once;
    what each socket sent by the kernel's count."""
    senders = {"job": sender(pair, JOB_BYTES, job_worker), "other": sender(pair, OTHER_BYTES)}
    received = sorted(int(server.stdout.readline()) for _ in senders)
    assert received == sorted([JOB_BYTES, OTHER_BYTES])
    return {traffic: finish(proc) for traffic, proc in senders.items()}


def tx_bytes(pair) -> int:
    return int(pair.run("a", "cat", f"/sys/class/net/{pair.if_a}/statistics/tx_bytes").stdout)


def ifindex(pair) -> int:
    return int(pair.run("a", "cat", f"/sys/class/net/{pair.if_a}/ifindex").stdout)


def values(samples, name: str) -> dict[str, float]:
    return {labels.get("traffic", ""): v for n, labels, v in samples if n == name}


def check_labels(probe: LinkTraffic, samples) -> None:
    specs = {s.name: s for s in probe.signals}
    for name, labels, _ in samples:
        assert set(labels) <= set(specs[name].labels), (name, labels)


def egress_filters(pair) -> str:
    return pair.run("a", "tc", "filter", "show", "dev", pair.if_a, "egress").stdout


def qdiscs(pair) -> str:
    return pair.run("a", "tc", "qdisc", "show", "dev", pair.if_a).stdout


def check_split(probe: LinkTraffic, pair, server, worker: Path, speed: int) -> None:
    """Push both senders between two collects; the totals split by cgroup,
    add up to the veth's own counter and give the utilisation of ``speed``."""
    t0 = time.time()
    first = probe.collect(t0)
    base_tx = tx_bytes(pair)
    sent = push(pair, server, worker)
    t1 = time.time()
    second = probe.collect(t1)
    moved_tx = tx_bytes(pair) - base_tx
    check_labels(probe, first + second)
    before, after = values(first, "link_tx_bytes_total"), values(second, "link_tx_bytes_total")
    delta = {t: after[t] - before[t] for t in ("job", "other", "all")}
    # what each socket sent (retransmits included) plus at most one header per segment
    # (GSO: one per up to 64 KiB); only the senders' own segments
    for traffic, nbytes in (("job", JOB_BYTES), ("other", OTHER_BYTES)):
        payload, segments = sent[traffic]
        assert nbytes <= payload <= delta[traffic] <= payload + HEADERS * segments, (traffic, delta, sent)
    assert delta["all"] == delta["job"] + delta["other"]
    assert abs(delta["all"] - moved_tx) <= 1024, (delta, moved_tx)   # a stray ARP/ND at most
    util = values(second, "link_utilization_pct")
    assert values(first, "link_utilization_pct") == {}               # no interval yet
    for traffic in ("job", "other", "all"):
        assert util[traffic] == pytest.approx(800 * delta[traffic] / (t1 - t0) / speed, rel=1e-9)
    packets = values(second, "link_tx_packets_total")
    assert packets["job"] >= JOB_BYTES / 65536 and packets["all"] == packets["job"] + packets["other"]


class Marker:
    """A SCHED_CLS program that sets DSCP EF, and a UDP probe of whether it did."""

    def __init__(self, pair) -> None:
        from bcc import BPF
        self.pair = pair
        self.bpf = BPF(text=MARKER.encode())
        self.fd = self.bpf.load_func(b"mark", BPF.SCHED_CLS).fd
        self.rx = Netns(pair.ns_b).run(socket.socket, socket.AF_INET, socket.SOCK_DGRAM)
        self.rx.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
        self.rx.bind((pair.addr_b, PORT + 1))
        self.rx.settimeout(5)
        self.tx = Netns(pair.ns_a).run(socket.socket, socket.AF_INET, socket.SOCK_DGRAM)

    def add_filter(self) -> None:
        """Attach it as the DSCP actuator does: a clsact egress filter, prio 3420."""
        from pyroute2 import IPRoute
        sock = Netns(self.pair.ns_a).run(socket.socket, socket.AF_NETLINK, socket.SOCK_DGRAM)
        with IPRoute(fileno=sock.detach()) as ipr:
            ipr.tc("add-filter", "bpf", ifindex(self.pair), 0xD5C, fd=self.fd, name="dscp_egress",
                   parent=0xFFFFFFF3, prio=3420, direct_action=True)

    def received_tos(self) -> int:
        self.tx.sendto(b"reflexarc", (self.pair.addr_b, PORT + 1))
        _, ancillary, _, _ = self.rx.recvmsg(64, socket.CMSG_SPACE(1))
        return next(data[0] for level, kind, data in ancillary if level == socket.IPPROTO_IP)

    def close(self) -> None:
        self.rx.close()
        self.tx.close()
        self.bpf.cleanup()


def test_options_and_what_it_needs():
    with pytest.raises(ValueError):
        LinkTraffic(level="xdp")
    probe = LinkTraffic(Selection())
    assert probe.start().state == UNSUPPORTED and "no interfaces" in probe.status.reason
    assert "no interfaces" in probe.capability().reason
    assert "-DMAX_LEVEL=16" in probe.dump_bpf() and "bpf_skb_ancestor_cgroup_id" in probe.dump_bpf()
    assert LinkTraffic(Selection(interfaces=("eth0",), netns=f"rxnone{TAG}")).start().state == UNSUPPORTED


def test_tcx_splits_job_from_other_in_another_netns(pair, job_cgroup, server):
    require(tcx_supported(), "tcx (BPF_TCX_EGRESS, Linux >= 6.6)")
    job, worker = job_cgroup
    speed = 1_000_000_000
    main_ns = os.stat("/proc/thread-self/ns/net").st_ino
    lo = socket.if_nametoindex("lo")
    own_before = (tcx_query(lo), sh("tc", "qdisc", "show", "dev", "lo").stdout)
    probe = LinkTraffic(Selection(interfaces=(pair.if_a,), netns=pair.ns_a, traffic_cgroup_ids=(job.stat().st_ino,),
                                  link_speeds=((pair.if_a, speed),), job="llama"), node="n1")
    try:
        status = probe.start()
        assert status.state == OK and status.attach_points == [f"tcx:egress:{pair.if_a}@{pair.ns_a}"], status
        assert probe.link_speed(pair.if_a) == (speed, "declared")
        prog_ids, link_ids = Netns(pair.ns_a).run(tcx_query, ifindex(pair))
        assert len(prog_ids) == len(link_ids) == 1
        assert egress_filters(pair) == "" and "clsact" not in qdiscs(pair)
        check_split(probe, pair, server, worker, speed)
        samples = probe.collect(time.time())
        assert {l["job"] for n, l, _ in samples if n.startswith("link_")} == {"llama"}

        # the selection is a map update: without cgroups only traffic=all remains
        probe.update_selection(Selection(interfaces=(pair.if_a,), netns=pair.ns_a, job="llama"))
        assert len(probe.bpf[b"sel_cgroup"]) == 0
        assert set(values(probe.collect(time.time()), "link_tx_bytes_total")) == {"all"}
        assert Netns(pair.ns_a).run(tcx_query, ifindex(pair))[0] == prog_ids      # same program
        # interfaces come and go without a recompile
        probe.update_selection(Selection(netns=pair.ns_a))
        assert probe.status.state == UNSUPPORTED and Netns(pair.ns_a).run(tcx_query, ifindex(pair)) == ([], [])
        probe.update_selection(Selection(interfaces=(pair.if_a,), netns=pair.ns_a))
        assert probe.status.state == OK, probe.status
        assert Netns(pair.ns_a).run(tcx_query, ifindex(pair))[0] == prog_ids
        assert probe.link_speed(pair.if_a) == (10_000_000_000, "ethtool")
    finally:
        probe.stop()
    assert probe.status.state == STOPPED
    assert Netns(pair.ns_a).run(tcx_query, ifindex(pair)) == ([], [])
    # the controller's thread and namespace were never moved or touched
    assert os.stat("/proc/thread-self/ns/net").st_ino == main_ns
    assert (tcx_query(lo), sh("tc", "qdisc", "show", "dev", "lo").stdout) == own_before
    inside = Netns(pair.ns_a).run(lambda: os.stat("/proc/thread-self/ns/net").st_ino)
    assert inside == os.stat(f"/run/netns/{pair.ns_a}").st_ino != main_ns


def test_tcx_lets_later_programs_run_and_detaches_on_stop_and_sigkill(pair):
    require(tcx_supported(), "tcx (BPF_TCX_EGRESS, Linux >= 6.6)")
    index = ifindex(pair)
    in_a = Netns(pair.ns_a)
    marker = Marker(pair)
    probe = LinkTraffic(Selection(interfaces=(pair.if_a,), netns=pair.ns_a))
    try:
        assert probe.start().state == OK
        assert marker.received_tos() == 0
        (ours,), _ = in_a.run(tcx_query, index)

        # a tcx program attached after the counter still runs
        link = in_a.run(tcx_attach, marker.fd, index, False)
        try:
            prog_ids, _ = in_a.run(tcx_query, index)
            assert prog_ids[0] == ours and len(prog_ids) == 2
            assert marker.received_tos() == EF
        finally:
            tcx_detach(link)
        assert marker.received_tos() == 0

        # and so does a clsact filter at the DSCP marker's priority (after every tcx program)
        pair.run("a", "tc", "qdisc", "add", "dev", pair.if_a, "clsact")
        marker.add_filter()
        assert marker.received_tos() == EF
        counted = values(probe.collect(time.time()), "link_tx_packets_total")["all"]
        assert counted >= 4
        pair.run("a", "tc", "qdisc", "del", "dev", pair.if_a, "clsact")
    finally:
        probe.stop()
        marker.close()
    assert in_a.run(tcx_query, index) == ([], [])

    # a process that dies leaves no link behind
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, pair.if_a, pair.ns_a, TCX],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().split()[0] == OK
        (held,), _ = in_a.run(tcx_query, index)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    deadline = time.monotonic() + 5
    while in_a.run(tcx_query, index) != ([], []) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert in_a.run(tcx_query, index) == ([], [])
    assert f"prog {held} " not in sh("bpftool", "link", "list").stdout + " "


def test_clsact_splits_cleans_up_and_owns_only_its_qdisc(pair, job_cgroup, server):
    job, worker = job_cgroup
    speed = 400_000_000
    sel = Selection(interfaces=(pair.if_a,), netns=pair.ns_a, traffic_cgroup_ids=(job.stat().st_ino,),
                    link_speeds=((pair.if_a, speed),))
    marker = Marker(pair)
    probe = LinkTraffic(sel, level=CLSACT)
    try:
        status = probe.start()
        assert status.state == OK and status.attach_points == [f"clsact:egress:{pair.if_a}@{pair.ns_a}"]
        assert f"pref {FILTER_PRIO} bpf" in egress_filters(pair) and FILTER_NAME_OWNS_QDISC in egress_filters(pair)
        check_split(probe, pair, server, worker, speed)
        # a filter after ours (the DSCP marker's priority) still runs; it keeps the qdisc alive
        marker.add_filter()
        assert marker.received_tos() == EF
    finally:
        probe.stop()
        marker.close()                                   # the filter keeps its program
    assert FILTER_NAME not in egress_filters(pair) and "dscp_egress" in egress_filters(pair)
    assert "clsact" in qdiscs(pair)                      # another filter hangs on it
    pair.run("a", "tc", "qdisc", "del", "dev", pair.if_a, "clsact")

    # a clsact qdisc that was there before is left alone
    pair.run("a", "tc", "qdisc", "add", "dev", pair.if_a, "clsact")
    probe = LinkTraffic(sel, level=CLSACT)
    assert probe.start().state == OK
    assert f"{FILTER_NAME} " in egress_filters(pair).replace(FILTER_NAME_OWNS_QDISC, "")
    probe.stop()
    assert egress_filters(pair) == "" and "clsact" in qdiscs(pair)
    pair.run("a", "tc", "qdisc", "del", "dev", pair.if_a, "clsact")

    # a killed process leaves its filter; the next start removes it, and the
    # qdisc that process created goes with the next stop
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, pair.if_a, pair.ns_a, CLSACT],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().split()[0] == OK
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert f"handle {FILTER_HANDLE:#x} {FILTER_NAME_OWNS_QDISC}" in egress_filters(pair)
    probe = LinkTraffic(sel, level=CLSACT)
    try:
        status = probe.start()
        assert status.state == OK and "removed a stale filter" in status.reason, status
        assert egress_filters(pair).count(f"handle {FILTER_HANDLE:#x}") == 1
        pair.run("a", sys.executable, "-c", "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                 f".sendto(bytes(100), ('{pair.addr_b}', 9))")
        assert values(probe.collect(time.time()), "link_tx_packets_total")["all"] >= 1
    finally:
        probe.stop()
    assert egress_filters(pair) == "" and "clsact" not in qdiscs(pair)


def test_counters_only_gives_all_and_says_why(pair, server):
    # the namespace given as a path, here that of a process inside it
    sleeper = pair.popen("a", "sleep", "60")          # ip netns exec: setns, then exec in place
    try:
        path = f"/proc/{sleeper.pid}/ns/net"
        deadline = time.monotonic() + 5
        while os.stat(path).st_ino != os.stat(f"/run/netns/{pair.ns_a}").st_ino:
            assert time.monotonic() < deadline, "the sleeper never entered the namespace"
            time.sleep(0.01)
        probe = LinkTraffic(Selection(interfaces=(pair.if_a, "lo"), netns=path, traffic_cgroup_ids=(1,)), level=COUNTERS)
        try:
            status = probe.start()
            assert status.state == DEGRADED and "traffic=all" in status.reason, status
            assert "lo: link speed unknown" in status.reason, status       # loopback has none
            assert probe.link_speed(pair.if_a) == (10_000_000_000, "ethtool")  # what a veth claims
            assert probe.bpf is None
            t0 = time.time()
            first = probe.collect(t0)
            base_tx = tx_bytes(pair)
            s = sender(pair, OTHER_BYTES)
            assert int(server.stdout.readline()) == OTHER_BYTES
            payload, _ = finish(s)
            t1 = time.time()
            second = probe.collect(t1)
            moved = tx_bytes(pair) - base_tx
        finally:
            probe.stop()
    finally:
        sleeper.kill()
        sleeper.wait()
    check_labels(probe, second)
    mine = [(labels, v) for n, labels, v in second if n == "link_tx_bytes_total" and labels["iface"] == pair.if_a]
    assert [labels["traffic"] for labels, _ in mine] == ["all"]
    delta = mine[0][1] - values([x for x in first if x[1]["iface"] == pair.if_a], "link_tx_bytes_total")["all"]
    assert OTHER_BYTES <= payload <= delta and abs(delta - moved) <= 1024     # a stray ARP/ND between reads
    util = {l["iface"]: v for n, l, v in second if n == "link_utilization_pct"}
    assert set(util) == {pair.if_a}                     # none for lo: no speed known
    assert util[pair.if_a] == pytest.approx(800 * delta / (t1 - t0) / 10_000_000_000, rel=1e-9)


def test_qdisc_backlog_drops_and_utilisation_of_a_shaped_link(pair, job_cgroup, server):
    job, worker = job_cgroup
    rate = 40_000_000
    pair.run("a", "tc", "qdisc", "add", "dev", pair.if_a, "root", "tbf", "rate", "40mbit", "burst", "32kb",
             "limit", "1mb")
    probe = LinkTraffic(Selection(interfaces=(pair.if_a,), netns=pair.ns_a, traffic_cgroup_ids=(job.stat().st_ino,),
                                  link_speeds=((pair.if_a, rate),)))
    flood = None
    try:
        assert probe.start().state == OK
        # a TCP job flow fills the shaped link by itself
        s = sender(pair, 0, worker, seconds=1.6)
        time.sleep(0.4)
        probe.collect(time.time())
        time.sleep(0.8)
        busy = probe.collect(time.time())
        server.stdout.readline()
        finish(s)
        util = values(busy, "link_utilization_pct")
        assert 85 <= util["job"] <= 110 and util["other"] < 2, util

        # a UDP flood overfills it (the queue now shorter than a socket's send
        # buffer): the queue holds a backlog and drops
        pair.run("a", "tc", "qdisc", "change", "dev", pair.if_a, "root", "tbf", "rate", "40mbit", "burst",
                 "32kb", "limit", "64kb")
        flood = pair.popen("a", sys.executable, "-c",
                           "import socket, sys\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                           "while True:\n    s.sendto(bytes(1400), (sys.argv[1], 9))", pair.addr_b)
        t0, start = time.time(), values(probe.collect(time.time()), "link_tx_bytes_total")["other"]
        backlogs, deadline = [], time.monotonic() + 5
        while not any(backlogs) and time.monotonic() < deadline:     # sampled: a busy machine may lag
            time.sleep(0.2)
            loaded = probe.collect(time.time())
            backlogs.append(values(loaded, "qdisc_backlog_bytes")[""])
        t1, offered = time.time(), values(loaded, "link_tx_bytes_total")["other"] - start
        flood.kill()
        flood.wait()
        time.sleep(0.2)
        after = probe.collect(time.time())
        shown = pair.run("a", "tc", "-s", "qdisc", "show", "dev", pair.if_a).stdout
    finally:
        if flood is not None and flood.poll() is None:
            flood.kill()
            flood.wait()
        probe.stop()
    check_labels(probe, loaded)
    assert 0 < max(backlogs) <= 64 * 1024, backlogs
    drops = values(after, "qdisc_drops_total")[""]
    assert drops > 0 and f"dropped {int(drops)}," in shown, shown
    assert values(after, "qdisc_backlog_bytes")[""] == 0
    assert 8 * offered / (t1 - t0) > rate            # offered load, counted before the qdisc drops it


def test_no_qdisc_signals_without_a_queue(pair):
    probe = LinkTraffic(Selection(interfaces=(pair.if_a,), netns=pair.ns_a), level=COUNTERS)
    try:
        probe.start()
        names = {n for n, _, _ in probe.collect(time.time())}
    finally:
        probe.stop()
    assert names == {"link_tx_bytes_total", "link_tx_packets_total"}          # veth: noqueue
    assert Netns(pair.ns_a).run(ethtool_speed, "lo") is None


def test_a_deleted_namespace_is_let_go(pair):
    probe = LinkTraffic(Selection(interfaces=(pair.if_a,), netns=pair.ns_a))
    try:
        assert probe.start().state == OK
        sh("ip", "netns", "del", pair.ns_a)
        assert probe.collect(time.time()) == []
        assert probe.status.state == UNSUPPORTED and "is gone" in probe.status.reason
    finally:
        probe.stop()
    # nothing of the probe holds the namespace: it is torn down, and its veth end with it
    deadline = time.monotonic() + 10
    while pair.if_b in pair.run("b", "ip", "link", "show").stdout:
        assert time.monotonic() < deadline, "the deleted namespace is still alive"
        time.sleep(0.05)


# --- per job: jobs found by discovery (Selection.job_cgroups), no policy cgroup ---------

A_BYTES, B_BYTES, STRAY_BYTES = 9 << 20, 6 << 20, 4 << 20


@pytest.fixture
def cgroups():
    """make(name) -> a fresh cgroup v2 directory of this run; removed afterwards."""
    root = cgroup2_root()
    require(root is not None, "a mounted cgroup2 hierarchy")
    made: list[Path] = []

    def make(name: str) -> Path:
        path = root / f"rx{TAG}{name}"
        path.mkdir()
        made.append(path)
        return path

    yield make
    for path in reversed(made):
        path.rmdir()


def push_many(pair, server, flows: dict[str, tuple[int, Path | None]]) -> dict[str, tuple[int, int]]:
    """One TCP sender per flow (bytes, cgroup or None), all at once; what each
    socket sent by the kernel's count."""
    senders = {name: sender(pair, nbytes, cgroup) for name, (nbytes, cgroup) in flows.items()}
    received = sorted(int(server.stdout.readline()) for _ in senders)
    assert received == sorted(nbytes for nbytes, _ in flows.values())
    return {name: finish(proc) for name, proc in senders.items()}


def by_series(samples, name: str) -> dict[tuple[str, str | None], float]:
    """(traffic, job or None) -> value of the link signal ``name``."""
    return {(labels["traffic"], labels.get("job")): v for n, labels, v in samples if n == name}


def slots(probe: LinkTraffic) -> dict[int, int]:
    """cgroup id -> job slot, as the program's map holds them."""
    return {k.value: v.value for k, v in probe.bpf[b"sel_cgroup"].items()}


def within(delta: float, sent: list[tuple[int, int]], slack: int = 0) -> bool:
    """What the sockets sent (retransmits included) <= delta <= that plus at most
    one header per segment (+ ``slack`` for a stray ARP/ND)."""
    payload = sum(p for p, _ in sent)
    return payload <= delta <= payload + HEADERS * sum(s for _, s in sent) + slack


def test_two_discovered_jobs_each_get_job_and_other(pair, cgroups, server):
    require(tcx_supported(), "tcx (BPF_TCX_EGRESS, Linux >= 6.6)")
    a, b = cgroups("a"), cgroups("b")
    a_worker = a / "worker"                              # a's sender one level down: the ancestor walk
    a_worker.mkdir()
    speed = 2_000_000_000
    ids = {"a": a.stat().st_ino, "b": b.stat().st_ino}
    probe = LinkTraffic(Selection(interfaces=(pair.if_a,), netns=pair.ns_a, job="fallback",
                                  job_cgroups=(("a", (ids["a"],)), ("b", (ids["b"],))),
                                  link_speeds=((pair.if_a, speed),)), node="n1")
    try:
        assert probe.start().state == OK, probe.status
        assert slots(probe) == {ids["a"]: 1, ids["b"]: 2}
        t0 = time.time()
        first = probe.collect(t0)
        base_tx = tx_bytes(pair)
        # b's sender sits in b itself (its own id matches); the stray one in no job's cgroup
        sent = push_many(pair, server, {"a": (A_BYTES, a_worker), "b": (B_BYTES, b), "stray": (STRAY_BYTES, None)})
        t1 = time.time()
        second = probe.collect(t1)
        moved_tx = tx_bytes(pair) - base_tx
    finally:
        probe.stop()
        a_worker.rmdir()
    check_labels(probe, first + second)
    shape = {("all", None), ("job", "a"), ("other", "a"), ("job", "b"), ("other", "b")}
    for samples in (first, second):
        assert set(by_series(samples, "link_tx_bytes_total")) == shape
        assert set(by_series(samples, "link_tx_packets_total")) == shape
    assert all(l["node"] == "n1" and l["iface"] == pair.if_a and l["netns"] == pair.ns_a
               for n, l, _ in second if n.startswith("link_"))
    # "all" carries no job (not even the selection's fallback label)
    assert not [l for n, l, _ in second if n.startswith("link_") and l.get("job") == "fallback"]

    before, after = by_series(first, "link_tx_bytes_total"), by_series(second, "link_tx_bytes_total")
    delta = {k: after[k] - before[k] for k in shape}
    assert within(delta[("job", "a")], [sent["a"]]), (delta, sent)
    assert within(delta[("job", "b")], [sent["b"]]), (delta, sent)
    assert within(delta[("other", "a")], [sent["b"], sent["stray"]], slack=1024), (delta, sent)
    assert within(delta[("other", "b")], [sent["a"], sent["stray"]], slack=1024), (delta, sent)
    assert within(delta[("all", None)], list(sent.values()), slack=1024), (delta, sent)
    assert abs(delta[("all", None)] - moved_tx) <= 1024, (delta, moved_tx)     # a stray ARP/ND at most
    for job in ("a", "b"):
        assert after[("job", job)] + after[("other", job)] == after[("all", None)]
    util = by_series(second, "link_utilization_pct")
    assert by_series(first, "link_utilization_pct") == {}                        # no interval yet
    assert set(util) == shape
    for key in shape:
        assert util[key] == pytest.approx(800 * delta[key] / (t1 - t0) / speed, rel=1e-9)
    packets = by_series(second, "link_tx_packets_total")
    for job in ("a", "b"):
        assert packets[("job", job)] + packets[("other", job)] == packets[("all", None)]
    assert packets[("job", "a")] >= A_BYTES / 65536 and packets[("job", "b")] >= B_BYTES / 65536


def test_jobs_come_and_go_by_map_updates_and_a_reused_slot_starts_from_zero(pair, cgroups, server):
    require(tcx_supported(), "tcx (BPF_TCX_EGRESS, Linux >= 6.6)")
    a, b, c, d = (cgroups(name) for name in "abcd")
    ids = {name: path.stat().st_ino for name, path in zip("abcd", (a, b, c, d))}

    def selection(*jobs: str) -> Selection:
        return Selection(interfaces=(pair.if_a,), netns=pair.ns_a, job_cgroups=tuple((j, (ids[j],)) for j in jobs))

    probe = LinkTraffic(selection("a", "b"))
    try:
        assert probe.start().state == OK, probe.status
        bpf, hook = probe.bpf, Netns(pair.ns_a).run(tcx_query, ifindex(pair))
        probe.collect(time.time())
        sent = push_many(pair, server, {"a": (A_BYTES, a), "b": (B_BYTES, b)})
        one = by_series(probe.collect(time.time()), "link_tx_bytes_total")
        assert within(one[("job", "b")], [sent["b"]]) and within(one[("job", "a")], [sent["a"]])

        # b leaves and c arrives in one refresh: c gets a fresh slot (b's is read once more first)
        probe.update_selection(selection("a", "c"))
        assert slots(probe) == {ids["a"]: 1, ids["c"]: 3}
        two = probe.collect(time.time())
        bytes_two = by_series(two, "link_tx_bytes_total")
        assert set(bytes_two) == {("all", None), ("job", "a"), ("other", "a"), ("job", "c"), ("other", "c")}
        assert bytes_two[("job", "c")] == 0 and bytes_two[("job", "a")] == one[("job", "a")]
        assert bytes_two[("other", "c")] == bytes_two[("all", None)] >= one[("all", None)]
        util = by_series(two, "link_utilization_pct")
        assert ("job", "c") not in util                  # c's first sample: no interval yet

        # d arrives after that collect: it takes b's freed slot, whose running totals
        # in the kernel still hold b's bytes, and starts from zero
        probe.update_selection(selection("a", "c", "d"))
        assert slots(probe) == {ids["a"]: 1, ids["c"]: 3, ids["d"]: 2}
        three = by_series(probe.collect(time.time()), "link_tx_bytes_total")
        assert three[("job", "d")] == 0 and three[("other", "d")] == three[("all", None)]
        sent = push_many(pair, server, {"c": (A_BYTES, c), "d": (B_BYTES, d)})
        four = by_series(probe.collect(time.time()), "link_tx_bytes_total")
        assert within(four[("job", "d")], [sent["d"]]), (four, sent)
        assert within(four[("job", "c")], [sent["c"]]), (four, sent)
        assert four[("job", "a")] == one[("job", "a")]
        assert within(four[("other", "a")] - three[("other", "a")], [sent["c"], sent["d"]], slack=1024)
        assert within(four[("other", "d")] - three[("other", "d")], [sent["c"]], slack=1024)

        # none of it re-attached or recompiled: the same program and link on the hook
        assert Netns(pair.ns_a).run(tcx_query, ifindex(pair)) == hook and probe.bpf is bpf
        # no job left: only "all", the map empty
        probe.update_selection(selection())
        assert slots(probe) == {} and probe.bpf[b"sel_count"][0].value == 0
        assert set(by_series(probe.collect(time.time()), "link_tx_bytes_total")) == {("all", None)}
        assert Netns(pair.ns_a).run(tcx_query, ifindex(pair)) == hook
    finally:
        probe.stop()


def test_an_explicit_cgroup_wins_over_discovered_jobs_and_slots_are_bounded(pair, cgroups):
    a, b, c = cgroups("a"), cgroups("b"), cgroups("c")
    ids = {name: path.stat().st_ino for name, path in zip("abc", (a, b, c))}
    jobs = (("a", (ids["a"],)), ("b", (ids["b"],)), ("c", (ids["c"],)))
    probe = LinkTraffic(Selection(interfaces=(pair.if_a,), netns=pair.ns_a, job="llama",
                                  traffic_cgroup_ids=(ids["c"],), job_cgroups=jobs), max_jobs=2)
    try:
        assert probe.start().state == OK
        assert slots(probe) == {ids["c"]: 1}
        samples = probe.collect(time.time())
        assert set(by_series(samples, "link_tx_bytes_total")) == {("all", "llama"), ("job", "llama"),
                                                                  ("other", "llama")}
        # the policy's cgroup goes: the discovered jobs take over, as many as there are slots
        probe.update_selection(Selection(interfaces=(pair.if_a,), netns=pair.ns_a, job="llama", job_cgroups=jobs))
        assert slots(probe) == {ids["a"]: 2}             # slot 1 is read once more before it is reused
        assert probe.status.state == DEGRADED and "no job slot" in probe.status.reason, probe.status
        assert "b" in probe.status.reason and "c" in probe.status.reason
        probe.collect(time.time())                       # frees slot 1: b gets it
        assert slots(probe) == {ids["a"]: 2, ids["b"]: 1}
        assert "c" in probe.status.reason and ": b" not in probe.status.reason, probe.status
        probe.update_selection(Selection(interfaces=(pair.if_a,), netns=pair.ns_a, job_cgroups=jobs[1:]))
        probe.collect(time.time())
        assert slots(probe) == {ids["b"]: 1, ids["c"]: 2} and probe.status.state == OK, probe.status
    finally:
        probe.stop()
