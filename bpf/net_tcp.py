"""Loader of ``net_tcp.bpf.c``: retransmits and smoothed RTT of TCP flows on
selected ports (the collective's rendezvous and data ports, say 29500-29510).

``tcp:tcp_retransmit_skb`` counts retransmitted packets per flow;
``tcp:tcp_probe`` (every segment received on an established socket) feeds a
per-flow histogram of the socket's smoothed RTT. On this kernel the tracepoint's
``srtt`` field is ``tp->srtt_us >> 3``, i.e. microseconds. A flow is the
socket's own view, ``local -> remote``; both ends of a connection on one node
are two flows. Flows live in an LRU map, so the retransmit total of a flow is
monotonic while the flow is in it.

Signals: ``tcp_retransmits_total{flow,port,netns}`` (counter) and
``tcp_srtt_us{flow,port,netns,quantile}``; ``port`` is the selected port of the
flow, ``netns`` the network namespace whose socket table holds it
(``flow_netns.py``: a name under /run/netns, "" for the controller's own), so a
rule matches the job's namespace and leaves the host's loopback flows on the
same ports alone. Only ``Selection.ports`` matters; with no ports selected
nothing is watched.

Example::

    probe = NetTcp(Selection(ports=((29500, 29510),)))
    probe.start()
    for name, labels, value in probe.collect(now=time.time()):
        ...     # ("tcp_retransmits_total", {"flow": "10.0.0.1:29500->10.0.0.2:41234",
                #                            "port": "29500", "netns": "job-ns", ...}, 12)

Overhead: every received TCP segment on the node costs one tracepoint hit and a
bitmap lookup (~10-20 ns); segments of selected flows add one hash update.
Collect: one batched read of each map.
"""
from __future__ import annotations

import ctypes as ct
import ipaddress
from collections import defaultdict

from reflexarc.core.signals import SignalSpec

from .flow_netns import FlowNetns
from .loghist import SLOTS, quantiles
from .maps import drain
from .probe import DEGRADED, OK, UNSUPPORTED, Probe, ProbeStatus, Selection

_V4_MAPPED = bytes(10) + b"\xff\xff"
_BITMAP_WORDS = 1024


def port_bitmap(ranges) -> list[int]:
    """The 65536-bit port bitmap (1024 u64 words) for inclusive port ranges."""
    words = [0] * _BITMAP_WORDS
    for lo, hi in ranges:
        lo, hi = max(0, int(lo)), min(65535, int(hi))
        for port in range(lo, hi + 1):
            words[port >> 6] |= 1 << (port & 63)
    return words


def format_flow(saddr: bytes, sport: int, daddr: bytes, dport: int) -> str:
    """``10.0.0.1:5201->10.0.0.2:40000`` or ``[fd00::1]:5201->[fd00::2]:40000``."""
    def end(addr: bytes, port: int) -> str:
        if addr.startswith(_V4_MAPPED):
            return f"{ipaddress.IPv4Address(addr[12:])}:{port}"
        return f"[{ipaddress.IPv6Address(addr)}]:{port}"
    return f"{end(saddr, sport)}->{end(daddr, dport)}"


