"""The catalogue of actuators a policy may name, with their parameters.

Validation and the JSON Schema read these specs, so checking a policy never loads
an implementation (no bcc, no netlink). Implementations and simulated stand-ins
register against the same specs.

Some values need a check finer than their parameter type (a tc class id, IP
prefixes, a network namespace): ``VALUE_CHECKS`` names the function that turns
such a value into its canonical form, for the loader and the actuator alike.
A parameter that was replaced is listed in ``REPLACED_PARAMS``, so a policy
still naming it is told what to write instead. Parameters that are
alternatives to each other (exactly one of them is given) are listed in
``ALTERNATIVE_PARAMS``.

Example::

    SPECS["affinity"].param("node")   # ParamSpec(name="node", type="int", ...)
    ALTERNATIVE_PARAMS["affinity"]    # ("node", "cpus", "device", "locality"): give exactly one
    tc_class("1:0A")                  # "1:a", as tc prints it
    class_priority("1:30")            # 0x10030, the skb->priority HTB maps to class 1:30
    netns_ref("/proc/4242/ns/net")    # "/proc/4242/ns/net"
    netns_ref("a/b")                  # ValueError: ... a name in /run/netns or /proc/PID/ns/net

Parameter types and their conversion: ``reflexarc.core.params``.

Overhead: constants, and a regular expression or an ``ipaddress`` parse per checked value.
"""
from __future__ import annotations

import ipaddress
import re
from typing import Callable

from .base import ActuatorSpec, ParamSpec as P

_TC_CLASS = re.compile(r"([0-9a-f]{1,4}):([0-9a-f]{1,4})")
NETNS_PATTERN = r"^(/proc/[1-9][0-9]*/ns/net|(?!\.\.?$)[^/\s]+)$"
NAME_MAX = 255


def tc_class(value) -> str:
    """A tc class id as tc prints it: major and minor in hex (``"1:30"``), lower
    case without leading zeros; ValueError for anything else."""
    match = _TC_CLASS.fullmatch(value.strip().lower()) if isinstance(value, str) else None
    major, minor = (int(match.group(1), 16), int(match.group(2), 16)) if match else (0, 0)
    if not match or not minor or major in (0, 0xFFFF):
        raise ValueError(f"'{value}' is not a tc class id: use major:minor in hex as 'tc class show' "
                         f"prints it, e.g. '1:30' (major 1-fffe, minor not 0)")
    return f"{major:x}:{minor:x}"


def class_priority(cls: str) -> int:
    """The skb->priority that selects class ``cls`` in HTB: major<<16 | minor."""
    major, minor = (int(part, 16) for part in tc_class(cls).split(":"))
    return major << 16 | minor


def ip_prefixes(value) -> list[str]:
    """IPv4/IPv6 prefixes (a bare address is a /32 or /128) in canonical form;
    ValueError naming the first item that is not one."""
    out = []
    for item in value:
        try:
            out.append(str(ipaddress.ip_network(str(item).strip(), strict=False)))
        except ValueError:
            raise ValueError(f"'{item}' is not an IPv4 or IPv6 prefix; write e.g. 10.0.0.0/8, "
                             f"fd00::/64 or 192.0.2.7") from None
    return list(dict.fromkeys(out))


def netns_ref(value) -> str:
    """A network namespace as ``ip netns`` names it (a file in /run/netns) or a
    process's ``/proc/PID/ns/net``; ValueError otherwise."""
    text = str(value)
    if re.fullmatch(NETNS_PATTERN, text) and "\0" not in text and len(text.encode()) <= NAME_MAX:
        return text
    raise ValueError(f"'{value}' is not a network namespace: use a name in /run/netns (as 'ip netns list' "
                     f"shows it) or a path /proc/PID/ns/net")


