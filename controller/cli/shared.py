"""What the ``reflexarc`` verbs share: ``CliError`` (a user's error, one
``error:`` line), the policies they load and what keeps those from working on
this node, what the probes watch (``_selection``: ``run``, ``probes``,
``top``), the actuators' configuration, the journal, the running controller's
control socket (``_ask``: ``None`` when no controller runs, and the verb then
works on the files), and the SIGHUPs taken before ``run`` could reload.

Example::

    policies = _load_policies(args.policy)          # the shipped ones without --policy
    reply = _ask(args, {"verb": "status"})           # None: no controller on --state-dir
    journal = _journal(args)                         # refused on an unsafe state directory

Overhead: none until called; each helper imports what it needs.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path


class CliError(Exception):
    """An error the user can fix; printed as one ``error:`` line."""


EARLY_HUPS: list[bool] = []      # SIGHUPs taken before ``run`` could reload: it reloads once running


def _set_hup(handler):
    """Install a SIGHUP handler (the main thread only); the previous one, or None."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGHUP, handler if handler is not None else signal.SIG_DFL)


def _paths_or_builtin(paths):
    if paths:
        return paths
    from ..runtime.simulate import BUILTIN_POLICIES
    return [str(BUILTIN_POLICIES)]


def _policy_error(exc) -> CliError:
    """The diagnostics of a ``PolicyError`` on stderr, and the one-line error that closes them."""
    for d in exc.diagnostics:
        print(d, file=sys.stderr)
    return CliError(f"{len([d for d in exc.diagnostics if d.is_error])} error(s) in policy files")


def _load_policies(paths, withhold: bool = False):
    """The policies of ``paths``; with ``withhold`` (a controller, which reads as
    root), the findings of untrusted files do not quote them (``trust.withheld``)."""
    from ..policy.diagnostics import PolicyError
    from ..policy.loader import load_policies
    from ..policy.trust import withheld
    try:
        policies = load_policies(_paths_or_builtin(paths))
    except PolicyError as exc:
        if withhold:
            exc.diagnostics = withheld(exc.diagnostics)
        raise _policy_error(exc) from None
    if not policies:
        raise CliError(f"no policies in {', '.join(_paths_or_builtin(paths))}")
    return policies


def _output_dir(path: str) -> Path:
    if Path(path).exists() and not Path(path).is_dir():
        raise CliError(f"--out {path} is not a directory")
    return Path(path)


def _actuator_config(args):
    from reflexarc.actuators.registry import ActuatorConfig
    return ActuatorConfig(proc_root=args.proc_root, sys_root=args.sys_root, state_dir=args.state_dir,
                          hook_dir=args.hook_dir, alertmanager_url=args.alertmanager_url,
                          webhook_url=args.webhook_url)


def _promql(args):
    """The PromQL source's configuration (``--promql-config``), and what checking
    it and its queries against Prometheus found (``promql.load_checked``)."""
    from ..sources.promql import load_checked
    return load_checked(getattr(args, "promql_config", None))


def _node_findings(args, policies, override: str | None = None, promql=None, jobs: bool = True):
    """What keeps the policies from working on this node (``readiness.py``);
    ``promql``: the PromQL source's configuration, if one is given; ``jobs``:
    also say which jobs the policies name run nowhere here (not for ``run``,
    where jobs start and stop while it runs). ``validate`` and ``explain`` by
    a user who is not root judge from the signal catalogue unless ``--node``
    asks for this node (``readiness.CatalogueFacts``: ``cmd_*`` print its note)."""
    from reflexarc.core.devices import Devices

    from ..policy.readiness import CatalogueFacts, findings
    from ..signals.producers import NodeFacts
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
    from ..policy.readiness import CatalogueFacts
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


def _selection(policies, job: str):
    """What the probes watch: the union of the policies' selectors. A cgroup
    (v2) is selected by its id, the inode number of its directory: as tasks to
    watch, or, in a policy that names interfaces, as the owner of the job's
    traffic on them. Interfaces are watched in one network namespace."""
    from reflexarc.bpf.probe import Selection
    from reflexarc.core.cgroups import cgroup2_id
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
            ino = cgroup2_id(p.selector.cgroup)
            if ino is None:
                raise CliError(f"policy {p.name}: cgroup {p.selector.cgroup}: no such cgroup v2 directory on this node")
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


def _journal(args, clock=None):
    from ..engine.journal import Journal, JournalLocked
    from ..policy.trust import untrusted
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


def _ask(args, payload: dict) -> dict | None:
    """The running controller's reply to ``payload``, or None when no controller
    runs on this state dir (the verb then works on the files)."""
    from ..runtime.control import ControlError, NoController, request
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


def _fleet_store(args):
    """The etcd client of ``--fleet-etcd``, with ``--fleet-ca/--fleet-cert/--fleet-key``
    when given: each file must be a readable regular file, the certificate and
    key come together, and TLS needs every endpoint as https://."""
    from reflexarc.core.input_files import InputFileError, check_regular

    from ..fleet.store import ClientTls, EtcdStore
    files = {"--fleet-ca": args.fleet_ca, "--fleet-cert": args.fleet_cert, "--fleet-key": args.fleet_key}
    given = {flag: path for flag, path in files.items() if path is not None}
    if given and not args.fleet_etcd:
        raise CliError(f"{next(iter(given))} needs --fleet-etcd (the etcd cluster it is for)")
    if (args.fleet_cert is None) != (args.fleet_key is None):
        raise CliError("--fleet-cert and --fleet-key go together: the client certificate and its key")
    for flag, path in given.items():
        try:
            check_regular(path)
            with open(path, "rb"):
                pass
        except InputFileError as exc:
            raise CliError(f"{flag} {exc}") from None
        except OSError as exc:
            raise CliError(f"{flag} {path}: {exc.strerror or exc}") from None
    tls = ClientTls(args.fleet_ca, args.fleet_cert, args.fleet_key) if given else None
    try:
        return EtcdStore(args.fleet_etcd, tls=tls)
    except ValueError as exc:
        raise CliError(f"--fleet-etcd: {exc}") from None
