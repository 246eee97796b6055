"""``reflexarc run``: the controller on live signals, and its wiring. First,
before anything that may fail or that a peer may hold, what a previous
controller left applied is reverted or adopted (``_reconcile``); then the
policies (refused when one would enforce from a file another user can write:
``_refuse_untrusted``), the sources (replay, NVML, the hooks, PromQL, the
probes on the policies' ``_selection``), the metrics exporter
(``_metrics_server``), the fleet budget (``_fleet_budget``: ``--fleet-etcd``,
registered just before the loop, its lease revoked when it stops), the
controller, the reloader (SIGHUP or a changed
policy file: ``runtime.reload``) and the control socket (``_control``:
``runtime.control``, answered by ``runtime.steer``); ``runtime.live.run_live``
loops until ``--duration`` ends or a signal stops it.

Example::

    reflexarc run --policy policies/ --mode dry-run --metrics-addr 9464

Overhead: the controller's own (docs/benchmarks.md); the wiring runs once, at start.
"""
from __future__ import annotations

import json
import logging
import os
import stat
import sys
from pathlib import Path

from reflexarc.core.input_files import check_regular, kind_of

from ..runtime.narrate import Narrator
from .shared import (EARLY_HUPS, CliError, _actuator_config, _fleet_store, _journal, _load_policies,
                     _node_findings, _paths_or_builtin, _promql, _selection, _set_hup)


def _output_file(path: str, what: str) -> Path:
    """A path to append to: absent, or a regular file (a FIFO would block, a device
    swallow it, and a symbolic link is not followed: it could point anywhere)."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):   # to be made (or refused when its directory is)
        return Path(path)
    if stat.S_ISLNK(mode):
        raise CliError(f"{what} {path} is a symbolic link; name the file itself")
    if not stat.S_ISREG(mode):
        raise CliError(f"{what} {path} is {kind_of(mode)}, not a regular file")
    return Path(path)


def _refuse_untrusted(policies, override: str | None) -> None:
    """Policies that will enforce must come from files no other user can write."""
    from ..policy.trust import untrusted
    problems = []
    for p in policies:
        if (override or p.mode) == "enforce" and p.loc is not None:
            reason = untrusted(p.loc.file)
            if reason:
                problems.append(f"{p.loc.file}: policy {p.name} would enforce, but the file is {reason}")
    for problem in problems[:-1]:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        raise CliError(problems[-1])


def _metrics_server(args, registry):
    """The exporter of ``run --metrics-addr`` (``--metrics-port`` is its deprecated
    loopback form), bound now: an address in use is an error before anything starts."""
    address = args.metrics_addr or (args.metrics_port and ("127.0.0.1", args.metrics_port))
    if not address:
        return None
    from ..runtime.exporter import MetricsServer
    try:
        return MetricsServer(address, registry)
    except OSError as exc:
        host, port = address
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise CliError(f"--metrics-addr {shown}: cannot listen there: {exc.strerror or exc}") from None


FLEET_OPTIONS = ("fleet_max_nodes", "fleet_max_percent", "fleet_ca", "fleet_cert", "fleet_key")


def _node_name(args) -> str:
    """This node's name: ``--node-name``, else the host name (one that cannot name a node is an error)."""
    import socket
    node = args.node_name or socket.gethostname()
    if not node or "/" in node:
        raise CliError(f"the host name {node!r} cannot name this node: give --node-name NAME")
    return node


