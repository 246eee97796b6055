"""The ``reflexarc`` command line.

    reflexarc validate FILE|DIR... [--node]  check policies (file:line:col: error: ...)
    reflexarc simulate --list | SCENARIO     run a scenario in simulated time, write audit + report
    reflexarc test-policies FILE|DIR...      policy unit tests (scenario + expected actions)
    reflexarc report AUDIT --out DIR         HTML/JSON/Markdown report of an audit log
    reflexarc run [--policy P] [--mode M]    the controller on live probes (default dry-run;
                                             --mode policy honours each file's mode; SIGHUP
                                             or a changed policy file reloads: reload.py)
    reflexarc probes [--dump-bpf]            each probe's tier, status and attach points
    reflexarc top                            live signals per target
    reflexarc act ACTUATOR key=value...      one actuator by hand, through plan/diff/journal
                                             (a summary; --json the whole result)
    reflexarc rollback ID|--all              revert journaled changes
    reflexarc journal                        list journaled changes

The global options (``--state-dir``, ``-v``, ...) go before the command or
after it (``VerbParser``), ``--version`` says which reflexarc this is, and
every command and option has its ``--help``. ``validate``, ``explain`` and
``test-policies`` need no privilege (without root they skip this node's
checks, with a note, unless ``--node``); ``run``, ``probes`` and ``top`` say
in one line that loading probes needs root (``_missing_privilege``).

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
from .narrate import LOG_FORMATS, Narrator, configure_logging
from .policy.model import MODES

DEFAULT_STATE_DIR = "/var/lib/reflexarc"


class CliError(Exception):
    """An error the user can fix; printed as one ``error:`` line."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        print(f"error: {message} (see '{self.prog} --help')", file=sys.stderr)
        sys.exit(2)


class VerbParser(Parser):
    """A command's parser: it takes the global options too (``_global_options``)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        _global_options(self, after_verb=True)


def _global_options(parser: argparse.ArgumentParser, after_verb: bool = False) -> None:
    """The options of the command line as a whole. Every command takes them
    too (``after_verb``): there they have no default of their own, so a value
    given after the command overrides one given before it."""
    state_dir = os.environ.get("REFLEXARC_STATE_DIR", DEFAULT_STATE_DIR)
    group = parser.add_argument_group("global options (before or after the command)") if after_verb else parser

    def add(*names, default=None, **kwargs):
        group.add_argument(*names, default=argparse.SUPPRESS if after_verb else default, **kwargs)

    add("-v", "--verbose", action="count", default=0,
        help="log what each step does (level INFO); -vv: everything at DEBUG, the libraries' records included")
    add("--log-format", choices=LOG_FORMATS, default="text",
        help="stderr as text lines (default) or one JSON object a line, for log shippers: the events told "
             "(transitions, actions, node events) and the log records alike")
    add("--state-dir", type=_path_arg, default=state_dir,
        help=f"journal and audit directory (default {state_dir}, or $REFLEXARC_STATE_DIR)")
    add("--proc-root", type=_path_arg, default="/proc",
        help="procfs tree to read processes from (default /proc; a fixture tree in tests)")
    add("--sys-root", type=_path_arg, default="/sys",
        help="sysfs tree describing the machine: NUMA nodes, online CPUs, PCI devices, interfaces "
             "(affinity actuator, sched_numa probe, readiness; default /sys)")
    add("--hook-dir", type=_path_arg, default="/run/reflexarc/hooks",
        help="where training scripts serve their hook sockets (docs/hooks.md; default /run/reflexarc/hooks)")
    add("--alertmanager-url", default=os.environ.get("REFLEXARC_ALERTMANAGER_URL"), metavar="URL",
        help="Alertmanager to send alerts to (default $REFLEXARC_ALERTMANAGER_URL)")
    add("--webhook-url", default=os.environ.get("REFLEXARC_WEBHOOK_URL"), metavar="URL",
        help="webhook to POST alerts to (default $REFLEXARC_WEBHOOK_URL)")


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
    where jobs start and stop while it runs). ``validate`` and ``explain`` by
    a user who is not root judge from the signal catalogue unless ``--node``
    asks for this node (``readiness.CatalogueFacts``: ``cmd_*`` print its note)."""
    from reflexarc.core.devices import Devices
    from .producers import NodeFacts
    from .readiness import CatalogueFacts, findings
    produced = promql.signals if promql else False
    if getattr(args, "node", True) or os.geteuid() == 0:
        facts = NodeFacts(Devices(sys_root=args.sys_root), promql=produced,
                          jobs=_running_jobs(args.proc_root) if jobs else None)
    else:
        facts = CatalogueFacts("not root", promql=produced)
    receiver = bool(args.alertmanager_url or args.webhook_url)
    return facts, findings(policies, facts, receiver, override, strict=getattr(args, "strict", False))


