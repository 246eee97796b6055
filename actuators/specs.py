"""The catalogue of actuators a policy may name: one spec per actuator, read by everything.

Each ``ActuatorSpec`` (``reflexarc.core.params``) holds every fact about its
actuator that the rest of reflexarc needs without loading the implementation
(no bcc, no netlink): its parameters with their types, ranges, finer checks,
examples and the selector fields they default to; the groups of parameters of
which exactly one is given (``one_of``); parameters that were replaced and what
to write instead; what it targets; the phrase ``explain`` prints; how the
simulation stands in for it; and the class that implements it with the
``ActuatorConfig`` fields it takes. The policy loader, the JSON Schema,
``reflexarc act``, ``explain``, the registry, the simulation and the docs check
read these specs; a new actuator is its spec here, its module and its test.

Some values need a check finer than their parameter type (a tc class id, IP
prefixes, a network namespace): the functions below, named by the parameter's
``check``, turn such a value into its canonical form, for the loader and the
actuator alike.

Example::

    SPECS["affinity"].param("node")          # ParamSpec(name="node", type="int", range=(0, 1023), ...)
    SPECS["affinity"].one_of                 # (("node", "cpus", "device", "locality"),): give exactly one
    SPECS["irq_affinity"].explain({"interfaces": ["eth0"], "node": 1})
    # "moves every IRQ of eth0 to the CPUs of NUMA node 1"
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

from reflexarc.core.cpus import format_cpulist
from reflexarc.core.dscp import dscp_name
from reflexarc.core.durations import format_duration
from reflexarc.core.ports import format_port_ranges

from .base import ActuatorSpec
from .base import ParamSpec as P

_TC_CLASS = re.compile(r"([0-9a-f]{1,4}):([0-9a-f]{1,4})")
NETNS_PATTERN = r"^(/proc/[1-9][0-9]*/ns/net|(?!\.\.?$)[^/\s]+)$"
NAME_MAX = 255
MAX_NUMA_NODES = 1 << 10  # the kernel's MAX_NUMNODES at its largest (NODES_SHIFT 10)


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


# --- what one action does, in words (``explain``), from its resolved parameters ---------------

def _values(params: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


def _say_log(p: dict) -> str:
    return f'writes "{p.get("message", "")}" to the controller log ({p.get("level", "warning")})'


def _say_alert(p: dict) -> str:
    text = f"sends a {p.get('severity', 'warning')} alert"
    text += f' "{p["summary"]}"' if p.get("summary") else ""
    text += f" (labels {_values(p['labels'])})" if p.get("labels") else ""
    return text + ", with the evidence"


def _say_affinity(p: dict) -> str:
    where = (f"CPUs {format_cpulist(p['cpus'])}" if "cpus" in p else
             f"the CPUs of the NUMA node of PCI device {p['device']}" if "device" in p else
             "the CPUs of the job's NUMA node (that of the device it reads from or sends on, else the one "
             "holding most of its training process's memory)" if p.get("locality") else
             f"the CPUs of NUMA node {p['node']}")
    spare = f", leaving CPUs {format_cpulist(p['reserved_cpus'])} free" if p.get("reserved_cpus") else ""
    return f"re-pins every thread of the selected DataLoader workers to {where}{spare}"


def _say_irq_affinity(p: dict) -> str:
    where = (f"CPUs {format_cpulist(p['cpus'])}" if p.get("cpus") else
             "the CPUs of the NUMA node holding most of the memory of the job's training processes"
             if p.get("locality") else f"the CPUs of NUMA node {p['node']}")
    return f"moves every IRQ of {', '.join(p['interfaces'])} to {where}"


def _say_dscp(p: dict) -> str:
    protocol = p.get("protocol", "tcp")
    flows = "egress flows" if protocol == "any" else f"egress {protocol} flows"
    flows += f" on ports {format_port_ranges(p['ports'])}" if p.get("ports") else ""
    flows += f" to or from {', '.join(p['addresses'])}" if p.get("addresses") else ""
    flows += " of the job's cgroup" if p.get("match_cgroup") else ""
    text = f"retags the {flows} out of {', '.join(p['interfaces'])}"
    text += f" (network namespace {p['netns']})" if p.get("netns") else ""
    text += f" with DSCP {dscp_name(p['dscp'])} ({p['dscp']})"
    return text + (f" and queues them in class {p['class']}" if p.get("class") else "")


def _say_deep_tracing(p: dict) -> str:
    text = f"switches the deep probe {p.get('probe', 'rdma_qp')} on for {format_duration(p['ttl'])} at most"
    return text + (f", with uprobes {', '.join(p['uprobes'])}" if p.get("uprobes") else "")


def _say_framework_hook(p: dict) -> str:
    args = f" with {_values(p['args'])}" if p.get("args") else ""
    when = "at the next step boundary" if p.get("at_step_boundary", True) else "at once"
    return (f"calls the training script's `{p['handler']}` hook{args}, {when}, waiting at most "
            f"{format_duration(p.get('timeout', 10.0))}")


def _say_sysctl(p: dict) -> str:
    return f"sets the kernel tunable {p['key']} to {p['value']}"


NODE = (0, MAX_NUMA_NODES - 1)

SPECS: dict[str, ActuatorSpec] = {s.name: s for s in (
    ActuatorSpec("log", "Write a line to the controller log and audit trail.", (
        P("message", "str", default="", help="text to log"),
        P("level", "str", default="warning", choices=("info", "warning", "error")),
    ), changes_system=False, explain=_say_log, simulated="real", implementation="log:LogActuator"),
    ActuatorSpec("alert", "Raise an alert in Alertmanager (v2 API) and/or a JSON webhook.", (
        P("severity", "str", default="warning", choices=("info", "warning", "critical")),
        P("summary", "str", default="", help="one line for the on-call engineer"),
        P("labels", "mapping", default=None, help="extra alert labels", example={"team": "infra"}),
        P("description", "str", default="", help="longer text for the alert"),
    ), changes_system=False, accepts_evidence=True, explain=_say_alert, simulated="plant",
        implementation="alert:AlertActuator", takes=("alertmanager_url", "webhook_url", "audit_path")),
    ActuatorSpec("affinity", "Re-pin every thread of the selected DataLoader workers to node-local CPUs.", (
        P("node", "int", range=NODE, help="NUMA node whose CPUs to use"),
        P("cpus", "int_list", help="CPUs to use instead of a node's, in the kernel's notation '0-3,8' (a "
                                   "policy may also write a list [0, 1])"),
        P("device", "str", help="PCI address (GPU/NIC) whose numa_node to use", example="0000:3b:00.0"),
        P("locality", "bool", help="true: the NUMA node of the device the job reads from or sends on when "
                                   "sysfs knows it (the target's iface or dev label, else the selector's "
                                   "interfaces), else the node holding most of the training process's "
                                   "memory (/proc/PID/numa_maps); the plan says which and why"),
        P("reserved_cpus", "int_list", default=None, help="CPUs to leave free, written as cpus", example=[0]),
    ), one_of=(("node", "cpus", "device", "locality"),), target="process", explain=_say_affinity,
        simulated="plant", implementation="affinity:AffinityActuator", takes=("proc_root", "sys_root")),
    ActuatorSpec("irq_affinity", "Move every IRQ of the job's network interfaces to the CPUs of the job's NUMA "
                                 "node (each IRQ's smp_affinity_list restored exactly on revert).", (
        P("interfaces", "str_list", required=True, from_selector="interfaces",
          help="network interfaces whose IRQs to move", example=["eth0"]),
        P("node", "int", range=NODE, help="NUMA node whose CPUs to use"),
        P("cpus", "int_list", help="CPUs to use instead of a node's, in the kernel's notation '0-3,8'"),
        P("locality", "bool", help="true: the NUMA node holding most of the memory of the job's training "
                                   "processes (the target's trainer, else the selector's pids; "
                                   "/proc/PID/numa_maps)"),
    ), one_of=(("node", "cpus", "locality"),), target="link", explain=_say_irq_affinity,
        implementation="irq_affinity:IrqAffinityActuator", takes=("proc_root", "sys_root")),
    ActuatorSpec("dscp", "Retag matching egress flows with a DSCP value through a tc-BPF classifier.", (
        P("dscp", "dscp", required=True, help="DSCP name (CS1, AF41, EF, ...) or number 0-63", example="AF41"),
        P("interfaces", "str_list", required=True, from_selector="interfaces",
          help="network interfaces to retag on", example=["eth0"]),
        P("ports", "port_range", from_selector="ports", help="L4 port ranges to match",
          example=["29500-29510"]),
        P("protocol", "str", default="tcp", choices=("tcp", "udp", "any")),
        P("class", "str", default=None, check=tc_class, example="1:30",
          help="class of the interfaces' root qdisc to queue the flows in, as tc prints it "
               "(sets skb->priority; HTB ignores DSCP)"),
        P("match_cgroup", "bool", default=False, help="only the job's cgroup"),
        P("addresses", "str_list", default=None, check=ip_prefixes, example=["10.0.0.0/8"],
          help="IPv4/IPv6 prefixes to match (source or destination)"),
        P("netns", "str", default=None, check=netns_ref, from_selector="netns", example="train",
          help="network namespace of the interfaces: a name in /run/netns or /proc/PID/ns/net"),
    ), replaced=(("priority", "use 'class', the class of the host's qdisc as tc prints it, e.g. class: \"1:30\" "
                              "(it sets skb->priority 0x10030)"),),
        target="link", explain=_say_dscp, simulated="plant", implementation="dscp:DscpActuator"),
    ActuatorSpec("deep_tracing", "Switch the deep probe tier (RDMA QP latency) on for a target, with a TTL.", (
        P("probe", "str", default="rdma_qp", choices=("rdma_qp",)),
        P("ttl", "duration", required=True, help="switched off after this long at the latest", example="10m"),
        P("uprobes", "str_list", default=None, help="library:symbol pairs to attach",
          example=["libmlx5.so.1:mlx5_post_send", "libmlx5.so.1:mlx5_poll_cq"]),
    ), explain=_say_deep_tracing, simulated="plant", implementation="deep_tracing:DeepTracingActuator",
        takes=("deep_tier",), held_by_controller=True),
    ActuatorSpec("framework_hook", "Call a handler registered by the training script.", (
        P("handler", "str", required=True, help="a handler the training script registered",
          example="dataloader.prefetch"),
        P("args", "mapping", default=None, help="arguments for the handler", example={"factor": 4}),
        P("timeout", "duration", default=10.0),
        P("at_step_boundary", "bool", default=True),
    ), target="process", explain=_say_framework_hook, simulated="plant",
        implementation="framework_hook:FrameworkHookActuator", takes=("hook_dir",)),
    ActuatorSpec("sysctl", "Set a kernel tunable from an allow-list (e.g. kernel.numa_balancing).", (
        P("key", "str", required=True, choices=("kernel.numa_balancing", "vm.zone_reclaim_mode",
                                                "kernel.sched_autogroup_enabled", "vm.swappiness")),
        P("value", "str", required=True, example="0"),
    ), explain=_say_sysctl, simulated="plant", implementation="sysctl:SysctlActuator", takes=("proc_root",)),
)}
