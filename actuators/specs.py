"""The catalogue of actuators a policy may name, with their parameters.

Validation and the JSON Schema read these specs, so checking a policy never loads
an implementation (no bcc, no netlink). Implementations and simulated stand-ins
register against the same specs.

Example::

    SPECS["affinity"].param("node")   # ParamSpec(name="node", type="int", ...)

Parameter types and their conversion: ``reflexarc.core.params``.

Overhead: constants only.
"""
from __future__ import annotations

from .base import ActuatorSpec, ParamSpec as P

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
        P("cpus", "int_list", help="explicit CPU list instead of a node"),
        P("device", "str", help="PCI address (GPU/NIC) whose numa_node to use"),
        P("reserved_cpus", "int_list", default=None, help="CPUs to leave free"),
    )),
    ActuatorSpec("dscp", "Retag matching egress flows with a DSCP value through a tc-BPF classifier.", (
        P("dscp", "dscp", required=True, help="DSCP name (CS1, AF41, EF, ...) or number 0-63"),
        P("interfaces", "str_list", help="defaults to the selector's interfaces"),
        P("ports", "port_range", help="L4 port ranges to match, e.g. ['29500-29510']"),
        P("protocol", "str", default="tcp", choices=("tcp", "udp", "any")),
        P("priority", "int", default=None, help="also set skb->priority (HTB class)"),
        P("match_cgroup", "bool", default=False, help="only the job's cgroup"),
        P("addresses", "str_list", default=None,
          help="IP prefixes to match (source or destination), e.g. ['10.0.0.0/8']"),
        P("netns", "str", default=None,
          help="network namespace of the interfaces: a name in /run/netns or /proc/PID/ns/net"),
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
