"""The ``reflexarc`` command line.

    reflexarc validate FILE|DIR...           check policies (file:line:col: error: ...)
    reflexarc simulate --list | SCENARIO     run a scenario in simulated time, write audit + report
    reflexarc test-policies FILE|DIR...      policy unit tests (scenario + expected actions)
    reflexarc report AUDIT --out DIR         HTML/JSON/Markdown report of an audit log
    reflexarc run [--policy P] [--mode M]    the controller on live probes (default dry-run;
                                             --mode policy honours each file's mode; SIGHUP
                                             or a changed policy file reloads: reload.py)
    reflexarc probes [--dump-bpf]            each probe's tier, status and attach points
    reflexarc top                            live signals per target
    reflexarc act ACTUATOR key=value...      one actuator by hand, through plan/diff/journal
    reflexarc rollback ID|--all              revert journaled changes
    reflexarc journal                        list journaled changes

Bad input gives one ``error:`` line and exit 1 (2 for a bad command line),
never a traceback (``REFLEXARC_DEBUG=1`` shows it) and never a wait: intervals
are finite and > 0, durations finite and >= 0, counts whole and >= 0, paths not
empty, and an input file is read only when it is a regular file (a FIFO or a
device is refused before it is opened for reading). Overhead: argument parsing
only; each command imports what it needs.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import stat
import sys
from pathlib import Path

from reflexarc.actuators.base import ActuatorError
from reflexarc.core.outcomes import Outcome

from .input_files import InputFileError, check_regular, kind_of
from .policy.model import MODES

DEFAULT_STATE_DIR = "/var/lib/reflexarc"


class CliError(Exception):
    """An error the user can fix; printed as one ``error:`` line."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        print(f"error: {message} (see '{self.prog} --help')", file=sys.stderr)
        sys.exit(2)


# --- helpers -------------------------------------------------------------------
def _duration_arg(text: str) -> float:
    """An argparse type: a duration (``90``, ``20m``, ``1h``), finite and >= 0."""
    from reflexarc.core.durations import DurationError, parse_duration
    try:
        return parse_duration(text)
    except DurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _interval_arg(text: str) -> float:
    """An argparse type: a duration > 0 (a loop interval)."""
    value = _duration_arg(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not an interval: use a duration > 0, e.g. 1 or 500ms")
    return value


def _path_arg(text: str) -> str:
    """An argparse type: a path that is not empty (an empty one would mean the current directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path: name a file or directory")
    return text


def _count_arg(text: str) -> int:
    """An argparse type: a whole number >= 0."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number >= 0")
    return int(text)


def _port_arg(text: str) -> int:
    """An argparse type: a TCP port 1-65535."""
    if not text.strip().isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"'{text}' is not a port (1-65535)")
    return int(text)


def _address_arg(text: str) -> tuple[str, int]:
    """An argparse type: a listen address, ``[HOST:]PORT`` (loopback without a host)."""
    from .exporter import parse_address
    try:
        return parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _size_mb_arg(text: str) -> float:
    """An argparse type: a size in MB, finite and > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"'{text}' is not a size in MB (a number > 0)")
    return value


def _paths_or_builtin(paths):
    if paths:
        return paths
    from .simulate import BUILTIN_POLICIES
    return [str(BUILTIN_POLICIES)]


def _policy_error(exc) -> CliError:
    """The diagnostics of a ``PolicyError`` on stderr, and the one-line error that closes them."""
    for d in exc.diagnostics:
        print(d, file=sys.stderr)
    return CliError(f"{len([d for d in exc.diagnostics if d.is_error])} error(s) in policy files")


def _load_policies(paths, withhold: bool = False):
    """The policies of ``paths``; with ``withhold`` (a controller, which reads as
    root), the findings of untrusted files do not quote them (``trust.withheld``)."""
    from .policy.diagnostics import PolicyError
    from .policy.loader import load_policies
    from .policy.trust import withheld
    try:
        policies = load_policies(_paths_or_builtin(paths))
    except PolicyError as exc:
        if withhold:
            exc.diagnostics = withheld(exc.diagnostics)
        raise _policy_error(exc) from None
    if not policies:
        raise CliError(f"no policies in {', '.join(_paths_or_builtin(paths))}")
    return policies


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


def _output_dir(path: str) -> Path:
    if Path(path).exists() and not Path(path).is_dir():
        raise CliError(f"--out {path} is not a directory")
    return Path(path)


def _refuse_untrusted(policies, override: str | None) -> None:
    """Policies that will enforce must come from files no other user can write."""
    from .policy.trust import untrusted
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


def _actuator_config(args):
    from reflexarc.actuators.registry import ActuatorConfig
    return ActuatorConfig(proc_root=args.proc_root, sys_root=args.sys_root, state_dir=args.state_dir,
                          hook_dir=args.hook_dir, alertmanager_url=args.alertmanager_url,
                          webhook_url=args.webhook_url)


def _promql(args):
    """The PromQL source's configuration (``--promql-config``), and what checking
    it and its queries against Prometheus found (``promql.load_checked``)."""
    from .promql import load_checked
    return load_checked(getattr(args, "promql_config", None))


def _node_findings(args, policies, override: str | None = None, promql=None, jobs: bool = True):
    """What keeps the policies from working on this node (``readiness.py``);
    ``promql``: the PromQL source's configuration, if one is given; ``jobs``:
    also say which jobs the policies name run nowhere here (not for ``run``,
    where jobs start and stop while it runs)."""
    from reflexarc.core.devices import Devices
    from .producers import NodeFacts
    from .readiness import findings
    facts = NodeFacts(Devices(sys_root=args.sys_root), promql=promql.signals if promql else False,
                      jobs=_running_jobs(args.proc_root) if jobs else None)
    receiver = bool(args.alertmanager_url or args.webhook_url)
    return facts, findings(policies, facts, receiver, override, strict=getattr(args, "strict", False))


def _running_jobs(proc_root: str) -> tuple[str, ...] | None:
    """The jobs discovery finds on this node now; None without root, which
    cannot read other users' processes (so cannot say a job is absent)."""
    if os.geteuid() != 0:
        return None
    from reflexarc.core.jobs import Discovery
    discovery = Discovery(proc_root)
    discovery.refresh()
    return tuple(j.name for j in discovery.jobs() if j.name)