def _note_unseen(facts) -> None:
    """The one line saying which of this node's checks were skipped, and why."""
    from .readiness import CatalogueFacts
    if isinstance(facts, CatalogueFacts):
        print(facts.note(), file=sys.stderr)


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
        raise CliError(f"{exc}; a running controller is asked over {state / 'control.sock'} (reflexarc "
                       f"status, journal, rollback, act, pause): it is not answering there") from None
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
        facts, found = _node_findings(args, policies, promql=promql.config)
        _note_unseen(facts)
        diags = sorted(diags + found)
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
    _note_unseen(facts)
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
        result = run_scenario(args.scenario, policies, args.mode, out, report=True,
                              evals="all" if args.all_evals else "sampled")
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


def _control(args, ctl, journal, manager):
    """The control socket of this run (``control.py``), answered by ``steer.py``."""
    from .control import ControlError, ControlServer, group_id, socket_path
    from .steer import Steering
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
    bus = SignalBus()                      # the probe source drops exited processes' series from it
    if not args.no_probes:
        from reflexarc.bpf.manager import ProbeManager
        manager = ProbeManager(_selection(policies, args.job), interval=args.interval, sys_root=args.sys_root,
                               clock=clock.now)
        for name, status in manager.start().items():
            logging.getLogger("reflexarc.probes").info("%s: %s", name, status)
        config.deep_tier = manager
        registry.discard("deep_tracing")     # built without the deep tier if the reconcile used it
        sources.append(ProbeSource(manager, hook_dir=str(hook_dir) if hook_dir.is_dir() else None, bus=bus))
    ctl = Controller(policies, bus, registry, clock, mode_override=override, metrics=metrics,
                     journal=journal, audit=AuditLog(audit_path, clock, evals="sampled", sample_every=args.audit_sample,
                                                    max_bytes=int(args.audit_max_mb * (1 << 20)),
                                                    listeners=[Narrator(args.log_format)]),   # each event on stderr
                     limits=LimitSettings(args.kill_switch, args.max_active, args.actions_per_hour),
                     target_grace=args.target_grace)
    reloader = Reloader(ctl, files, facts, receiver=bool(args.alertmanager_url or args.webhook_url),
                        selection=None if manager is None else lambda ps: _selection(ps, args.job))
    hup = _set_hup(lambda *_: reloader.request())   # reload at the next tick
    if EARLY_HUPS:                                   # one came while starting
        reloader.request()
    control = _control(args, ctl, journal, manager)
    ctl.start(source="live", reconciled=reconciled)
    if server is not None:
        from .exporter import export_live_state
        export_live_state(metrics.registry, ctl.bus, manager, journal, ctl.audit,
                          alerts=lambda: registry.built("alert"))
    try:
        summary = run_live(ctl, sources, clock, args.interval, args.duration, server, reloader=reloader,
                           control=control)
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
    from .top import run_top, run_top_remote
    if not args.local and _ask(args, {"verb": "top"}) is not None:    # a controller runs: its view
        return run_top_remote(lambda: _ask(args, {"verb": "top"}) or _gone(args), args.interval,
                              1 if args.once else args.count, proc_root=args.proc_root)
    hook_dir = args.hook_dir if Path(args.hook_dir).is_dir() else None
    if args.no_probes and hook_dir is None:
        raise CliError(f"--no-probes: nothing to show without the hook directory {args.hook_dir}")
    selection = None if args.no_probes else _selection(_load_policies(args.policy), args.job)
    return run_top(selection, args.interval, 1 if args.once else args.count, hook_dir=hook_dir, job=args.job,
                   sys_root=args.sys_root, proc_root=args.proc_root, probes=not args.no_probes)