def _fleet_budget(args, policies, override, node: str):
    """The fleet budget of ``run --fleet-etcd`` (``controller/fleet/``), not yet
    registered; None without ``--fleet-etcd``. An option of the budget without
    it, a budget without a limit and without a policy's rollout or budget to
    hold, or an enforcing policy with a rollout or a budget and no store, is an
    error."""
    enforcing = [p for p in policies if (override or p.mode) == "enforce"]
    rolled = [p.name for p in enforcing if p.rollout is not None]
    budgeted = [p.name for p in enforcing if p.budget is not None]
    if not args.fleet_etcd:
        given = [f"--{name.replace('_', '-')}" for name in FLEET_OPTIONS if getattr(args, name) is not None]
        if given:
            raise CliError(f"{given[0]} needs --fleet-etcd (the etcd cluster that holds the fleet's budget)")
        if rolled:
            raise CliError(f"policy {rolled[0]} enforces a fleet rollout, which is held in etcd: give --fleet-etcd "
                           f"(docs/fleet.md), or run it in dry-run or alert-only")
        if budgeted:
            raise CliError(f"policy {budgeted[0]} enforces under a fleet budget, which is held in etcd: give "
                           f"--fleet-etcd (docs/fleet.md), or run it in dry-run or alert-only")
        return None
    if args.fleet_max_nodes is None and args.fleet_max_percent is None and not rolled and not budgeted:
        raise CliError("--fleet-etcd needs a limit (--fleet-max-nodes N, --fleet-max-percent P, or both) or an "
                       "enforcing policy with a rollout or a budget")
    from ..fleet.budget import FleetBudget
    return FleetBudget(_fleet_store(args), node, max_nodes=args.fleet_max_nodes,
                       max_percent=args.fleet_max_percent, ttl=args.fleet_ttl, prefix=args.fleet_prefix,
                       park_ttl=args.fleet_park_ttl)


def _reconcile(executor, journal) -> list:
    """Revert (or adopt) what the journal lists open, then compact it; a line on
    stderr for each change reverted or not, since the audit is not open yet."""
    results = executor.reconcile()
    for jid, res in results:
        actuator = res.change.actuator if res.change else "?"
        detail = f": {res.error}" if res.error else ""
        print(f"reconciled at start: {jid} {actuator} {res.outcome}{detail}"
              + (f"; {res.unrecorded}" if res.unrecorded else ""), file=sys.stderr)
    journal.compact()
    return results


def _control(args, ctl, journal, manager):
    """The control socket of this run (``control.py``), answered by ``steer.py``."""
    from ..runtime.control import ControlError, ControlServer, group_id, socket_path
    from ..runtime.steer import Steering
    probes = (lambda: {}) if manager is None else (lambda: {n: st.state for n, st in manager.statuses().items()})
    try:
        return ControlServer(socket_path(args.state_dir), Steering(ctl, journal, probes),
                             group=group_id(args.control_group))
    except ControlError as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"control socket {socket_path(args.state_dir)}: {exc.strerror or exc}") from None