def _journal(args, clock=None):
    from .journal import Journal, JournalLocked
    from .policy.trust import untrusted
    state = Path(args.state_dir)
    try:
        unsafe = untrusted(state) if state.exists() else None
    except OSError as exc:
        raise CliError(f"state directory {state}: {exc.strerror or exc}") from None
    if unsafe:
        raise CliError(f"state directory {state}: {unsafe}: another user could plant files or links there that "
                       f"the journal and audit are written through; fix: chown root:root {state} && "
                       f"chmod 0700 {state} (and the same for the directories above it)")
    try:
        journal = Journal(Path(args.state_dir) / "journal.jsonl", clock)
    except JournalLocked as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"cannot open the journal in {args.state_dir}: {exc.strerror or exc}") from None
    for warning in journal.warnings:
        print(warning, file=sys.stderr)
    if journal.unwritable:
        print(f"{journal.path}: warning: cannot be written ({journal.unwritable}): "
              "no new change is applied until it can", file=sys.stderr)
    return journal


# --- commands ------------------------------------------------------------------
def cmd_validate(args) -> int:
    from .policy.loader import validate_paths
    policies, diags = validate_paths(args.paths)
    promql = _promql(args)
    diags = diags + promql.diagnostics
    if not any(d.is_error for d in diags):
        diags = sorted(diags + _node_findings(args, policies, promql=promql.config)[1])
    for d in diags:
        print(d)
    errors = [d for d in diags if d.is_error]
    if errors:
        print(f"error: {len(errors)} error(s) in {len(args.paths)} path(s)", file=sys.stderr)
        return 1
    print(f"ok: {len(policies)} policies, {sum(len(p.rules) for p in policies)} rules")
    return 0


def cmd_explain(args) -> int:
    from reflexarc.core.signals import suggest
    from .explain import explain
    policies = _load_policies(args.paths)
    if args.policy_name:
        names = [p.name for p in policies]
        policies = [p for p in policies if p.name == args.policy_name]
        if not policies:
            hint = suggest(args.policy_name, names)
            raise CliError(f"no policy '{args.policy_name}' in {', '.join(args.paths)}"
                           + (f"; did you mean '{hint}'?" if hint else f" (there: {', '.join(names)})"))
    promql = _promql(args)
    for finding in promql.diagnostics:
        print(finding, file=sys.stderr)
    if any(d.is_error for d in promql.diagnostics):
        raise CliError(f"{sum(d.is_error for d in promql.diagnostics)} error(s) in {args.promql_config}")
    facts, _ = _node_findings(args, [], promql=promql.config)   # the node as validate and run see it
    print(explain(policies, facts, receiver=bool(args.alertmanager_url or args.webhook_url)), end="")
    return 0