def _gone(args):
    raise CliError(f"the controller on {args.state_dir} stopped")


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
    if args.mode == "enforce":              # a running controller holds the journal: it acts, and audits
        reply = _ask(args, {"verb": "act", "actuator": args.actuator, "params": texts, "labels": labels,
                            "selector": {**selector, "ports": args.port}, "mode": args.mode})
        if reply is not None:
            registry.close()
            return _acted(args, {k: reply.get(k) for k in ("outcome", "journal_id", "error", "before", "after",
                                                             "summary")})
    clock = WallClock()
    journal = _journal(args, clock) if args.mode == "enforce" else None
    ex = Executor(registry, journal, clock)
    target = Target(labels, {**selector, "policy": "manual", "rule": "act"})
    res = ex.act(args.actuator, target, params, args.mode, policy="manual", rule="act")
    if res.notice is not None:         # the alert is queued: delivered (or given up) before it is reported
        res = _delivered(registry.get("alert"), res)
    registry.close()
    _audit_manual(args, clock, target, params, res)
    if journal:
        journal.close()
    return _acted(args, {"outcome": res.outcome, "journal_id": res.journal_id, "error": res.error,
                         "before": res.change.before if res.change else None,
                         "after": res.change.after if res.change else None,
                         "summary": res.change.summary if res.change else None})


def _acted(args, view: dict) -> int:
    """Print what ``act`` did (a summary, or ``--json``); an error for a failed step."""
    if args.json:
        print(json.dumps(view, indent=2, sort_keys=True, default=str))
    elif view["outcome"] != Outcome.FAILED:
        print(_act_summary(view))
    if view["outcome"] == Outcome.FAILED:
        raise CliError(f"{args.actuator}: {view['error']}")
    return 0


ACT_AFTERWORDS = {Outcome.PLANNED: "nothing was changed (dry-run); --mode enforce applies it",
                  Outcome.ALERTED: "nothing was changed (alert-only): an alert describes the change",
                  Outcome.NOOP: "nothing to change: the system already is as asked"}


def _act_summary(view: dict) -> str:
    """What ``act`` did, for a person: the outcome and the change, then what
    follows from it (``--json`` prints the whole result instead)."""
    outcome = Outcome(view["outcome"])
    lines = [f"{outcome}: {view['summary'] or 'no change'}"]
    if outcome in ACT_AFTERWORDS:
        lines.append(f"  {ACT_AFTERWORDS[outcome]}")
    if view["journal_id"]:
        lines.append(f"  journal id {view['journal_id']}: 'reflexarc rollback {view['journal_id']}' reverts it")
    return "\n".join(lines)


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
    if args.all and args.id:
        raise CliError("name a journal id or --all, not both")
    reply = _ask(args, {"verb": "rollback", **({"all": True} if args.all else {"id": args.id})})
    if reply is not None:                  # through the running controller: its rules follow
        return _rolled_back(reply["results"])
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


def _rolled_back(results: list[dict]) -> int:
    for r in results:
        print(f"{r['id']} {r['actuator'] or '?':14s} {r['outcome']}" + (f": {r['error']}" if r["error"] else "")
              + (f"  ({r['summary']})" if r["summary"] else ""))
    if not results:
        print("nothing to roll back")
    failed = sum(r["outcome"] == Outcome.FAILED for r in results)
    if failed:
        raise CliError(f"{failed} change(s) could not be reverted; they stay in the journal")
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
    reply = _ask(args, {"verb": "forget", "id": args.forget, "reason": reason})
    if reply is not None:
        print(f"{reply['id']} {reply['actuator'] or '?':14s} forgotten: the change was not reverted; "
              f"whatever it changed stays as it is")
        return 0
    from .journal import JournalWriteError
    clock = WallClock()
    journal = _journal(args, clock)
    try:
        try:
            entry = journal.forget(args.forget, reason)
        except (LookupError, JournalWriteError) as exc:
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