def cmd_run(args) -> int:
    from reflexarc.actuators.registry import build_registry

    from ..engine.audit import AuditLog
    from ..engine.bus import SignalBus
    from ..engine.clock import WallClock
    from ..engine.engine import Controller
    from ..engine.executor import Executor
    from ..engine.limits import LimitSettings
    from ..fleet.rollout import FleetRollout
    from ..policy.readiness import idle_reason
    from ..runtime.live import run_live
    from ..runtime.reload import PolicyFiles, Reloader
    from ..signals.producers import NVML, Producer
    from ..sources.readers import HookSource, NvmlSource, ProbeSource, ReplaySource, SourceError
    # First, before anything that may fail or that a peer may hold (the policies,
    # the audit, the metrics port, the hook channel): what a previous controller
    # left applied is reverted or adopted.
    clock = WallClock()
    journal = _journal(args, clock)
    audit_path = Path(args.audit or Path(args.state_dir) / "audit.jsonl")
    config = _actuator_config(args)
    config.audit_path = str(audit_path.resolve())
    registry = build_registry(config)
    reconciled = _reconcile(Executor(registry, journal, clock), journal)
    _output_file(str(audit_path), "the audit log")
    files = PolicyFiles(_paths_or_builtin(args.policy))   # before the load: a change while starting is reloaded
    policies = _load_policies(args.policy, withhold=True)
    override = None if args.mode == "policy" else args.mode
    node = _node_name(args)
    budget = _fleet_budget(args, policies, override, node)
    _refuse_untrusted(policies, override)
    promql = _promql(args)
    for finding in promql.diagnostics:
        print(finding, file=sys.stderr)
    if any(d.is_error for d in promql.diagnostics):
        raise CliError(f"{sum(d.is_error for d in promql.diagnostics)} error(s) in {args.promql_config}")
    facts, findings = _node_findings(args, policies, override, promql.config, jobs=False)
    for finding in findings:
        print(finding, file=sys.stderr)
    policies = [p for p in policies if not idle_reason(p, facts)]
    sources = []
    try:
        if args.replay is not None:
            check_regular(args.replay)
            sources.append(ReplaySource(args.replay, clock.now()))
        if facts.why_not(Producer(NVML, device="gpu")) is None:
            sources.append(NvmlSource(job=args.job))
    except SourceError as exc:
        raise CliError(str(exc)) from None
    from ..engine.metrics import ControllerMetrics
    from ..policy.trust import untrusted
    metrics = ControllerMetrics()
    server = _metrics_server(args, metrics.registry)
    hook_dir = Path(args.hook_dir)
    if not hook_dir.exists() and os.geteuid() == 0:
        # root's, 0755: a job that is not root serves in HOOK_DIR/JOB, made for its user (docs/hooks.md)
        umask = os.umask(0o022)
        try:
            hook_dir.mkdir(parents=True, mode=0o755)
        finally:
            os.umask(umask)
    if hook_dir.is_dir():
        unsafe = untrusted(hook_dir)
        if unsafe:
            raise CliError(f"hook directory {hook_dir}: {unsafe}: other users could serve forged hook sockets "
                           f"there; fix: make it and the directories above it root's, writable by root only "
                           f"(chown root:root {hook_dir} && chmod 0755 {hook_dir}); a job that is not root serves "
                           f"in {hook_dir}/JOB, made with install -d -o USER -m 0700 (docs/hooks.md)")
        sources.append(HookSource(args.hook_dir, args.job, policies, metrics.registry))
    if promql.config is not None:
        from ..sources.promql import PromqlSource
        sources.append(PromqlSource(promql.config, metrics.registry))
    manager = None
    bus = SignalBus()                      # the probe source drops exited processes' series from it
    if not args.no_probes:
        from reflexarc.bpf.manager import ProbeManager
        manager = ProbeManager(_selection(policies, args.job), interval=args.interval, sys_root=args.sys_root,
                               clock=clock.now)
        for name, status in manager.start().items():
            logging.getLogger("reflexarc.probes").info("%s: %s", name, status)
        config.deep_tier = manager
        registry.discard("deep_tracing")     # built without the deep tier if the reconcile used it
        if budget is not None:               # the jobs it found: a per-job share counts the nodes that run each
            budget.jobs = lambda: [job.name for job in manager.jobs]
        from reflexarc.bpf.device_locality import DeviceLocality
        sources.append(ProbeSource(manager, hook_dir=str(hook_dir) if hook_dir.is_dir() else None, bus=bus,
                                   locality=DeviceLocality(proc_root=args.proc_root, sys_root=args.sys_root)))
    ctl = Controller(policies, bus, registry, clock, mode_override=override, metrics=metrics,
                     journal=journal, audit=AuditLog(audit_path, clock, evals="sampled", sample_every=args.audit_sample,
                                                    max_bytes=int(args.audit_max_mb * (1 << 20)),
                                                    listeners=[Narrator(args.log_format)]),   # each event on stderr
                     limits=LimitSettings(args.kill_switch, args.max_active, args.actions_per_hour),
                     target_grace=args.target_grace, budget=budget,
                     rollout=None if budget is None else FleetRollout(budget))
    reloader = Reloader(ctl, files, facts, receiver=bool(args.alertmanager_url or args.webhook_url),
                        selection=None if manager is None else lambda ps: _selection(ps, args.job))
    hup = _set_hup(lambda *_: reloader.request())   # reload at the next tick
    if EARLY_HUPS:                                   # one came while starting
        reloader.request()
    control = _control(args, ctl, journal, manager)
    ctl.start(source="live", reconciled=reconciled, node=node)
    if server is not None:
        from ..runtime.exporter import export_live_state
        export_live_state(metrics.registry, ctl.bus, manager, journal, ctl.audit,
                          alerts=lambda: registry.built("alert"), budget=budget)
    if budget is not None:
        budget.start()
    try:
        summary = run_live(ctl, sources, clock, args.interval, args.duration, server, reloader=reloader,
                           control=control, arrivals=args.arrivals if args.arrivals < args.interval else 0.0)
    finally:
        _set_hup(hup)
        if budget is not None:
            budget.stop(keep=ctl.executor.slot_holders())   # the lease revoked; the changes left applied keep theirs
    journal.close()
    print(json.dumps({k: v for k, v in summary.items() if k != "states"}, sort_keys=True))
    print(f"audit: {audit_path}")
    return 0