def cmd_simulate(args) -> int:
    from reflexarc.simulations import ScenarioError, list_scenarios
    if args.list or not args.scenario:
        for name, desc in list_scenarios():
            print(f"{name:24s} {desc}")
        return 0
    from .report import format_summary_table, summarize
    from .simulate import run_scenario
    out = _output_dir(args.out or f"out/{args.scenario.replace('/', '_')}")
    policies = _load_policies(args.policy) if args.policy else None
    try:
        result = run_scenario(args.scenario, policies, args.mode, out, report=True)
    except ScenarioError as exc:
        raise CliError(str(exc)) from None
    print(format_summary_table(summarize(result.records)))
    print(f"audit:  {result.audit_path}")
    print(f"report: {result.reports.get('html')}")
    return 0


def cmd_test_policies(args) -> int:
    from .policy_tests import run_policy_tests
    failed = run_policy_tests(args.paths, verbose=args.verbose)
    if failed:
        raise CliError(f"{failed} policy test(s) failed")
    return 0


def cmd_report(args) -> int:
    from .report import format_summary_table, load_audit, write_audit_report
    check_regular(args.audit)
    out = _output_dir(args.out)
    audit = load_audit(args.audit)
    if audit.record_count == 0:
        first = f" (line {audit.malformed[0]['line']}: {audit.malformed[0]['reason']})" if audit.malformed else ""
        raise CliError(f"{args.audit}: not an audit log: no audit record in its "
                       f"{audit.malformed_count} non-blank line(s){first}")
    paths, summary = write_audit_report(audit, out, full=args.full)
    print(format_summary_table(summary))
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


def _selection(policies, job: str):
    """What the probes watch: the union of the policies' selectors. A cgroup
    (v2) is selected by its id, the inode number of its directory: as tasks to
    watch, or, in a policy that names interfaces, as the owner of the job's
    traffic on them. Interfaces are watched in one network namespace."""
    from reflexarc.bpf.probe import Selection
    comms, pids, ports, cgroups, traffic, ifaces = set(), set(), set(), set(), set(), set()
    speeds, netns = {}, {}
    for p in policies:
        comms.update(p.selector.processes)
        pids.update(p.selector.pids)
        ports.update(tuple(r) for r in p.selector.ports)
        ifaces.update(p.selector.interfaces)
        speeds.update(p.selector.link_speeds)
        if p.selector.interfaces:
            netns.setdefault(p.selector.netns, p.name)
        if p.selector.cgroup:
            try:
                ino = os.stat(p.selector.cgroup).st_ino
            except OSError as exc:
                raise CliError(f"policy {p.name}: cgroup {p.selector.cgroup}: {exc.strerror}") from None
            # with interfaces, the cgroup says whose packets are the job's; else which tasks to watch
            (traffic if p.selector.interfaces else cgroups).add(ino)
    if len(netns) > 1:
        named = ", ".join(f"{ns or 'the host'} (policy {name})" for ns, name in netns.items())
        raise CliError(f"the probes watch interfaces in one network namespace; the policies name {named}")
    default = () if (pids or cgroups) else ("pt_data_worker",)   # DataLoader workers unless told otherwise
    return Selection(comms=tuple(sorted(comms)) or default, pids=tuple(sorted(pids)),
                     cgroup_ids=tuple(sorted(cgroups)), ports=tuple(sorted(ports)), job=job,
                     interfaces=tuple(sorted(ifaces)), netns=next(iter(netns), ""),
                     link_speeds=tuple(sorted(speeds.items())), traffic_cgroup_ids=tuple(sorted(traffic)))


def _metrics_server(args, registry):
    """The exporter of ``run --metrics-addr`` (``--metrics-port`` is its deprecated
    loopback form), bound now: an address in use is an error before anything starts."""
    address = args.metrics_addr or (args.metrics_port and ("127.0.0.1", args.metrics_port))
    if not address:
        return None
    from .exporter import MetricsServer
    try:
        return MetricsServer(address, registry)
    except OSError as exc:
        host, port = address
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise CliError(f"--metrics-addr {shown}: cannot listen there: {exc.strerror or exc}") from None


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