def _ask(args, payload: dict) -> dict | None:
    """The running controller's reply to ``payload``, or None when no controller
    runs on this state dir (the verb then works on the files)."""
    from .control import ControlError, NoController, request
    try:
        return request(args.state_dir, payload)
    except NoController:
        return None
    except ControlError as exc:
        raise CliError(str(exc)) from None


def _when(ts) -> str:
    import datetime
    if not isinstance(ts, (int, float)):
        return "-" * 19
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _journal_line(jid, state, actuator, policy, rule, summary, history) -> str:
    first = history[0].get("ts") if history else None
    last = history[-1].get("ts") if history else None
    return (f"{jid} {state:9s} {actuator or '?':14s} {_when(first)} {_when(last)[11:] if last != first else '':8s}  "
            f"{policy}/{rule}  {summary}")


def _check(args) -> int:
    """``journal --check``: read back every open change; exit 1 naming those
    the system no longer shows."""
    from reflexarc.actuators.registry import build_registry
    from .clock import WallClock
    from .executor import Executor
    reply = _ask(args, {"verb": "check"})
    if reply is not None:
        opened, drifted = reply["open"], reply["drifted"]
        names = {e["id"]: e["actuator"] for e in (_ask(args, {"verb": "journal"}) or {"entries": []})["entries"]}
    else:
        journal = _journal(args, WallClock())
        entries = journal.open_entries()
        opened, names = len(entries), {e.id: e.change.get("actuator") for e in entries}
        drifted, unreadable = Executor(build_registry(_actuator_config(args)), journal, WallClock()).drifts()
        journal.close()
        for jid, why in sorted(unreadable.items()):
            print(f"{jid} {names.get(jid) or '?':14s} cannot be read back: {why}")
    for jid, differs in sorted(drifted.items()):
        print(f"{jid} {names.get(jid) or '?':14s} drifted: {differs}")
    print(f"{opened} open change(s), {len(drifted)} drifted")
    if drifted:
        raise CliError(f"{len(drifted)} open change(s) no longer hold as journaled: someone changed them behind "
                       "the controller's back (reflexarc rollback ID restores what was there before)")
    return 0


def cmd_journal(args) -> int:
    if args.check:
        return _check(args)
    reply = _ask(args, {"verb": "journal"})
    if reply is not None:
        rows = [(e["id"], e["state"], e["actuator"], e["policy"], e["rule"], e["summary"], e["history"])
                for e in reply["entries"]]
    else:
        journal = _journal(args)
        rows = [(e.id, e.state, e.change.get("actuator"), e.policy, e.rule, e.change.get("summary", ""), e.history)
                for e in journal.entries()]
        journal.close()
    if rows:
        print(f"{'id':12s} {'state':9s} {'actuator':14s} {'journaled':19s} {'last step':9s} policy/rule  change")
    for row in rows:
        print(_journal_line(*row))
    return 0


def cmd_status(args) -> int:
    reply = _ask(args, {"verb": "status"})
    if reply is None:
        print(f"controller: not running on {args.state_dir}")
        journal = _journal(args)
        entries = journal.open_entries()
        journal.close()
        print(f"journal: {len(entries)} open change(s)" + (" (reflexarc journal lists them; the next start or "
                                                           "reflexarc rollback reverts them)" if entries else ""))
        return 0
    if args.json:
        print(json.dumps({k: v for k, v in reply.items() if k != "ok"}, indent=2, sort_keys=True))
        return 0
    print(_status_text(reply))
    return 0


