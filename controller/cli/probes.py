"""``reflexarc probes [--dump-bpf]``: each probe's tier, status and attach
points on this node, the light ones really loaded on the policies' selection
and the deep ones as an on-demand session would find them; ``--dump-bpf``
prints the final C of each probe instead.

Example::

    reflexarc probes --policy policies/

Overhead: loading and unloading the light probes once.
"""
from __future__ import annotations

from .shared import CliError, _load_policies, _selection


def cmd_probes(args) -> int:
    from reflexarc.bpf import catalog
    from reflexarc.bpf.manager import ProbeManager
    policies = _load_policies(args.policy)
    manager = ProbeManager(_selection(policies, args.job), sys_root=args.sys_root)
    if args.dump_bpf:
        print(manager.dump_bpf())
        return 0
    rows = [(name, "light", st) for name, st in manager.start().items()]   # light probes really load
    try:
        for name in catalog.names("deep"):       # deep probes: what an on-demand session can use
            try:
                probe = catalog.probe_class(name)(manager.selection, manager.features, manager.node)
            except catalog.ProbeNotAvailable as exc:
                raise CliError(f"probe {name}: {exc}") from None
            rows.append((name, "deep", probe.capability()))
        print(f"{'probe':14s} {'tier':6s} {'status':12s} attach points / reason")
        for name, tier, st in rows:
            where = ", ".join(st.attach_points) or "-"
            print(f"{name:14s} {tier:6s} {st.state:12s} {where}" + (f"  ({st.reason})" if st.reason else ""))
    finally:
        manager.stop()
    return 0