def cmd_run(args) -> int:
    from reflexarc.actuators.registry import build_registry
    from .audit import AuditLog
    from .bus import SignalBus
    from .clock import WallClock
    from .engine import Controller
    from .limits import LimitSettings
    from .live import run_live
    from .producers import NVML, Producer
    from .readiness import idle_reason
    from .sources import HookSource, NvmlSource, ProbeSource, ReplaySource, SourceError
    import signal
    from .executor import Executor
    from .reload import PolicyFiles, Reloader
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
    from .metrics import ControllerMetrics
    from .policy.trust import untrusted
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
        from .promql import PromqlSource
        sources.append(PromqlSource(promql.config, metrics.registry))
    manager = None
    if not args.no_probes:
        from reflexarc.bpf.manager import ProbeManager
        manager = ProbeManager(_selection(policies, args.job), interval=args.interval, sys_root=args.sys_root,
                               clock=clock.now)
        for name, status in manager.start().items():
            logging.getLogger("reflexarc.probes").info("%s: %s", name, status)
        config.deep_tier = manager
        registry.discard("deep_tracing")     # built without the deep tier if the reconcile used it
        sources.append(ProbeSource(manager, hook_dir=str(hook_dir) if hook_dir.is_dir() else None))
    ctl = Controller(policies, SignalBus(), registry, clock, mode_override=override, metrics=metrics,
                     journal=journal, audit=AuditLog(audit_path, clock, evals="sampled", sample_every=args.audit_sample,
                                                    max_bytes=int(args.audit_max_mb * (1 << 20))),
                     limits=LimitSettings(args.kill_switch, args.max_active, args.actions_per_hour),
                     target_grace=args.target_grace)
    reloader = Reloader(ctl, files, facts, receiver=bool(args.alertmanager_url or args.webhook_url),
                        selection=None if manager is None else lambda ps: _selection(ps, args.job))
    hup = _set_hup(lambda *_: reloader.request())   # reload at the next tick
    if EARLY_HUPS:                                   # one came while starting
        reloader.request()
    ctl.start(source="live", reconciled=reconciled)
    if server is not None:
        from .exporter import export_live_state
        export_live_state(metrics.registry, ctl.bus, manager, journal, ctl.audit,
                          alerts=lambda: registry.built("alert"))
    try:
        summary = run_live(ctl, sources, clock, args.interval, args.duration, server, reloader=reloader)
    finally:
        _set_hup(hup)
    journal.close()
    print(json.dumps({k: v for k, v in summary.items() if k != "states"}, sort_keys=True))
    print(f"audit: {audit_path}")
    return 0


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


def cmd_top(args) -> int:
    from .top import run_top
    hook_dir = args.hook_dir if Path(args.hook_dir).is_dir() else None
    if args.no_probes and hook_dir is None:
        raise CliError(f"--no-probes: nothing to show without the hook directory {args.hook_dir}")
    selection = None if args.no_probes else _selection(_load_policies(args.policy), args.job)
    return run_top(selection, args.interval, 1 if args.once else args.count, hook_dir=hook_dir, job=args.job,
                   sys_root=args.sys_root, proc_root=args.proc_root, probes=not args.no_probes)


def cmd_jobs(args) -> int:
    from reflexarc.core.jobs import Discovery
    from .jobs_view import format_jobs, jobs_json
    if os.geteuid() != 0:
        print("warning: not root: other users' processes cannot be read, so their jobs are not listed",
              file=sys.stderr)
    discovery = Discovery(args.proc_root, fallback=args.job)
    discovery.refresh()
    jobs = discovery.jobs()
    print(jobs_json(jobs, discovery.skipped) if args.json else format_jobs(jobs, discovery.skipped))
    return 0


def _delivered(sender, res):
    """``res`` once the alert it queued was delivered, or FAILED with why when
    no receiver took it (a one-shot command has no later tick to tell)."""
    import dataclasses
    sender.flush(2 * sender.deadline + 5)
    if any(outcome == "sent" and n for (_, outcome), n in sender.deliveries.items()):
        return res
    failed = sorted({receiver for (receiver, outcome), n in sender.deliveries.items() if n})
    why = "; ".join(f"{r}: {sender.last_error.get(r, 'not sent')}" for r in failed) or "not sent"
    return dataclasses.replace(res, outcome=Outcome.FAILED, error=f"alert not delivered: {why}")