class NetTcp(Probe):
    name = "net_tcp"
    tier = "light"
    signals = (
        SignalSpec("tcp_retransmits_total", "1", ("node", "job", "flow", "port", "netns"), "counter",
                   "TCP retransmissions on selected flows"),
        SignalSpec("tcp_srtt_us", "us", ("node", "job", "flow", "port", "netns", "quantile"), "gauge",
                   "Smoothed TCP round-trip time on selected flows"),
    )
    fallback_order = ("tracepoints tcp:tcp_retransmit_skb + tcp:tcp_probe",
                      "tracepoint tcp:tcp_retransmit_skb only (no srtt)", "none")

    def __init__(self, selection: Selection | None = None, features=None, node: str = "",
                 max_flows: int = 4096, forget_after: float = 600.0, netns_of: FlowNetns | None = None) -> None:
        super().__init__(selection, features, node)
        self.netns_of = netns_of or FlowNetns(str(self.features.procfs))
        self.max_flows = max_flows
        self.forget_after = forget_after
        self._changed: dict[bytes, tuple[int, float]] = {}   # flow key -> (total, when it last moved)
        self._bitmap = [0] * _BITMAP_WORDS
        self._with_srtt = True
        self._retrans_has_err = False

    def cflags(self) -> list[str]:
        return [f"-DMAX_FLOWS={self.max_flows}", f"-DHIST_SLOTS={SLOTS}",
                f"-DWITH_SRTT={int(self._with_srtt)}", f"-DRETRANS_HAS_ERR={int(self._retrans_has_err)}"]

    def choose_attach_points(self) -> ProbeStatus:
        has = self.features.has_tracepoint
        if not has("tcp", "tcp_retransmit_skb"):
            return ProbeStatus(UNSUPPORTED, "no tcp:tcp_retransmit_skb tracepoint")
        fmt = self.features.tracefs / "events" / "tcp" / "tcp_retransmit_skb" / "format"
        self._retrans_has_err = " err;" in fmt.read_text()
        self._with_srtt = has("tcp", "tcp_probe")
        if not self._with_srtt:
            return ProbeStatus(DEGRADED, "no tcp:tcp_probe tracepoint: no tcp_srtt_us",
                               ["tracepoint:tcp:tcp_retransmit_skb"])
        return ProbeStatus(OK, "", ["tracepoint:tcp:tcp_retransmit_skb", "tracepoint:tcp:tcp_probe"])

    def attach(self) -> None:
        # The TRACEPOINT_PROBEs attached at load; the bitmap starts empty, so
        # nothing is counted until the selection is written.
        self._bitmap = [0] * _BITMAP_WORDS
        self.update_selection(self.selection)

    def update_selection(self, selection: Selection) -> None:
        self.selection = selection
        if self.bpf is None:
            return
        wanted = port_bitmap(selection.ports)
        table = self.bpf[b"port_bits"]
        for i, (old, new) in enumerate(zip(self._bitmap, wanted)):
            if old != new:
                table[ct.c_int(i)] = ct.c_uint64(new)
        self._bitmap = wanted

    def _selected(self, port: int) -> bool:
        return bool((self._bitmap[port >> 6] >> (port & 63)) & 1)

    def _port_of(self, sport: int, dport: int) -> int:
        return dport if self._selected(dport) or not self._selected(sport) else sport

    def collect(self, now: float) -> list[tuple[str, dict, float]]:
        if self.bpf is None:
            return []
        out = self._retransmits(now) + self._srtt()
        self.netns_of.forget({labels["flow"] for _, labels, _ in out})
        return out

    def _retransmits(self, now: float) -> list[tuple[str, dict, float]]:
        """Totals of flows on ports still selected; a flow whose total has not
        moved for ``forget_after`` seconds is dropped from the map and the output."""
        out: list[tuple[str, dict, float]] = []
        table = self.bpf[b"retrans"]
        seen = set()
        for k, total in list(table.items()):
            ident, total = bytes(k), int(total.value)
            seen.add(ident)
            last = self._changed.get(ident)
            if last is None or last[0] != total:
                self._changed[ident] = last = (total, now)
            if now - last[1] > self.forget_after or not (self._selected(k.sport) or self._selected(k.dport)):
                try:
                    del table[k]
                except KeyError:                     # evicted meanwhile
                    pass
                del self._changed[ident]
                continue
            out.append(("tcp_retransmits_total", self._flow_labels(k), float(total)))
        for ident in self._changed.keys() - seen:   # evicted by the LRU
            del self._changed[ident]
        return out

    def _srtt(self) -> list[tuple[str, dict, float]]:
        out: list[tuple[str, dict, float]] = []
        hists: dict[tuple, dict[int, int]] = defaultdict(dict)
        for k, v in drain(self.bpf[b"srtt_hist"]) if self._with_srtt else ():
            f = k.flow
            hists[(bytes(f.saddr), f.sport, bytes(f.daddr), f.dport)][k.slot] = v
        for (saddr, sport, daddr, dport), hist in hists.items():
            flow = format_flow(saddr, sport, daddr, dport)
            base = {"flow": flow, "port": self._port_of(sport, dport), "netns": self.netns_of.of(flow)}
            for q, value in quantiles(hist):
                out.append(("tcp_srtt_us", self.labels(**base, quantile=q), value))
        return out

    def _flow_labels(self, k) -> dict:
        flow = format_flow(bytes(k.saddr), k.sport, bytes(k.daddr), k.dport)
        return self.labels(flow=flow, port=self._port_of(k.sport, k.dport), netns=self.netns_of.of(flow))