def _status_text(st: dict) -> str:
    from .top import changes_and_rules
    held, pause, lim = st["enforcement"]["held"], st["enforcement"]["paused"], st["limits"]
    lines = [f"controller: running; mode {st['mode']}; {len(st['policies'])} policies, {st['targets']} targets"]
    if held == "kill_switch":
        lines.append(f"enforcement: HELD by the kill switch {st['enforcement']['kill_switch']} "
                     "(no change is made; remove the file to resume)")
    elif pause is not None:
        until = f" until {_when(pause['until'])}" if pause["until"] else " until 'reflexarc resume'"
        lines.append(f"enforcement: PAUSED{until}, by uid {pause['by'].get('uid', '?')}: {pause['reason']}")
    else:
        lines.append("enforcement: on")
    lines.append(f"limits: {lim['active']} of {lim['max_active']} active changes; {lim['actions_last_hour']} of "
                 f"{lim['actions_per_hour']} actions in the last hour")
    lines += changes_and_rules(st)
    if st["probes"]:
        lines.append("probes: " + ", ".join(f"{name} {state}" for name, state in sorted(st["probes"].items())))
    return "\n".join(lines)


def cmd_pause(args) -> int:
    reason = (args.reason or "").strip()
    if not reason:
        raise CliError("pause needs --reason TEXT: why enforcement is held (it is audited)")
    reply = _ask(args, {"verb": "pause", "reason": reason, **({"for": args.for_} if args.for_ else {})})
    if reply is None:
        raise CliError(f"no controller is running on {args.state_dir}; to keep one from acting when it starts, "
                       f"touch the kill switch (default /run/reflexarc/disable)")
    until = f" until {_when(reply['until'])}" if reply.get("until") else " until 'reflexarc resume'"
    print(f"enforcement paused{until}: no change is made; changes already applied stay as they are "
          "('reflexarc rollback' reverts them)")
    return 0


def cmd_resume(args) -> int:
    reply = _ask(args, {"verb": "resume", "reason": (args.reason or "").strip() or "resumed by an operator"})
    if reply is None:
        raise CliError(f"no controller is running on {args.state_dir}")
    if reply["held"] == "kill_switch":
        print("pause ended, but the kill switch still holds enforcement: remove its file to resume")
    else:
        print("enforcement resumed" if reply["was_paused"] else "enforcement was not paused")
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



NODE_HELP = ("also check this node as this user sees it (what root gets anyway): whether each signal's "
             "producers can run here, required devices, interfaces, running jobs")