def cmd_act(args) -> int:
    from reflexarc.actuators.base import Target
    from reflexarc.actuators.registry import build_registry
    from reflexarc.core.params import check_params
    from reflexarc.core.ports import port_ranges
    from reflexarc.core.targets import pid_label
    from .clock import WallClock
    from .executor import Executor
    config = _actuator_config(args)
    if args.actuator == "deep_tracing":       # a deep tier to plan against (no probe loads in dry-run)
        from reflexarc.bpf.manager import ProbeManager
        from reflexarc.bpf.probe import Selection
        config.deep_tier = ProbeManager(Selection(), probes=[])
    registry = build_registry(config)
    if args.actuator not in registry:
        from reflexarc.core.signals import suggest
        hint = suggest(args.actuator, registry.names())
        raise CliError(f"unknown actuator '{args.actuator}'" + (f"; did you mean '{hint}'?" if hint else ""))
    if args.actuator == "deep_tracing" and args.mode == "enforce":
        raise CliError("deep tracing lives as long as the controller that switched it on: "
                       "let a policy switch it (reflexarc run), or plan it here with --mode dry-run")
    texts = {}
    for item in args.params:
        key, sep, value = item.partition("=")
        if not sep:
            raise CliError(f"'{item}': parameters are key=value")
        texts[key] = value
    labels = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not (sep and key):
            raise CliError(f"--label '{item}': labels are key=value, e.g. trainer=4242")
        labels[key] = value
    try:
        params = check_params(registry.spec(args.actuator), texts)
        ports = port_ranges(args.port)
        named = [pid for pid in (pid_label(labels, "pid"), pid_label(labels, "trainer")) if pid is not None]
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if any(pid < 1 for pid in args.pid):
        raise CliError(f"--pid {min(args.pid)} is not a process id (a whole number > 0)")
    if args.actuator in ("affinity", "framework_hook") and not (args.pid or args.cgroup or args.job or named
                                                                or labels.get("job")):
        raise CliError(f"{args.actuator} acts on processes: name the target by --pid PID, --cgroup PATH, "
                       "--job NAME, --label pid=PID or --label trainer=PID (a process name alone would match "
                       "processes anywhere on the node)")
    selector = {"match": {"job": args.job} if args.job else {}, "processes": args.process, "pids": args.pid,
                "cgroup": args.cgroup or "", "interfaces": args.interface, "ports": ports}
    clock = WallClock()
    journal = _journal(args, clock) if args.mode == "enforce" else None
    ex = Executor(registry, journal, clock)
    target = Target(labels, {**selector, "policy": "manual", "rule": "act"})
    res = ex.act(args.actuator, target, params, args.mode, policy="manual", rule="act")
    if res.notice is not None:         # the alert is queued: delivered (or given up) before it is reported
        res = _delivered(registry.get("alert"), res)
    registry.close()
    _audit_manual(args, clock, target, params, res)
    view = {"outcome": res.outcome, "journal_id": res.journal_id, "error": res.error,
            "before": res.change.before if res.change else None,
            "after": res.change.after if res.change else None,
            "summary": res.change.summary if res.change else None}
    print(json.dumps(view, indent=2, sort_keys=True, default=str))
    if journal:
        journal.close()
    if res.outcome is Outcome.FAILED:
        raise CliError(f"{args.actuator}: {res.error}")
    return 0


def _audit_manual(args, clock, target, params, res) -> None:
    """Manual actions go to the same audit log as the controller's, so reports show them."""
    from .audit import AuditLog
    audit = AuditLog(args.audit or Path(args.state_dir) / "audit.jsonl", clock)
    change = res.change
    audit.write("action", policy="manual", rule="act", target=target.key(), target_labels=target.labels,
                mode=args.mode, step=0, actuator=args.actuator, params=params, outcome=res.outcome,
                change={"before": change.before, "after": change.after, "summary": change.summary} if change else None,
                journal_id=res.journal_id, error=res.error)
    audit.close()


def cmd_rollback(args) -> int:
    from reflexarc.actuators.registry import build_registry
    from .clock import WallClock
    from .executor import Executor
    if args.forget:
        return _forget(args)
    if not args.all and not args.id:
        raise CliError("name a journal id or --all")
    journal = _journal(args, WallClock())
    ex = Executor(build_registry(_actuator_config(args)), journal, WallClock())
    entries = journal.open_entries()
    if args.id:
        entries = [e for e in entries if e.id == args.id]
        if not entries:
            journal.close()
            raise CliError(f"no open journal entry '{args.id}' (see 'reflexarc journal')")
    failed = unrecorded = 0
    for e in entries:
        res = ex.revert_entry(e)
        summary = e.change.get("summary") or ""
        print(f"{e.id} {e.change['actuator']:14s} {res.outcome}" + (f": {res.error}" if res.error else "")
              + (f"; {res.unrecorded}" if res.unrecorded else "") + (f"  ({summary})" if summary else ""))
        failed += res.outcome is Outcome.FAILED
        unrecorded += res.unrecorded is not None
    journal.close()
    if not entries:
        print("nothing to roll back")
    problems = [f"{failed} change(s) could not be reverted; they stay in the journal"] if failed else []
    if unrecorded:
        problems.append(f"{journal.path}: {unrecorded} revert(s) could not be recorded; the journal still "
                        "lists them open, the next start or rollback reverts them again")
    for problem in problems[:-1]:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        raise CliError(problems[-1])
    return 0