SPECS: dict[str, ActuatorSpec] = {s.name: s for s in (
    ActuatorSpec("log", "Write a line to the controller log and audit trail.", (
        P("message", "str", default="", help="text to log"),
        P("level", "str", default="warning", choices=("info", "warning", "error")),
    ), changes_system=False),
    ActuatorSpec("alert", "Raise an alert in Alertmanager (v2 API) and/or a JSON webhook.", (
        P("severity", "str", default="warning", choices=("info", "warning", "critical")),
        P("summary", "str", default="", help="one line for the on-call engineer"),
        P("labels", "mapping", default=None, help="extra alert labels"),
        P("description", "str", default="", help="longer text for the alert"),
    ), changes_system=False, accepts_evidence=True),
    ActuatorSpec("affinity", "Re-pin every thread of the selected DataLoader workers to node-local CPUs.", (
        P("node", "int", help="NUMA node whose CPUs to use"),
        P("cpus", "int_list", help="CPUs to use instead of a node's, in the kernel's notation '0-3,8' (a "
                                   "policy may also write a list [0, 1])"),
        P("device", "str", help="PCI address (GPU/NIC) whose numa_node to use"),
        P("locality", "bool", help="true: the NUMA node of the device the job reads from or sends on when "
                                   "sysfs knows it (the target's iface or dev label, else the selector's "
                                   "interfaces), else the node holding most of the training process's "
                                   "memory (/proc/PID/numa_maps); the plan says which and why"),
        P("reserved_cpus", "int_list", default=None, help="CPUs to leave free, written as cpus"),
    )),
    ActuatorSpec("dscp", "Retag matching egress flows with a DSCP value through a tc-BPF classifier.", (
        P("dscp", "dscp", required=True, help="DSCP name (CS1, AF41, EF, ...) or number 0-63"),
        P("interfaces", "str_list", help="defaults to the selector's interfaces"),
        P("ports", "port_range", help="L4 port ranges to match, e.g. ['29500-29510']"),
        P("protocol", "str", default="tcp", choices=("tcp", "udp", "any")),
        P("class", "str", default=None,
          help="class of the interfaces' root qdisc to queue the flows in, as tc prints it, e.g. '1:30' "
               "(sets skb->priority; HTB ignores DSCP)"),
        P("match_cgroup", "bool", default=False, help="only the job's cgroup"),
        P("addresses", "str_list", default=None,
          help="IPv4/IPv6 prefixes to match (source or destination), e.g. ['10.0.0.0/8', 'fd00::/64']"),
        P("netns", "str", default=None,
          help="network namespace of the interfaces: a name in /run/netns or /proc/PID/ns/net "
               "(defaults to the selector's)"),
    )),
    ActuatorSpec("deep_tracing", "Switch the deep probe tier (RDMA QP latency) on for a target, with a TTL.", (
        P("probe", "str", default="rdma_qp", choices=("rdma_qp",)),
        P("ttl", "duration", required=True, help="switched off after this long at the latest"),
        P("uprobes", "str_list", default=None, help="library:symbol pairs to attach"),
    )),
    ActuatorSpec("framework_hook", "Call a handler registered by the training script.", (
        P("handler", "str", required=True, help="e.g. dataloader.prefetch, checkpoint.now"),
        P("args", "mapping", default=None, help="arguments for the handler"),
        P("timeout", "duration", default=10.0),
        P("at_step_boundary", "bool", default=True),
    )),
    ActuatorSpec("sysctl", "Set a kernel tunable from an allow-list (e.g. kernel.numa_balancing).", (
        P("key", "str", required=True, choices=("kernel.numa_balancing", "vm.zone_reclaim_mode",
                                                "kernel.sched_autogroup_enabled", "vm.swappiness")),
        P("value", "str", required=True),
    )),
)}

VALUE_CHECKS: dict[tuple[str, str], Callable] = {
    ("dscp", "class"): tc_class,
    ("dscp", "addresses"): ip_prefixes,
    ("dscp", "netns"): netns_ref,
}
"""(actuator, parameter) -> the check a value of that type passes next: the
canonical value, or ValueError saying what would fit."""

ALTERNATIVE_PARAMS: dict[str, tuple[str, ...]] = {
    "affinity": ("node", "cpus", "device", "locality"),
}
"""Actuator -> parameters of which a policy gives exactly one."""

REPLACED_PARAMS: dict[tuple[str, str], str] = {
    ("dscp", "priority"): "use 'class', the class of the host's qdisc as tc prints it, e.g. class: \"1:30\" "
                          "(it sets skb->priority 0x10030)",
}
"""(actuator, former parameter) -> what to write instead."""