def build_parser() -> Parser:
    from importlib.metadata import version
    p = Parser(prog="reflexarc", description="Closed-loop remediation for training nodes.")
    p.add_argument("--version", action="version", version=f"reflexarc {version('reflexarc')}")
    _global_options(p)
    sub = p.add_subparsers(dest="command", required=True, parser_class=VerbParser, metavar="COMMAND",
                           help="one of these ('reflexarc COMMAND --help' describes it)")

    s = sub.add_parser("validate", help="check policy files, and what keeps them from working on this node",
                       description="Checks policy files (file:line:col: error: ...), then what keeps them from "
                                   "working on this node. A user who is not root gets the checks that need no "
                                   "node: the signal catalogue, the alert receivers; --node adds this node's.")
    s.add_argument("paths", nargs="+", type=_path_arg, metavar="POLICY_FILE_OR_DIR",
                   help="policy files, or directories of them (*.yaml, *.yml)")
    s.add_argument("--strict", action="store_true",
                   help="treat warnings (a signal nothing here produces, an alert with no receiver) as errors")
    s.add_argument("--promql-config", metavar="FILE",
                   help="the PromQL source's configuration: its signals count as produced (docs/promql.md)")
    s.add_argument("--node", action="store_true", help=NODE_HELP)
    s.set_defaults(fn=cmd_validate)

    s = sub.add_parser("explain", help="say in plain words what each policy will do, when, and what it needs "
                                       "on this node")
    s.add_argument("paths", nargs="+", type=_path_arg, metavar="POLICY_FILE_OR_DIR",
                   help="policy files, or directories of them (*.yaml, *.yml)")
    s.add_argument("--policy-name", metavar="NAME", help="explain only the policy of this name")
    s.add_argument("--promql-config", metavar="FILE",
                   help="the PromQL source's configuration: its signals count as produced (docs/promql.md)")
    s.add_argument("--node", action="store_true", help=NODE_HELP)
    s.set_defaults(fn=cmd_explain)

    s = sub.add_parser("simulate", help="run a scenario in simulated time",
                       description="Runs a scenario (a node, its jobs and a fault, in simulated time) through "
                                   "the controller and writes the audit log and a report.")
    s.add_argument("scenario", nargs="?", help="a scenario's name (--list shows them) or its file")
    s.add_argument("--list", action="store_true", help="list the scenarios and what each shows")
    s.add_argument("--policy", action="append", default=[], type=_path_arg, metavar="POLICY_FILE_OR_DIR",
                   help="run these policies instead of those the scenario names (repeatable)")
    s.add_argument("--mode", choices=MODES, help="overrides every policy's mode")
    s.add_argument("--out", type=_path_arg, metavar="DIR",
                   help="where the audit log and report go (default out/SCENARIO)")
    s.add_argument("--all-evals", action="store_true",
                   help="write every evaluation to the audit (charts show each tick; 100 rules x 10 targets "
                        "write about 1.9 GB per simulated hour); by default evaluations are sampled as run "
                        "samples them: each change and every tick on the way to acting, a quiet rule-target "
                        "once per 20 minutes")
    s.set_defaults(fn=cmd_simulate)

    s = sub.add_parser("test-policies", help="run policy unit tests",
                       description="Runs each case of each test file: the policies it names, through its "
                                   "scenario in simulated time, in the case's mode; PASS when the actions taken "
                                   "are the ones expected (actuator, outcome, target, when), else FAIL with the "
                                   "difference. Exit 1 when one fails. File format: controller/policy_tests.py.")
    s.add_argument("paths", nargs="+", type=_path_arg, metavar="TEST_FILE_OR_DIR",
                   help="policy test files, or directories of them (*.yaml, *.yml; e.g. policies/tests/)")
    s.set_defaults(fn=cmd_test_policies)

    s = sub.add_parser("report", help="write a report from an audit log")
    s.add_argument("audit", type=_path_arg, help="the audit log (STATE_DIR/audit.jsonl, or a simulation's)")
    s.add_argument("--out", required=True, type=_path_arg, metavar="DIR",
                   help="where report.html, report.json and report.md go")
    s.add_argument("--full", action="store_true",
                   help="full detail: a chart for every target (those that never fired folded away), longer "
                        "tables; by default the HTML reads at a glance and stays under about 1 MB")
    s.set_defaults(fn=cmd_report)

    for name, fn, helptext in (("run", cmd_run, "run the controller on live signals"),
                               ("probes", cmd_probes, "list probes and their status"),
                               ("top", cmd_top, "show live signals: the running controller's view (its signals, rules, changes) when one runs, else probes of its own")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("--policy", action="append", default=[], type=_path_arg, metavar="POLICY_FILE_OR_DIR",
                       help="policy files or directories (repeatable; default: the shipped policies)")
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
            s.add_argument("--kill-switch", type=_path_arg, default="/run/reflexarc/disable",
                           help="while this file exists no change is made to the system, refreshes included; "
                                "changes already applied stay until rolled back (default %(default)s)")
            s.add_argument("--control-group", metavar="GROUP",
                           help="besides root, members of this group may steer the controller over "
                                "STATE_DIR/control.sock (status, journal, rollback, act, pause, resume)")
            s.add_argument("--max-active", type=_count_arg, default=4,
                           help="at most this many active remediations on the node (default %(default)s)")
            s.add_argument("--actions-per-hour", type=_count_arg, default=20,
                           help="at most this many changes an hour on the node (default %(default)s)")
        if name == "probes":
            s.add_argument("--dump-bpf", action="store_true", help="print the final C of each probe")
        if name == "top":
            s.add_argument("--count", type=_count_arg, help="refresh this many times, then exit")
            s.add_argument("--once", action="store_true", help="print one table and exit (the same as --count 1)")
            s.add_argument("--local", action="store_true",
                           help="load this command's own probes even when a controller runs (by default "
                                "top shows the running controller's view: its signals, rules and changes)")
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
    s.add_argument("--json", action="store_true",
                   help="print the result as JSON (outcome, before, after, summary, journal_id, error), a "
                        "failed one included")
    s.set_defaults(fn=cmd_act)

    s = sub.add_parser("rollback", help="revert journaled changes",
                       description="Reverts changes the journal (STATE_DIR/journal.jsonl) lists open, one by its "
                                   "id or --all, and records each as reverted; one that cannot be reverted stays "
                                   "open, and the exit status is 1. A controller running on the state directory "
                                   "is asked to do it. 'reflexarc journal' lists the ids.")
    s.add_argument("id", nargs="?", help="the journal id of the change to revert (see 'reflexarc journal')")
    s.add_argument("--all", action="store_true", help="revert every open change")
    s.add_argument("--forget", metavar="ID", help="close entry ID without reverting it (one this version "
                                                 "cannot revert, e.g. of an actuator it does not know); "
                                                 "needs --reason, and is audited")
    s.add_argument("--reason", metavar="TEXT", help="why the entry is forgotten (with --forget)")
    s.set_defaults(fn=cmd_rollback)

    s = sub.add_parser("journal", help="list journaled changes",
                       description="Lists every change the journal (STATE_DIR/journal.jsonl) holds: its id, "
                                   "state (applied, reverted, kept, ...), actuator, policy/rule and what it changed. "
                                   "Applied ones are reverted by 'reflexarc rollback' or the next start.")
    s.add_argument("--check", action="store_true",
                   help="read back every open change and name those the system no longer shows (changed behind "
                        "the controller's back); exit 1 when any has drifted")
    s.set_defaults(fn=cmd_journal)

    s = sub.add_parser("status", help="what the running controller is doing: mode, rules that are not ok and "
                                      "their evidence, changes held, limits used, enforcement, probes",
                       description="Asks the controller running on --state-dir over its control socket "
                                   "(root, or the --control-group of run). With none running, says so and "
                                   "counts the journal's open changes.")
    s.add_argument("--json", action="store_true", help="print the controller's whole reply as JSON")
    s.set_defaults(fn=cmd_status)

    s = sub.add_parser("pause", help="hold the running controller's enforcement: no change is made until "
                                     "resume (or --for ends), refreshes included; audited",
                       description="Applied changes stay as they are: 'reflexarc rollback' reverts them. "
                                   "Rules still evaluate, plan and alert.")
    s.add_argument("--reason", metavar="TEXT", help="why (required; written to the audit with who asked)")
    s.add_argument("--for", dest="for_", type=_duration_arg, metavar="DURATION",
                   help="resume by itself after this long (e.g. 10m); default: until 'reflexarc resume'")
    s.set_defaults(fn=cmd_pause)

    s = sub.add_parser("resume", help="end a pause of the running controller's enforcement; audited")
    s.add_argument("--reason", metavar="TEXT", help="why (written to the audit)")
    s.set_defaults(fn=cmd_resume)
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


def _missing_privilege(args) -> str | None:
    """Why ``run``, ``probes`` or ``top`` cannot load the eBPF probes they would
    load (not with ``--no-probes``), said before anything starts; None when they
    can. ``probes --dump-bpf`` too: the C follows the attach points tracefs offers."""
    if args.command not in ("run", "probes", "top") or getattr(args, "no_probes", False):
        return None
    from reflexarc.bpf.probe import KernelFeatures
    features = KernelFeatures()
    why = features.missing_privilege()
    if why is None:
        return None
    instead = "" if args.command == "probes" else "; --no-probes runs without them"
    return (f"{args.command} needs root, or CAP_BPF and CAP_PERFMON with read access to {features.tracefs}, "
            f"to load its eBPF probes ({why}){instead}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _set_hup(lambda *_: EARLY_HUPS.append(True))   # a reload asked while starting is not a hangup
    only = _actuator_help_asked(argv)
    if only is not None:
        print(f"usage: reflexarc act {only} PARAM=VALUE ... [--pid PID | --cgroup PATH | --job NAME] [--mode MODE]")
        print(actuators_help(only))
        return 0
    args = build_parser().parse_args(argv)
    unprivileged = _missing_privilege(args)
    if unprivileged:
        print(f"error: {unprivileged}", file=sys.stderr)
        return 1
    _raise_fd_limit()
    configure_logging(args.verbose, args.log_format)
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