def _forget(args) -> int:
    """``rollback --forget ID --reason TEXT``: close an open entry without reverting
    it (one this version cannot revert), journaled and audited."""
    from .audit import AuditLog
    from .clock import WallClock
    if args.all or args.id:
        raise CliError("--forget names the one entry to close: rollback --forget ID --reason TEXT")
    reason = (args.reason or "").strip()
    if not reason:
        raise CliError("--forget needs --reason TEXT: why the change may stay as it is (it is audited)")
    from .journal import JournalWriteError
    clock = WallClock()
    journal = _journal(args, clock)
    try:
        entry = next((e for e in journal.open_entries() if e.id == args.forget), None)
        if entry is None:
            raise CliError(f"no open journal entry '{args.forget}' (see 'reflexarc journal')")
        try:
            journal.mark(entry.id, Outcome.FORGOTTEN, note=f"forgotten by an operator: {reason}")
        except JournalWriteError as exc:
            raise CliError(str(exc)) from None
    finally:
        journal.close()
    audit = AuditLog(Path(args.state_dir) / "audit.jsonl", clock)
    audit.write("forget", journal_id=entry.id, actuator=entry.change.get("actuator"), policy=entry.policy,
                rule=entry.rule, summary=entry.change.get("summary", ""), reason=reason, user=os.getuid())
    audit.close()
    print(f"{entry.id} {entry.change.get('actuator', '?'):14s} forgotten: the change was not reverted; "
          f"whatever it changed stays as it is")
    return 0


def cmd_journal(args) -> int:
    journal = _journal(args)
    for e in journal.entries():
        print(f"{e.id} {e.state:9s} {e.change['actuator']:14s} {e.policy}/{e.rule}  {e.change.get('summary', '')}")
    journal.close()
    return 0


# --- parser ----------------------------------------------------------------------
def actuators_help(only: str | None = None) -> str:
    """Every actuator a policy or ``act`` may name (or just ``only``), with its
    parameters: type, required or default, choices and what it is for."""
    from reflexarc.actuators.specs import SPECS
    lines = ["actuators:"]
    for spec in SPECS.values():
        if only is not None and spec.name != only:
            continue
        kind = "" if spec.changes_system else " (notifies only)"
        lines.append(f"  {spec.name}{kind}: {spec.help}")
        for p in spec.params:
            need = "required" if p.required else (f"default {p.default}" if p.default not in (None, "") else "optional")
            choices = f", one of {'|'.join(map(str, p.choices))}" if p.choices else ""
            text = f" - {p.help}" if p.help else ""
            lines.append(f"      {p.name}={p.type} ({need}{choices}){text}")
    if only is None:
        lines.append("example: reflexarc act affinity cpus=0 --label trainer=4242 --mode dry-run")
    return "\n".join(lines)



