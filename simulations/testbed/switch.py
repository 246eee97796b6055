"""The switch's egress queueing: HTB at the port rate with DSCP classes, as a
datacenter switch queues.

Two classes under one root at the port rate:

* ``1:10`` default (DSCP 0, AF41 and everything not listed below): rate 95 % of
  the port, ceil 100 %, priority 0 (first to borrow spare rate);
* ``1:30`` scavenger, CS1 (DSCP 8, TOS 0x20) and LE (DSCP 1, TOS 0x04): rate 5 %,
  ceil 100 %, priority 7, so it gets the whole port when the default class is
  idle and 5 % when it is not.

Packets are classified by ``u32 match ip tos <tos> 0xfc`` (the DSCP bits; ECN is
ignored). Each class queues in a drop-tail ``bfifo`` of ``buffer`` bytes, a
switch port's buffer (bytes, not packets: veth hands over GSO packets of up to
64 KiB).

Example::

    for argv in qos_commands("rxtb42sw", "rxtb42pu", parse_rate("200mbit")):
        run(*argv)
    classes(parse_rate("200mbit"))     # the same layout as a dict, for describe()
    class_stats(run("tc", "-n", "rxtb42sw", "-s", "class", "show", "dev", "rxtb42pu"))
    # {"1:10": {"bytes": 5242880, "packets": 3620, "dropped": 0}, "1:30": {...}, "1:1": {...}}

Overhead: none at run time beyond the kernel's HTB; eight ``tc`` calls to set up.
"""
from __future__ import annotations

import re

UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
SCAVENGER_TOS = {"CS1": 0x20, "LE": 0x04}
QUANTUM = 60000           # bytes a class may send per round; above one GSO packet
DEFAULT_BUFFER = 1 << 20  # bytes queued per class before tail drop


def parse_rate(rate: str) -> int:
    """``"200mbit"`` -> 200000000 (bits per second); tc's bit units only."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit)\s*", rate.lower())
    if not m:
        raise ValueError(f"rate {rate!r}: expected a number and one of {', '.join(UNITS)}, e.g. 200mbit")
    bits = int(float(m.group(1)) * UNITS[m.group(2)])
    if bits < 10**5:
        raise ValueError(f"rate {rate!r} is below 100kbit")
    return bits


def classes(rate_bps: int) -> dict:
    """The class layout for a port of ``rate_bps``: classid -> rates and what it holds."""
    return {
        "1:10": {"name": "default", "rate_bps": rate_bps * 95 // 100, "ceil_bps": rate_bps, "prio": 0,
                 "dscp": "all not listed for another class"},
        "1:30": {"name": "scavenger", "rate_bps": rate_bps * 5 // 100, "ceil_bps": rate_bps, "prio": 7,
                 "dscp": {name: tos >> 2 for name, tos in SCAVENGER_TOS.items()}},
    }


STATS = re.compile(r"^class htb (\S+) .*?\n\s*Sent (\d+) bytes (\d+) pkt \(dropped (\d+)", re.M)


def class_stats(tc_output: str) -> dict:
    """Bytes, packets and drops per HTB class from ``tc -s class show`` text (tc
    6.1 prints no JSON for classes)."""
    return {m.group(1): {"bytes": int(m.group(2)), "packets": int(m.group(3)), "dropped": int(m.group(4))}
            for m in STATS.finditer(tc_output)}


def qos_commands(netns: str, iface: str, rate_bps: int, buffer: int = DEFAULT_BUFFER) -> list[list[str]]:
    """The ``tc`` argument lists that configure ``iface`` in ``netns`` (replacing its root qdisc)."""
    tc = ["tc", "-n", netns]
    dev = ["dev", iface]
    cmds = [tc + ["qdisc", "replace", *dev, "root", "handle", "1:", "htb", "default", "10"],
            tc + ["class", "add", *dev, "parent", "1:", "classid", "1:1", "htb",
                  "rate", f"{rate_bps}bit", "ceil", f"{rate_bps}bit", "quantum", str(QUANTUM)]]
    for classid, c in classes(rate_bps).items():
        minor = classid.split(":")[1]
        cmds.append(tc + ["class", "add", *dev, "parent", "1:1", "classid", classid, "htb",
                          "rate", f"{c['rate_bps']}bit", "ceil", f"{c['ceil_bps']}bit",
                          "prio", str(c["prio"]), "quantum", str(QUANTUM)])
        cmds.append(tc + ["qdisc", "add", *dev, "parent", classid, "handle", f"{minor}:",
                          "bfifo", "limit", str(buffer)])
    for tos in SCAVENGER_TOS.values():
        cmds.append(tc + ["filter", "add", *dev, "parent", "1:", "protocol", "ip", "prio", "10", "u32",
                          "match", "ip", "tos", f"{tos:#04x}", "0xfc", "flowid", "1:30"])
    return cmds