def build_parser() -> Parser:
    p = Parser(prog="reflexarc", description="Closed-loop remediation for training nodes.")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--state-dir", type=_path_arg, default=os.environ.get("REFLEXARC_STATE_DIR", DEFAULT_STATE_DIR),
                   help="journal and audit directory (default %(default)s)")
    p.add_argument("--proc-root", type=_path_arg, default="/proc")
    p.add_argument("--sys-root", type=_path_arg, default="/sys",
                   help="sysfs tree describing the machine: NUMA nodes, online CPUs, PCI devices "
                        "(affinity actuator, sched_numa probe; default %(default)s)")
    p.add_argument("--hook-dir", type=_path_arg, default="/run/reflexarc/hooks")
    p.add_argument("--alertmanager-url", default=os.environ.get("REFLEXARC_ALERTMANAGER_URL"))
    p.add_argument("--webhook-url", default=os.environ.get("REFLEXARC_WEBHOOK_URL"))
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    s = sub.add_parser("validate", help="check policy files, and what keeps them from working on this node")
    s.add_argument("paths", nargs="+", type=_path_arg)
    s.add_argument("--strict", action="store_true",
                   help="treat warnings (a signal nothing here produces, an alert with no receiver) as errors")
    s.add_argument("--promql-config", metavar="FILE",
                   help="the PromQL source's configuration: its signals count as produced (docs/promql.md)")
    s.set_defaults(fn=cmd_validate)

    s = sub.add_parser("explain", help="say in plain words what each policy will do, when, and what it needs "
                                       "on this node")
    s.add_argument("paths", nargs="+", type=_path_arg, metavar="POLICY_FILE_OR_DIR")
    s.add_argument("--policy-name", metavar="NAME", help="explain only the policy of this name")
    s.add_argument("--promql-config", metavar="FILE",
                   help="the PromQL source's configuration: its signals count as produced (docs/promql.md)")
    s.set_defaults(fn=cmd_explain)

    s = sub.add_parser("simulate", help="run a scenario in simulated time")
    s.add_argument("scenario", nargs="?")
    s.add_argument("--list", action="store_true")
    s.add_argument("--policy", action="append", default=[], type=_path_arg)
    s.add_argument("--mode", choices=MODES)
    s.add_argument("--out", type=_path_arg)
    s.set_defaults(fn=cmd_simulate)

    s = sub.add_parser("test-policies", help="run policy unit tests")
    s.add_argument("paths", nargs="+", type=_path_arg)
    s.set_defaults(fn=cmd_test_policies)

    s = sub.add_parser("report", help="write a report from an audit log")
    s.add_argument("audit", type=_path_arg)
    s.add_argument("--out", required=True, type=_path_arg)
    s.add_argument("--full", action="store_true",
                   help="full detail: a chart for every target (those that never fired folded away), longer "
                        "tables; by default the HTML reads at a glance and stays under about 1 MB")
    s.set_defaults(fn=cmd_report)

    for name, fn, helptext in (("run", cmd_run, "run the controller on live signals"),
                               ("probes", cmd_probes, "list probes and their status"),
                               ("top", cmd_top, "show live signals")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("--policy", action="append", default=[], type=_path_arg)
        s.add_argument("--job", default="", help="job label attached to probe signals")
        s.add_argument("--interval", type=_interval_arg, default=1.0, metavar="DURATION",
                       help="seconds between collections (default %(default)s)")
        if name == "run":
            s.add_argument("--mode", choices=MODES + ("policy",), default="dry-run",
                           help="overrides every policy's mode (default %(default)s: nothing is changed "
                                "unless asked); 'policy' honours each file's own mode")
            s.add_argument("--duration", type=_duration_arg, metavar="DURATION",
                           help="stop after this long (0: after one tick)")
            s.add_argument("--replay", type=_path_arg, help="also replay signals from a JSONL file")
            s.add_argument("--promql-config", metavar="FILE",
                           help="also evaluate PromQL queries against Prometheus (docs/promql.md)")
            s.add_argument("--no-probes", action="store_true", help="do not load the bcc probes")
            s.add_argument("--audit", type=_path_arg, help="audit log path (default STATE_DIR/audit.jsonl)")
            s.add_argument("--audit-sample", type=_duration_arg, default=1200.0, metavar="DURATION",
                           help="write a steady rule-target's evaluation at most this often; changes, "
                                "and every tick on the way to acting, are always written (default %(default)s)")
            s.add_argument("--audit-max-mb", type=_size_mb_arg, default=64.0, metavar="MB",
                           help="rotate the audit log past this size, keeping 4 older files (default %(default)s)")
            s.add_argument("--target-grace", type=_duration_arg, default=60.0, metavar="DURATION",
                           help="retire a rule's target this long after its series stopped, beyond the "
                                "rule's longest window, once it holds nothing (default %(default)s)")
            served = s.add_mutually_exclusive_group()
            served.add_argument("--metrics-addr", type=_address_arg, metavar="[HOST:]PORT",
                                help="serve Prometheus metrics (rule states, actions, live signals, probes, "
                                     "journal, loop lag) there; PORT alone is 127.0.0.1:PORT, IPv6 is [ADDR]:PORT")
            served.add_argument("--metrics-port", type=_port_arg,
                                help="deprecated: the same as --metrics-addr 127.0.0.1:PORT")
            s.add_argument("--kill-switch", type=_path_arg, default="/run/reflexarc/disable")
            s.add_argument("--max-active", type=_count_arg, default=4,
                           help="at most this many active remediations on the node (default %(default)s)")
            s.add_argument("--actions-per-hour", type=_count_arg, default=20,
                           help="at most this many changes an hour on the node (default %(default)s)")
        if name == "probes":
            s.add_argument("--dump-bpf", action="store_true", help="print the final C of each probe")
        if name == "top":
            s.add_argument("--count", type=_count_arg, help="refresh this many times, then exit")
            s.add_argument("--once", action="store_true", help="print one table and exit (the same as --count 1)")
            s.add_argument("--no-probes", action="store_true",
                           help="do not load the bcc probes: only the step signals training scripts report "
                                "through the hook directory")
        s.set_defaults(fn=fn)

    s = sub.add_parser("jobs", help="list the training jobs on this node: ranks, processes, pod or cgroup, and "
                                    "the evidence each was found by",
                       description="Jobs are found from what launchers set (torchrun, Slurm, Open MPI, PMIx, "
                                   "DeepSpeed, Accelerate) and from kubelet's and Slurm's cgroups; nothing else "
                                   "of a process's environment is read out.")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.add_argument("--job", default="", help="the job of training processes discovery finds no job for")
    s.set_defaults(fn=cmd_jobs)

    s = sub.add_parser("act", help="apply one actuator by hand", epilog=actuators_help(),
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Plan (default), alert about or apply one actuator step, journaled and "
                                   "audited like the controller's. Parameters are key=value. An actuator that "
                                   "acts on processes (affinity, framework_hook) needs its target named by "
                                   "--pid, --cgroup, --job or a pid/trainer label, never by a process name "
                                   "alone; init, kernel threads and the controller are always refused.")
    s.add_argument("actuator", help="one of the actuators listed below")
    s.add_argument("params", nargs="*", metavar="key=value", help="the actuator's parameters (below)")
    s.add_argument("--mode", choices=("dry-run", "alert-only", "enforce"), default="dry-run",
                   help="dry-run plans and shows the diff (default); enforce journals and applies")
    s.add_argument("--job", default="", help="the job the target belongs to")
    s.add_argument("--process", action="append", default=[],
                   help="process names it may touch inside the --pid/--cgroup scope (repeatable)")
    s.add_argument("--pid", action="append", type=int, default=[],
                   help="processes it may touch, with their descendants (repeatable)")
    s.add_argument("--cgroup", help="the job's cgroup path")
    s.add_argument("--interface", action="append", default=[], help="network interface (repeatable)")
    s.add_argument("--port", action="append", default=[], help="port or lo-hi range (repeatable)")
    s.add_argument("--label", action="append", default=[], metavar="key=value",
                   help="a target label, e.g. trainer=4242 (a training process) or pid=812 (repeatable)")
    s.add_argument("--audit", help="audit log to append to (default STATE_DIR/audit.jsonl)")
    s.set_defaults(fn=cmd_act)

    s = sub.add_parser("rollback", help="revert journaled changes")
    s.add_argument("id", nargs="?")
    s.add_argument("--all", action="store_true")
    s.add_argument("--forget", metavar="ID", help="close entry ID without reverting it (one this version "
                                                 "cannot revert, e.g. of an actuator it does not know); "
                                                 "needs --reason, and is audited")
    s.add_argument("--reason", metavar="TEXT", help="why the entry is forgotten (with --forget)")
    s.set_defaults(fn=cmd_rollback)

    s = sub.add_parser("journal", help="list journaled changes")
    s.set_defaults(fn=cmd_journal)
    return p


def _actuator_help_asked(argv: list[str]) -> str | None:
    """``act ACTUATOR --help``: the actuator whose parameters alone to print."""
    from reflexarc.actuators.specs import SPECS
    if "act" not in argv or not {"-h", "--help"} & set(argv):
        return None
    rest = argv[argv.index("act") + 1:]
    return rest[0] if rest and rest[0] in SPECS else None


EARLY_HUPS: list[bool] = []      # SIGHUPs taken before ``run`` could reload: it reloads once running


def _set_hup(handler):
    """Install a SIGHUP handler (the main thread only); the previous one, or None."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGHUP, handler if handler is not None else signal.SIG_DFL)


def _raise_fd_limit() -> None:
    """The soft limit on open files up to the hard one (systemd starts services
    with 1024 soft): descriptors held by clients or by a burst of work must not
    run out under the controller while it holds changes."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            pass                              # e.g. above fs.nr_open: the soft limit stays


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _set_hup(lambda *_: EARLY_HUPS.append(True))   # a reload asked while starting is not a hangup
    only = _actuator_help_asked(argv)
    if only is not None:
        print(f"usage: reflexarc act {only} PARAM=VALUE ... [--pid PID | --cgroup PATH | --job NAME] [--mode MODE]")
        print(actuators_help(only))
        return 0
    args = build_parser().parse_args(argv)
    _raise_fd_limit()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return args.fn(args)
    except (CliError, InputFileError, ActuatorError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # never a traceback for the user
        if os.environ.get("REFLEXARC_DEBUG") == "1":
            raise
        print(f"error: internal error: {type(exc).__name__}: {exc} (REFLEXARC_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 70


if __name__ == "__main__":
    sys.exit(main())
